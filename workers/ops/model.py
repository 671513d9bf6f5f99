"""The ``model`` op: a real model's steps (workers/models/), measured phase by phase.

Set-up builds the model, its optimizer and one batch. The op then runs the spec's steps
(two by default: step 2 is where a training run's optimizer state exists, and is the one
reported), each phase inside a section (its own allocated and reserved peaks), and one
more step under the category tally (workers/models/measured.py). A distributed spec runs
N ranks instead, each measuring its own step the same way (workers/models/ranks.py).
workers/models/report.py turns what this leaves in the context into the result's
``model`` and ``categories``.
"""

from __future__ import annotations

from vramlab.runspec import ModelParams
from workers.models import ranks
from workers.models.build import build
from workers.models.measured import measure
from workers.models.report import RAW
from workers.ops.base import Inputs, Op, OpContext, Outputs


def _model(ctx: OpContext) -> ModelParams:
    if ctx.model is None:
        raise ValueError("op 'model' runs a spec with model params")
    return ctx.model


def _setup(ctx: OpContext) -> Inputs:
    if _model(ctx).parallel is not None:  # the ranks build their own (workers/models/ranks.py)
        return {}
    built = build(_model(ctx), ctx.device)
    ctx.state["built"] = built
    return dict(built.inputs)


def _run(inputs: Inputs, ctx: OpContext) -> Outputs:
    params = _model(ctx)
    if params.parallel is not None:  # N ranks, each its own process and device
        ctx.extras[RAW] = ranks.run(params, ctx.device)
    else:
        ctx.extras[RAW] = measure(ctx.state["built"], ctx.device)
    return ()


# The op runs its own steps: the runner calls it once (no warm-up, no repeats, no
# extra run under the copy watcher).
OPS = {"model": Op(_setup, _run, probe=False, runs_once=True)}
