"""A shared process between experiments: emptied, reset and checked, or retired.

A ``shared`` experiment runs in a long-lived child that the runner hands spec after spec
(workers/runner.py). After each result this module puts the process back as a clean one
starts, as far as that can be done and checked: garbage collected, cuBLAS's workspaces
freed (so the next first matmul allocates its workspace again), the caching allocator's
cache given back to the driver, its peak and accumulated statistics reset, the
allocation history cleared, the byte cap lifted, the random number generators back to
the state a fresh process has. Then it checks: nothing allocated or reserved, no
allocation history, no pinned host block in use, no profiler or dispatch mode left
running, no tensor of the experiment's still alive, torch's global settings as they were.
Anything else, or an experiment that ended in a way that may have left state behind (a
failure other than a plain refused op), retires the process; the next shared experiment
runs in a fresh one.

What cannot be undone stays, and each shared result says so: kernels already loaded,
cuDNN and cuBLAS handles and plans, the CUDA context made earlier, the host's RSS baseline.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from vramlab.contract import ErrorType, Status
from vramlab.runspec import RunSpec
from workers import limits

# Failures that are PyTorch refusing an op before it did anything to the device: the
# process may serve again (when the checks below also pass).
KEEPS_PROCESS = frozenset(
    {
        ErrorType.INVALID_SPEC,
        ErrorType.UNSUPPORTED_ON_DEVICE,
        ErrorType.DEVICE_MISMATCH,
        ErrorType.AUTOGRAD_ERROR,
    }
)
# Words of an error from the device or a CUDA library: the context may be broken.
_DEVICE_ERROR = ("CUDA", "cuda", "CUBLAS", "cuBLAS", "CUDNN", "cuDNN", "device-side", "NCCL")


@dataclass
class Baseline:
    """What a fresh process holds, captured before its first shared experiment."""

    device: torch.device
    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None
    grad_enabled: bool
    default_dtype: torch.dtype
    threads: int
    cudnn_benchmark: bool

    @classmethod
    def capture(cls, device: torch.device) -> Baseline:
        cuda = device.type == "cuda"
        return cls(
            device=device,
            cpu_rng=torch.get_rng_state(),
            # The generator's default seed and offset: no device memory.
            cuda_rng=torch.cuda.get_rng_state(device) if cuda else None,
            grad_enabled=torch.is_grad_enabled(),
            default_dtype=torch.get_default_dtype(),
            threads=torch.get_num_threads(),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        )


def retire_after(spec: RunSpec, payload: dict[str, Any]) -> str | None:
    """Why the way this experiment ended leaves its process unfit to serve another."""
    if spec.cudnn_benchmark:
        # cuDNN keeps what its benchmark chose: a later conv here would skip the trials.
        return "it ran cuDNN's benchmark, whose choices stay in the process"
    if payload.get("status") == Status.SUCCEEDED:
        return None
    error = payload.get("error") or {}
    kind = error.get("type")
    message = str(error.get("message") or "")
    if kind in KEEPS_PROCESS and not any(word in message for word in _DEVICE_ERROR):
        return None
    return f"the experiment failed ({kind})"


def empty(baseline: Baseline) -> str | None:
    """Put the process back as a fresh one starts; None when every check passed, else
    what was still not empty (the process must then retire)."""
    limits.release()
    gc.collect()
    device = baseline.device
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)  # a sticky CUDA error shows here
        except Exception as exc:  # the context may be unusable: retire
            return f"the device did not answer: {exc}"
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        _empty_host_cache()
        torch.cuda.memory._record_memory_history(enabled=None, clear_history=True)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)
        torch.cuda.set_rng_state(baseline.cuda_rng, device)  # type: ignore[arg-type]
        if why := _device_left(device):
            return why
    torch.set_rng_state(baseline.cpu_rng)
    torch.backends.cudnn.benchmark = baseline.cudnn_benchmark
    if torch._C._autograd._profiler_enabled():
        return "a profiler is still running"
    if torch._C._len_torch_dispatch_stack():
        return "a dispatch mode is still active"
    changed = _settings_changed(baseline)
    if changed:
        return f"torch's global settings changed: {changed}"
    kept = _tensors_alive()
    if kept:
        return f"{kept} tensors made by the experiment are still alive"
    # What survives now is the process's own: the next collection need not scan it.
    gc.freeze()
    return None


def _device_left(device: torch.device) -> str | None:
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    if allocated or reserved:
        return f"{allocated:,} bytes still allocated and {reserved:,} reserved on {device}"
    snapshot = torch.cuda.memory._snapshot()
    if any(snapshot.get("device_traces") or []) or snapshot.get("segments"):
        return "the allocation history or the allocator's segments are not empty"
    pinned = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    if pinned:
        return f"{pinned:,} bytes of pinned host memory still in use"
    return None


def _empty_host_cache() -> None:
    """Give cached pinned host blocks back: they would serve the next experiment's pin
    without a new page-locked allocation (its host figures would differ)."""
    empty_host = getattr(torch._C, "_host_emptyCache", None) or getattr(
        torch._C, "_accelerator_emptyHostCache", None
    )
    if empty_host is not None:
        empty_host()


def _settings_changed(baseline: Baseline) -> str:
    now = {
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
    }
    before = {
        "grad_enabled": baseline.grad_enabled,
        "default_dtype": baseline.default_dtype,
        "threads": baseline.threads,
    }
    return ", ".join(f"{k} {before[k]} -> {v}" for k, v in now.items() if v != before[k])


def _tensors_alive() -> int:
    """Tensors made since the process last froze its heap (before the experiment) that
    are still alive: the experiment's, held somewhere after it ended."""
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
