"""The ``model`` op: a real model's steps (workers/models/), measured phase by phase.

Set-up builds the model, its optimizer and one batch. The op then runs the spec's steps
(two by default: step 2 is where a training run's optimizer state exists, and is the one
reported), each phase inside a section (its own allocated and reserved peaks). One more
step runs under the category tally, which finds what held memory at its peak; the figures
reported are the plain steps', untouched by the tally. workers/models/report.py turns
what this leaves in the context into the result's ``model`` and ``categories``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vramlab.runspec import ModelParams
from workers import sections
from workers.models import finetune
from workers.models.build import build
from workers.models.steps import run_step, tally_step, tokens_per_step
from workers.models.tally import BLOCK, rounded
from workers.ops.base import Inputs, Op, OpContext, Outputs

SECTION = "model.step{step}.{phase}.{n}"  # a phase's section; n counts micro-batches
MAX_NAMES = 64  # trainable parameters named in a result (blocks' indices already folded)


def _model(ctx: OpContext) -> ModelParams:
    if ctx.model is None:
        raise ValueError("op 'model' runs a spec with model params")
    return ctx.model


def _setup(ctx: OpContext) -> Inputs:
    built = build(_model(ctx), ctx.device)
    ctx.state["built"] = built
    return dict(built.inputs)


def _run(inputs: Inputs, ctx: OpContext) -> Outputs:
    built = ctx.state["built"]
    device = ctx.device
    cuda = device.type == "cuda"
    phases: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for step in range(1, _model(ctx).steps + 1):
        counts: dict[str, int] = {}

        @contextmanager
        def phase(name: str, step: int = step, counts: dict[str, int] = counts) -> Iterator[None]:
            counts[name] = counts.get(name, 0) + 1
            key = SECTION.format(step=step, phase=name, n=counts[name])
            started = time.perf_counter()
            with sections.section(key, device):
                yield
            phases.append(
                {
                    "step": step,
                    "name": name,
                    "section": key,
                    "wall_s": time.perf_counter() - started,
                    "peak_reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
                }
            )

        _sync(device)
        started = time.perf_counter()
        run_step(built, phase)
        _sync(device)
        steps.append({"step": step, "wall_s": time.perf_counter() - started})
    trainable_count, trainable_names = finetune.trainable(built.model)
    ctx.extras["model_run"] = {
        "model": built.resolved.name,
        "model_type": built.resolved.model_type,
        "task": built.task,
        "parameter_count": sum(p.numel() for p in built.parameters()),
        "parameter_bytes": _bytes(built.parameters(), device),
        "gradient_bytes": _bytes(built.gradients(), device),
        "optimizer_state_bytes": _bytes(
            [t for t in built.optimizer_state() if t.device == device], device
        ),
        "trainable_parameter_count": trainable_count,
        "trainable_parameters": trainable_names[:MAX_NAMES],
        "paged_optimizer_state_bytes": sum(
            t.untyped_storage().nbytes() for t in built.paged_state()
        )
        or None,
        "batch_size": built.batch_size,
        "tokens_per_step": tokens_per_step(built),
        "phases": phases,
        "steps": steps,
        "tally": _tally(built, device),
    }
    return ()


def _tally(built: Any, device: torch.device) -> dict[str, Any]:
    """One more step under the category tally: what held memory at its peak."""
    peak = tally_step(built, BLOCK if device.type == "cuda" else 1)
    _sync(device)
    return {"peak": peak.bytes, "phase": peak.phase, "categories": peak.categories}


def _bytes(tensors: list[torch.Tensor], device: torch.device) -> int:
    """The bytes these tensors' storages hold (each storage once), as the allocator
    counts them (rounded to its blocks on CUDA)."""
    block = BLOCK if device.type == "cuda" else 1
    sizes = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(rounded(n, block) for n in sizes.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# The op runs its own steps: the runner calls it once (no warm-up, no repeats, no
# extra run under the copy watcher).
OPS = {"model": Op(_setup, _run, probe=False, runs_once=True)}
