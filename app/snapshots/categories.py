"""Inferring what a block was for from the stack that allocated it, the way Mosaic and
PyTorch's memory profiler reason: an inference, never a measurement. Each category
carries the rule that put a block there.

A site is read from the frames (innermost first, as PyTorch records them); a block's
category then depends on its site and on how long it lived: an optimizer block that
survives into a later forward is optimizer state, a backward block that survives its
backward is a gradient, a forward block freed after a later backward began was saved for
that backward (an activation). Blocks whose site says nothing, and library workspaces,
are ``other``.
"""

from collections.abc import Sequence
from typing import Any

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")

# Sites, from frames.
OPTIMIZER, BACKWARD, PARAMETER, FORWARD, NONE, EMPTY, WORKSPACE = range(7)

RULES = {
    "parameters": "allocated while a module was built or moved (nn.Module __init__, "
    "reset_parameters, to/cuda/_apply, nn.Parameter)",
    "gradients": "allocated in backward (autograd engine or Tensor.backward) and alive after "
    "it: never freed, freed by zero_grad, or freed after a later optimizer step or forward",
    "optimizer_state": "allocated inside torch.optim (an optimizer step) and alive into a later "
    "forward, or never freed",
    "activations": "allocated in a module's forward and freed only after a later backward "
    "began (saved for backward)",
    "temporaries": "allocated in forward, backward or an optimizer step and freed before "
    "that work was done",
    "other": "a library workspace (cuBLAS, seen in C++ frames), a forward allocation kept "
    "to the end (an output still referenced, or a workspace where only Python frames were "
    "recorded), or no recorded frame says what it was for (no stack: with Python frames "
    "alone, backward runs on autograd's thread and records none)",
}

_PARAM_NAMES = frozenset({"__init__", "reset_parameters", "_apply", "to", "cuda", "convert"})
_BACKWARD_NAMES = frozenset({"backward", "_engine_run_backward", "run_backward", "grad"})
_FORWARD_IMPL = frozenset({"_call_impl", "_wrapped_call_impl"})
# C++ frames of cuBLAS's workspace, made on a handle's first use and kept for the process.
_WORKSPACE_NAMES = ("setWorkspaceForHandle", "getCUDABlasLtWorkspace", "getCurrentCUDABlasHandle")


def site(frames: Sequence[Any]) -> int:
    """Where an allocation came from, from its frames."""
    if not frames:
        return EMPTY
    forward = param = False
    for frame in frames:
        if type(frame) is not dict:
            continue
        filename = frame.get("filename")
        name = frame.get("name")
        if type(filename) is not str or type(name) is not str:
            continue
        if "torch/optim/" in filename:
            return OPTIMIZER
        if any(w in name for w in _WORKSPACE_NAMES):
            return WORKSPACE
        if "autograd::Engine" in name or "autograd::engine" in name:
            return BACKWARD
        if name in _BACKWARD_NAMES and (
            "torch/autograd/" in filename or "torch/_tensor" in filename
        ):
            return BACKWARD
        if "torch/nn/" in filename:
            if name in _PARAM_NAMES or filename.endswith("parameter.py"):
                param = True
            elif name in _FORWARD_IMPL or name == "forward":
                forward = True
        elif name == "forward":
            forward = True
    if param and not forward:
        return PARAMETER
    if forward:
        return FORWARD
    return PARAMETER if param else NONE


def has_zero_grad(frames: Sequence[Any]) -> bool:
    return any(type(f) is dict and f.get("name") == "zero_grad" for f in frames or ())


def category(
    where: int,
    alloc_index: int,
    free_index: int | None,
    freed_by_zero_grad: bool,
    last_backward_before_free: int,
    last_forward_before_free: int,
    last_optimizer_before_free: int,
) -> str:
    """A block's category from its site and its lifetime (indexes are trace positions;
    the ``last_*`` are the latest allocation of that site before the block's free)."""
    never_freed = free_index is None
    if where == PARAMETER:
        return "parameters"
    if where == OPTIMIZER:
        return (
            "optimizer_state"
            if never_freed or last_forward_before_free > alloc_index
            else "temporaries"
        )
    if where == BACKWARD:
        later = max(last_forward_before_free, last_optimizer_before_free)
        if never_freed or freed_by_zero_grad or later > alloc_index:
            return "gradients"
        return "temporaries"
    if where == FORWARD:
        if never_freed:
            return "other"
        if last_backward_before_free > alloc_index:
            return "activations"
        return "temporaries"
    return "other"


# Frames of the recorder and the allocator themselves, innermost in every C++ stack.
_MACHINERY = (
    "torch::unwind",
    "torch::CapturedTraceback",
    "torch::cuda::(anonymous namespace)::gather",
    "c10::cuda::CUDACachingAllocator",
    "c10::cuda::MemPool",
)


def telling_frames(frames: Sequence[Any], n: int = 3) -> list[dict[str, Any]]:
    """The ``n`` frames that say most about where a block came from: Python frames when
    there are any, else C++ frames past the recorder's and the allocator's own."""
    plain = [f for f in frames if isinstance(f, dict)]
    python = [f for f in plain if str(f.get("filename", "")).endswith(".py")]
    if python:
        return python[:n]
    return [f for f in plain if not str(f.get("name", "")).startswith(_MACHINERY)][:n]
