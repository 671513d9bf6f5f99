"""Failures inside an op, as error dicts of the contract's types (app/contract.py)."""

from __future__ import annotations

import re
import traceback
from typing import Any

import torch

from vramlab.catalog.errors import CatalogError
from vramlab.contract import ErrorType
from vramlab.runspec import RunSpec
from workers import limits
from workers.measure import PhaseRecord

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_DEVICE_MISMATCH = (
    "Expected all tensors to be on the same device",
    "found at least two devices",
    "is not on the expected device",
    "should be the same or input should be a MKLDNN tensor",
    "Expected object of device type",
    "Input type (torch.FloatTensor) and weight type (torch.cuda",
)
_AUTOGRAD = (
    "a leaf Variable that requires grad is being used in an in-place operation",
    "one of the variables needed for gradient computation has been modified",
    "does not require grad and does not have a grad_fn",
)


class OpFailure(Exception):
    """An exception that PyTorch raised inside an op's set-up or run (not a vramlab bug)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise OpFailure(exc) from exc


def error(
    kind: ErrorType, exc: BaseException, hint: str | None, details: dict[str, Any]
) -> dict[str, Any]:
    return {
        "type": kind,
        "message": str(exc) or type(exc).__name__,
        "hint": hint,
        "details": details,
    }


def classify(
    exc: BaseException, spec: RunSpec, extras: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Turn an exception raised by PyTorch in an op into one of our error types."""
    message = str(exc)
    name = {"exception": type(exc).__name__}
    if isinstance(exc, torch.OutOfMemoryError | MemoryError) or "can't allocate memory" in message:
        capped = limits.explain(exc, spec)
        if capped is not None:
            return capped
        failed = error(
            ErrorType.OOM, exc, "use a smaller shape or dtype, or free memory on the device", name
        )
        device = torch.device(spec.device)
        if device.type == "cuda":
            # Now, while what the op held is still alive: the allocator as it failed.
            failed["details"]["allocator"] = allocator_snapshot(device)
        return failed
    if isinstance(exc, CatalogError):  # a model the worker found it cannot build as asked
        return error(
            ErrorType.INVALID_SPEC, exc, "change the field it names", {**name, "field": exc.field}
        )
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("transformers", "accelerate"):
        return error(
            ErrorType.UNSUPPORTED_ON_DEVICE,
            exc,
            "model experiments need transformers beside this worker: install "
            "vramlab[worker,models]",
            name,
        )
    if any(p in message for p in _DEVICE_MISMATCH):
        devices = (extras or {}).get("input_devices") or {}
        return error(
            ErrorType.DEVICE_MISMATCH,
            exc,
            "move every input (and the module's parameters: module.to(device)) to one device "
            "first; only a 0-dim CPU tensor may sit beside tensors on another device",
            {**name, "input_devices": devices},
        )
    if any(p in message for p in _AUTOGRAD):
        return error(
            ErrorType.AUTOGRAD_ERROR,
            exc,
            "autograd refuses this: an in-place op on a leaf that requires grad must run "
            "under torch.no_grad() (as optimizers do), or on a non-leaf copy",
            name,
        )
    if isinstance(
        exc, RuntimeError | NotImplementedError | TypeError | ValueError | AssertionError
    ):
        hint = (
            f"op {spec.op!r} with dtype {spec.dtype!r} is not supported on "
            f"{spec.device!r} by this PyTorch build; the message is PyTorch's own"
        )
        return error(ErrorType.UNSUPPORTED_ON_DEVICE, exc, hint, name)
    return error(
        ErrorType.INTERNAL,
        exc,
        "a bug in vramlab's worker; please report it",
        {**name, "traceback": traceback.format_exc()},
    )


def oom_details(message: str, phases: list[PhaseRecord]) -> dict[str, Any]:
    details: dict[str, Any] = {"requested_bytes": None, "requested_is_approximate": False}
    exact = re.search(r"tried to allocate (\d+) bytes", message)
    rounded = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message)
    if exact:
        details["requested_bytes"] = int(exact.group(1))
    elif rounded:
        # The CUDA message rounds to two decimals of its unit.
        details["requested_bytes"] = int(float(rounded.group(1)) * _UNITS[rounded.group(2)])
        details["requested_is_approximate"] = True
    last = phases[-1] if phases else None
    details["allocated_bytes"] = last.end.allocated if last else None
    details["reserved_bytes"] = last.end.reserved if last else None
    details["phase"] = last.name if last else None
    return details


MAX_SEGMENTS_LISTED = 100


def allocator_snapshot(device: torch.device) -> dict[str, Any]:
    """What the caching allocator held right after the failed request: its segments,
    how full each was, and the largest free block (a request larger than that, and than
    what the driver still had, is what failed)."""
    try:
        segments = [s for s in torch.cuda.memory_snapshot() if s.get("device") == device.index]
    except RuntimeError:
        return {"segments": [], "n_segments": 0, "note": "no snapshot: CUDA is not usable"}
    listed = []
    for seg in segments:
        free = [b["size"] for b in seg.get("blocks", []) if b.get("state") == "inactive"]
        listed.append(
            {
                "address": seg["address"],
                "total_size": seg["total_size"],
                "allocated_size": seg["allocated_size"],
                "largest_free_block": max(free, default=0),
                "segment_type": seg.get("segment_type"),
            }
        )
    listed.sort(key=lambda s: s["total_size"], reverse=True)
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    return {
        "n_segments": len(listed),
        "reserved_bytes": sum(s["total_size"] for s in listed),
        "allocated_bytes": sum(s["allocated_size"] for s in listed),
        "largest_free_block": max((s["largest_free_block"] for s in listed), default=0),
        "device_free_bytes": free_bytes,
        "device_total_bytes": total_bytes,
        "segments": listed[:MAX_SEGMENTS_LISTED],
    }
