"""One catalog op run in measured phases (setup; the op, warmed up then timed over its
repeats; after), and once more under the copy watcher for the placement report."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vramlab.runspec import RunSpec
from workers import sections
from workers.errors import OpFailure, call, classify
from workers.measure import Meter
from workers.ops import Inputs, Op, OpContext, as_tuple, op_for, torch_dtype
from workers.placement import CopyWatcher
from workers.tracer import Tracer


@dataclass
class Body:
    """What running the op (or the scenario) left: tensors, timing, error, details."""

    inputs: Inputs = field(default_factory=dict)
    outputs: tuple[torch.Tensor, ...] = ()
    timing: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    watched: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    ctx: OpContext | None = None
    held: Any = None  # a scenario's named tensors, alive until the figures are read


def execute_op(spec: RunSpec, device: torch.device, meter: Meter, tracer: Tracer) -> Body:
    op = op_for(spec.op, spec.params)
    ctx = OpContext(spec.shape, torch_dtype(spec.dtype), device, spec.params, model=spec.model)
    body = Body(extras=ctx.extras, ctx=ctx)
    try:
        with meter.phase("setup", tracer.phase("setup")):
            body.inputs = call(op.setup, ctx)
        with meter.phase("op", tracer.phase("op")):
            body.outputs, body.timing = run_op(op, body.inputs, ctx, spec, meter)
        with meter.phase("after", tracer.phase("after")):
            gc.collect()  # what stays now is what the outputs (and inputs) hold
    except OpFailure as failure:
        body.error = classify(failure.cause, spec, ctx.extras)
    return body


def watch_once(spec: RunSpec, body: Body, device: torch.device) -> dict[str, Any] | None:
    """Run the op once more under the copy watcher; None if that run fails."""
    ctx = body.ctx
    if ctx is None:
        return None
    op = op_for(spec.op, spec.params)
    watcher = CopyWatcher(device)
    measured = sections.records()  # this extra run must not replace the measured sections
    try:
        with watcher:
            op.run(body.inputs, ctx)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception:
        return None
    finally:
        sections.restore(measured)
    return watcher.report()


def run_op(
    op: Op, inputs: Inputs, ctx: OpContext, spec: RunSpec, meter: Meter
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    warmup, repeat = spec.warmup, spec.repeat
    if op.runs_once:
        warmup, repeat = 0, 1
    outputs: tuple[torch.Tensor, ...] = ()
    for _ in range(warmup):
        outputs = ()  # drop the last output first: the peak shows one call's needs
        outputs = as_tuple(call(op.run, inputs, ctx))
    meter.sync()
    times: list[float] = []
    use_events = ctx.device.type == "cuda"
    for _ in range(repeat):
        outputs = ()
        if use_events:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            outputs = as_tuple(call(op.run, inputs, ctx))
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            outputs = as_tuple(call(op.run, inputs, ctx))
            times.append(time.perf_counter() - started)
    timing: dict[str, Any] = {
        "method": "cuda_events" if use_events else "perf_counter",
        "median_s": statistics.median(times) if times else None,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "repeats_s": times,
        "warmup": warmup,
        "repeat": repeat,
    }
    if op.bytes_moved is not None and timing["median_s"]:
        timing["bytes_per_s"] = op.bytes_moved(inputs, ctx) / timing["median_s"]
    return outputs, timing
