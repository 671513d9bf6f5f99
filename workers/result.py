"""A result's figures and descriptions, from the phases and the tensors an op held.

The shape of everything built here is the contract's (app/contract.py): the child
validates the whole outcome against it before sending it.
"""

from __future__ import annotations

from typing import Any

import torch

from vramlab.contract import MemoryFigures
from vramlab.runspec import RunSpec
from workers.measure import PhaseRecord
from workers.ops import storage_key
from workers.probe import host_info
from workers.tracer import Trace


def memory(
    before_phase: PhaseRecord, after_phase: PhaseRecord, peak: int | None, reserved_peak: int | None
) -> MemoryFigures | None:
    """The figures from ``before_phase``'s start to ``after_phase``'s end; None where the
    device could not be read (after a CUDA error the allocator may not answer)."""
    before, after = before_phase.start, after_phase.end
    allocated_before, allocated_after = before.allocated, after.allocated
    reserved_before, reserved_after = before.reserved, after.reserved
    if (
        allocated_before is None
        or allocated_after is None
        or peak is None
        or reserved_before is None
        or reserved_after is None
        or reserved_peak is None
    ):
        return None
    return MemoryFigures(
        allocated_before=allocated_before,
        allocated_after=allocated_after,
        allocated_peak=peak,
        reserved_before=reserved_before,
        reserved_after=reserved_after,
        reserved_peak=reserved_peak,
        delta_allocated=allocated_after - allocated_before,
        host_rss_before=before.host_rss,
        host_rss_after=after.host_rss,
        device_used_before=before.device_used,
        device_used_after=after.device_used,
        pinned_host_before=before.pinned_host,
        pinned_host_after=after.pinned_host,
    )


def build_result(
    spec: RunSpec,
    phases: list[PhaseRecord],
    inputs: dict[str, torch.Tensor],
    outputs: tuple[torch.Tensor, ...],
    timing: dict[str, Any] | None,
    trace: Trace,
    alloc_conf: str,
) -> dict[str, Any]:
    by_name = {p.name: p for p in phases}
    # "before"/"after" bound the op phase; an OOM leaves the last phase reached instead.
    op = by_name.get("op") or (phases[-1] if phases else PhaseRecord("op"))
    input_ptrs = {storage_key(t) for t in inputs.values()}
    names = [o.name for o in spec.prediction.outputs] if spec.prediction is not None else []
    out_names = names if len(names) == len(outputs) else [f"out{i}" for i in range(len(outputs))]
    return {
        "memory": memory(op, op, op.allocated_peak, op.reserved_peak),
        "phases": [p.as_dict() for p in phases],
        "timing": timing,
        "environment": environment(spec.device, alloc_conf),
        "prediction": spec.prediction_wire(),
        "inputs": [describe(n, t, set()) for n, t in inputs.items()],
        "outputs": [describe(n, t, input_ptrs) for n, t in zip(out_names, outputs, strict=True)],
        "notes": [],
        "trace": trace_summary(trace),
    }


def trace_summary(trace: Trace) -> dict[str, Any]:
    return {"source": trace.source, "events": len(trace.events), "truncated": trace.truncated}


def environment(device: str, alloc_conf: str) -> dict[str, Any]:
    env = host_info()
    gpu_name, gpu_total = None, None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        gpu_name, gpu_total = props.name, int(props.total_memory)
    return {
        **env,
        "gpu_name": gpu_name,
        "gpu_total_memory": gpu_total,
        # The runner fills it in from the worker's capabilities, probed once: asking NVML
        # (or nvidia-smi) in every experiment's child cost tens of milliseconds.
        "driver": None,
        "allocator_conf": alloc_conf,
        "device": device,
    }


def tensor_bytes(t: torch.Tensor) -> int:
    if t.is_sparse:
        return int(t._indices().nbytes + t._values().nbytes)
    return int(t.nbytes)


def describe(name: str, t: torch.Tensor, input_ptrs: set[int]) -> dict[str, Any]:
    ptr = storage_key(t)
    storage = 0 if t.is_sparse else int(t.untyped_storage().nbytes())
    return {
        "name": name,
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "bytes": tensor_bytes(t),
        # A view's storage may be far larger than the view: it keeps its whole base alive.
        "storage_bytes": storage if not t.is_sparse else tensor_bytes(t),
        "layout": "sparse_coo"
        if t.is_sparse
        else (
            "channels_last"
            if t.dim() == 4
            and t.is_contiguous(memory_format=torch.channels_last)
            and not t.is_contiguous()
            else "strided"
        ),
        "is_contiguous": bool(t.is_contiguous()) if not t.is_sparse else None,
        # Same storage as an input: a view or the input itself (Tensor.to with no change).
        "is_view_of_input": ptr != 0 and ptr in input_ptrs,
    }
