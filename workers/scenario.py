"""Runs a scenario: named-tensor steps, each a measured phase with a mark in the trace.

The steps were validated by the catalog (app/catalog/scenario/); here each is done
with PyTorch. A repeat block is one phase (its inner steps are not measured one by one).
The whole run is watched for copies between devices (workers/placement.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vramlab.runspec import RunSpec
from workers.errors import OpFailure, call, classify
from workers.measure import Meter, PhaseRecord
from workers.ops import torch_dtype
from workers.placement import CopyWatcher
from workers.result import environment, memory, trace_summary
from workers.tracer import Trace, Tracer

Env = dict[str, list[torch.Tensor]]
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "mul": torch.mul,
    "matmul": torch.matmul,
    "add_": lambda a, b: a.add_(b),
    "mul_": lambda a, b: a.mul_(b),
}
_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "sum": torch.sum,
    "clone": torch.clone,
    "transpose_contiguous": lambda a: a.transpose(-2, -1).contiguous(),
}


class _Runner:
    def __init__(self, spec: RunSpec, device: torch.device) -> None:
        self.dtype = spec.dtype
        self.device = device
        self.env: Env = {}

    def create(self, step: dict[str, Any]) -> None:
        dtype = torch_dtype(step.get("dtype") or self.dtype)
        device = torch.device(step.get("device") or self.device)
        shape, fn = tuple(step["shape"]), step.get("fn", "empty")
        pin = bool(step.get("pin_memory"))

        def make() -> torch.Tensor:
            if fn == "full":
                return torch.full(
                    shape, float(step.get("value", 0.0)), dtype=dtype, device=device, pin_memory=pin
                )
            maker = getattr(torch, fn)  # one of the catalog's CREATE_FNS
            t: torch.Tensor = maker(shape, dtype=dtype, device=device, pin_memory=pin)
            return t

        # Rebinding a name frees what it held first: the new tensor reuses the space.
        self.env.pop(step["name"], None)
        self.env[step["name"]] = [make() for _ in range(int(step.get("count", 1)))]

    def op(self, step: dict[str, Any]) -> None:
        fn, args = step["fn"], [self.env[a][0] for a in step["args"]]
        if fn in _BINARY:
            out = _BINARY[fn](args[0], args[1])
        elif fn == "narrow":
            out = args[0].narrow(
                int(step.get("dim", 0)), int(step.get("start", 0)), int(step.get("length", 1))
            )
        else:
            out = _UNARY[fn](args[0])
        self.env[step.get("name") or step["args"][0]] = [out]

    def move(self, step: dict[str, Any]) -> None:
        src = self.env[step["src"]][0]
        dtype = torch_dtype(step["dtype"]) if step.get("dtype") else src.dtype
        device = torch.device(step.get("device") or self.device)
        moved = src.to(device, dtype, non_blocking=bool(step.get("non_blocking")))
        self.env[step["name"]] = [moved]

    def pin(self, step: dict[str, Any]) -> None:
        self.env[step["name"]] = [self.env[step["src"]][0].pin_memory()]

    def delete(self, step: dict[str, Any]) -> None:
        every = step.get("every")
        if every is None:
            del self.env[step["name"]]
        else:
            self.env[step["name"]] = [t for i, t in enumerate(self.env[step["name"]]) if i % every]

    def empty_cache(self, step: dict[str, Any]) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def synchronize(self, step: dict[str, Any]) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def repeat(self, step: dict[str, Any]) -> None:
        for _ in range(int(step["times"])):
            for inner in step["steps"]:
                self.do(inner)

    def do(self, step: dict[str, Any]) -> None:
        getattr(self, step["do"])(step)  # "do" is one of the catalog's STEP_KINDS

    def tensors(self) -> dict[str, list[dict[str, Any]]]:
        return {
            name: [
                {
                    "shape": list(t.shape),
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "device": str(t.device),
                    "bytes": t.nbytes,
                    "pinned": t.is_pinned(),
                }
                for t in ts[:8]
            ]
            + ([{"more": len(ts) - 8}] if len(ts) > 8 else [])
            for name, ts in self.env.items()
        }


def phase_name(index: int, label: str) -> str:
    return f"{index:02d} {label}"[:120]


def execute(
    spec: RunSpec, device: torch.device, meter: Meter, tracer: Tracer
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any], Env]:
    """Run the steps; return one entry per step, the first error (or None), placement, and
    the named tensors (the caller holds them until the trace stops, so their frees are not
    counted in the last step)."""
    runner = _Runner(spec, device)
    planned = spec.prediction.steps if spec.prediction is not None else None
    labels = [s.label for s in planned or []]
    stop = spec.stops_on_error
    out: list[dict[str, Any]] = []
    first_error: dict[str, Any] | None = None
    watcher = CopyWatcher(device)
    with watcher:
        for i, step in enumerate(spec.steps or ()):
            label = step.get("label") or (labels[i] if i < len(labels) else step["do"])
            name = phase_name(i, str(label))
            entry: dict[str, Any] = {"name": name, "do": step["do"], "error": None}
            out.append(entry)
            try:
                with meter.phase(name, tracer.phase(name)):
                    call(runner.do, step)
            except OpFailure as failure:
                entry["error"] = classify(failure.cause, spec)
                first_error = first_error or entry["error"]
                if stop:
                    break
    placement = {"tensors": runner.tensors(), **watcher.report()}
    return out, first_error if stop else None, placement, runner.env


def build_result(
    spec: RunSpec,
    phases: list[PhaseRecord],
    steps: list[dict[str, Any]],
    trace: Trace,
    alloc_conf: str,
) -> dict[str, Any]:
    by_name = {p.name: p for p in phases}
    predicted = (spec.prediction.steps if spec.prediction is not None else None) or []
    for i, entry in enumerate(steps):
        record = by_name.get(entry["name"])
        if record is not None:
            entry.update(record.as_dict())
            entry["name"] = record.name
        entry["predicted_allocated_after"] = (
            predicted[i].allocated_after if i < len(predicted) else None
        )
    peaks = [p.allocated_peak for p in phases if p.allocated_peak is not None]
    reserved = [p.reserved_peak for p in phases if p.reserved_peak is not None]
    first, last = (phases[0], phases[-1]) if phases else (PhaseRecord("-"), PhaseRecord("-"))
    return {
        "memory": memory(first, last, max(peaks, default=None), max(reserved, default=None)),
        "steps": steps,
        "phases": [],
        "timing": {"method": "perf_counter", "wall_s": sum(p.wall_s for p in phases)},
        "environment": environment(spec.device, alloc_conf),
        "prediction": spec.prediction_wire(),
        "inputs": [],
        "outputs": [],
        "notes": [],
        "trace": trace_summary(trace),
    }
