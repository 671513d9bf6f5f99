"""Inferring what a block was for, the way Mosaic and PyTorch's memory profiler reason:
an inference, never a measurement. Each block gets a category and the evidence that put
it there; where the evidence does not decide, ``unknown`` with the reason.

The evidence: the frames that allocated a block (its site, ``site``), the frames that freed
it (inside ``Optimizer.zero_grad``: a gradient), the time order of the main thread's calls
(``app.snapshots.evidence``: an allocation with no frames between a ``backward`` call and
its return was made on autograd's thread), how long it lived against those calls (past its
backward: a gradient; past its optimizer step: optimizer state; freed after a later
backward began: an activation), and its size (a cuBLAS handle's workspace, one per thread,
kept for the process).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from vramlab.contract import CATEGORY_KEYS, Category

CATEGORIES = CATEGORY_KEYS

# Sites, from frames (AUTOGRAD: no frames, but made inside a backward call's window;
# RECOMPUTE: a forward's frames recorded inside a backward call's window, which only
# autograd's thread records there: a checkpointed forward recomputed for that backward).
OPTIMIZER, BACKWARD, PARAMETER, FORWARD, NONE, EMPTY, WORKSPACE, AUTOGRAD, RECOMPUTE = range(9)

RULES = {
    "parameters": "allocated while a module was built or moved (nn.Module __init__, "
    "reset_parameters, to/cuda/_apply, nn.Parameter)",
    "gradients": "freed inside Optimizer.zero_grad, or made in backward (autograd's frames, "
    "or no frames between a backward call and its return: autograd's thread) and alive after "
    "that backward returned",
    "optimizer_state": "allocated inside torch.optim (an optimizer step) and alive after that "
    "step ended",
    "activations": "allocated in a module's forward and freed only after a later backward "
    "began (saved for backward); or in a forward recomputed inside a backward (activation "
    "checkpointing); or in the forward that ran out of memory (no backward came to tell saved "
    "from temporary)",
    "temporaries": "allocated in forward, backward or an optimizer step and freed before that "
    "work was done; and library workspaces (named in C++ frames, or a cuBLAS workspace's size "
    "made where matmuls run and never freed: one per handle, so per thread; cuBLASLt's 1 MiB "
    "made by a recomputed forward and kept after its backward returned)",
    "other": "made by the program outside any module, backward or optimizer step (inputs, "
    "targets, a loss)",
    "unknown": "the evidence does not decide: each block's reason is listed",
}

# cuBLAS's default workspace per handle: ":4096:8" on Hopper (32 MiB), ":4096:2:16:8"
# before it (8 MiB + 128 KiB); CUBLAS_WORKSPACE_CONFIG changes both, and the trace does not
# record it.
WORKSPACE_SIZES = frozenset({32 * 2**20, 4096 * 1024 * 2 + 16 * 1024 * 8})
# cuBLASLt's (CUBLASLT_WORKSPACE_SIZE, 1 MiB), made right after the handle's on its first
# use: a common size for a tensor too, so only that order says it is a workspace.
LT_WORKSPACE_SIZE = 2**20

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


def runs_in_backward(frames: Sequence[Any]) -> bool:
    """Python frames that autograd's thread records itself: a checkpointed forward being
    recomputed, or an ``autograd.Function``'s own ``backward`` (or what it frees as it
    returns, where the outermost frame is ``torch/autograd/function.py``'s ``apply``:
    autograd's thread has no Python frame below the one that calls it; the main thread's
    stacks end in the program's)."""
    frames = frames or ()
    if frames:
        last = frames[-1]
        if (
            type(last) is dict
            and last.get("name") == "apply"
            and type(last.get("filename")) is str
            and last["filename"].endswith("torch/autograd/function.py")
        ):
            return True
    for f in frames:
        if type(f) is not dict:
            continue
        filename = f.get("filename")
        if type(filename) is str and "torch/utils/checkpoint.py" in filename:
            return True
        if f.get("name") == "backward" and type(filename) is str and "torch/" not in filename:
            return True
    return False


class Clock(NamedTuple):
    """Where the main thread's calls stood at one moment, as trace positions (-1: never)."""

    backward_start: int = -1  # the latest backward call's start
    backward_end: int = -1  # the latest backward call's return
    step_start: int = -1  # the latest optimizer step's start
    step_end: int = -1
    forward: int = -1  # the latest allocation in a module's forward
    in_backward: bool = False
    in_step: bool = False


class Fate(NamedTuple):
    """How a block ended: its free (None: alive at the trace's end), whether that free was
    called inside ``zero_grad``, and the clock then."""

    freed: int | None
    zero_grad: bool
    clock: Clock


_WHERE = {
    BACKWARD: "in backward",
    AUTOGRAD: "with no frames between a backward call and its return (autograd's thread)",
}

G, P, S = Category.GRADIENTS.value, Category.PARAMETERS.value, Category.OPTIMIZER_STATE.value
A, T, OTH, U = (
    Category.ACTIVATIONS.value,
    Category.TEMPORARIES.value,
    Category.OTHER.value,
    Category.UNKNOWN.value,
)


def workspace(
    where: int, size: int, fate: Fate, after_workspace: bool = False, after_output: bool = False
) -> tuple[str, str] | None:
    """A library workspace's verdict (a temporary, and its evidence), or None where the
    block shows none: named in C++ frames; kept, a cuBLAS workspace's size, made where
    matmuls run (or right after its op's output by the same stack); kept, cuBLASLt's 1 MiB
    right after one by the same op, or made by a recomputed forward and kept past its
    backward (autograd's thread's). What a recording's phases cannot overrule."""
    kept = fate.freed is None
    if where == WORKSPACE:
        return T, "a library workspace, named in its C++ frames"
    if not kept:
        return None
    if where in (FORWARD, BACKWARD, AUTOGRAD, EMPTY, RECOMPUTE) and size in WORKSPACE_SIZES:
        return T, f"{size} bytes (a cuBLAS workspace's size), made where matmuls run, never freed"
    if where == NONE and size in WORKSPACE_SIZES and after_output:
        return T, (
            f"{size} bytes (a cuBLAS workspace's size) made right after its op's output by "
            "the same stack, never freed"
        )
    if size != LT_WORKSPACE_SIZE:
        return None
    if after_workspace and where in (FORWARD, BACKWARD, RECOMPUTE):
        return T, "1 MiB made right after a cuBLAS workspace by the same op (cuBLASLt's)"
    if where == RECOMPUTE and not fate.clock.in_backward:
        return T, (
            "1 MiB made in a forward recomputed inside a backward, kept after that "
            "backward returned (cuBLASLt's workspace of autograd's thread)"
        )
    return None


def decide(
    where: int,
    seq: int,
    size: int,
    pre_trace: bool,
    fate: Fate,
    after_workspace: bool = False,
    after_output: bool = False,
    oom: Clock | None = None,
) -> tuple[str, str]:
    """A block's category and the evidence for it, from its site (``where``), its
    allocation's position ``seq``, its size, how it ended and whether it was allocated
    right after a workspace-sized block by the same stack, (for a workspace-sized one)
    whether it was allocated right after another by the same stack (its op's output), and
    ``oom``: the clock at the first out-of-memory error after its allocation (None: none)."""
    clock = fate.clock
    kept = fate.freed is None
    if where == PARAMETER:
        return P, "made while a module was built or moved"
    found = workspace(where, size, fate, after_workspace, after_output)
    if found is not None:
        return found
    if kept and after_workspace and size == LT_WORKSPACE_SIZE and where in (AUTOGRAD, EMPTY):
        return U, (  # no frames to say it was the same op
            "1 MiB made with no frames right after a cuBLAS workspace, never freed "
            "(cuBLASLt's workspace or a gradient)"
        )
    if fate.zero_grad:
        return G, "freed inside Optimizer.zero_grad"
    if where in (BACKWARD, AUTOGRAD):
        how = _WHERE[where]
        if clock.backward_end > seq or clock.forward > seq or clock.step_start > seq:
            return G, f"made {how}, alive after that backward returned"
        if kept:
            if clock.in_backward:
                return (
                    U,
                    f"made {how}; the trace ends before it returned (a gradient or a temporary)",
                )
            return G, f"made {how}, never freed"
        return T, f"made {how}, freed before it returned"
    if where == OPTIMIZER:
        if clock.step_end > seq or clock.forward > seq:
            return S, "made in an optimizer step, alive after that step ended"
        if kept:
            if clock.in_step:
                return (
                    U,
                    "made in an optimizer step; the trace ends inside it (state or a temporary)",
                )
            return S, "made in an optimizer step, never freed"
        return T, "made in an optimizer step, freed within it"
    if where == RECOMPUTE:
        if not kept:
            return A, "made in a forward recomputed inside a backward (activation checkpointing)"
        if clock.in_backward:
            return U, (
                "made in a forward recomputed inside a backward, alive when the trace ended "
                "inside it (recomputed for it, or a workspace)"
            )
        return U, "made in a forward recomputed inside a backward, kept after it returned"
    if where == FORWARD:
        if (
            oom is not None
            and oom.backward_start < seq
            and oom.step_start < seq
            and not oom.in_backward
            and not oom.in_step
        ):
            return A, (
                "made in the forward that ran out of memory (no backward came to tell saved "
                "from temporary: a forward's tensors, as PyTorch's MemTracker counts them)"
            )
        if clock.backward_start > seq:
            if kept and clock.in_backward:
                return U, (
                    "made in a forward, alive when the trace ended inside a later backward "
                    "(saved for it, or an output still held)"
                )
            if kept:
                return U, "made in a forward, never freed (an output still held, or a workspace)"
            return A, "made in a forward, freed after a later backward began (saved for it)"
        if kept:
            return (
                U,
                "made in a forward, never freed, no backward after it (an activation or an output)",
            )
        return T, "made in a forward, freed before any backward"
    if where == EMPTY:
        if pre_trace:
            return (
                U,
                "allocated before the trace began, no frames (the ring buffer dropped its entry)",
            )
        return U, "no frames, made outside any backward call (another thread or C++ code)"
    return OTH, "made by the program outside any module, backward or optimizer step"


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
