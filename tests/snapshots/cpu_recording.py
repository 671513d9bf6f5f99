"""A memory snapshot of a CPU training loop, made without CUDA: every storage an op makes
is an allocation at its address and the time it appeared (PyTorch's trace clock,
microseconds since the epoch), freed when the storage dies, as PyTorch's allocation history
records on a GPU (no frames, no rounding by an allocator). Beside it, what
``vramlab record``'s hooks (``tensor_marks.Marks`` on CPU tensors) noted, and the truth at
the replay's peak: the bytes alive then of the storages that were (or became: a gradient
is an op's output until autograd accumulates it) parameters, gradients or optimizer state,
by tensor identity, with no address or time. The import's recorded categories are
checked against that truth."""

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from vramlab.recorder_boot import phase_marks
from vramlab.recorder_boot.tensor_marks import KEY, Marks, now_us

PHASED = ("activations", "temporaries", "other")


def _block(n: int) -> int:
    return (n + 511) // 512 * 512


class Recording(TorchDispatchMode):
    """Logs each new storage an op returns as an alloc, its death as a free; after each op,
    names by identity the storages that are parameters, gradients or optimizer state."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[dict[str, Any]] = []
        self.info = WeakIdKeyDictionary()  # storage -> {"size", "category"}
        self.allocated = 0
        self.peak = -1
        self.parts: list[Any] = []  # the model and the optimizer, once built
        self.at_peak: list[dict[str, Any]] = []
        self.allocs = 0  # the allocator's counter, as phase_marks reads it
        # The phase as the program itself says it (``step``, ``forward``: from the model's
        # call to the backward; ``outside``), and its modules' calls open now (own hooks).
        self.phase = "outside"
        self.depth = 0

    def phase_now(self) -> str:
        """The category a storage made now has, by the program's own account: in a
        backward, a temporary unless a module is being called (a forward recomputed for
        checkpointing); in a step, a temporary; in a forward, an activation; else the
        program's own (other)."""
        if self.phase == "step":
            return "temporaries"
        if self.phase == "backward":
            return "activations" if self.depth else "temporaries"
        if self.phase == "forward" or self.depth:
            return "activations"
        return "other"

    def watch(self, model: torch.nn.Module) -> None:
        """Count the model's module calls with hooks of each module's own."""

        def enter(*_: Any) -> None:
            self.depth += 1

        def leave(*_: Any) -> None:
            self.depth -= 1

        for module in model.modules():
            module.register_forward_pre_hook(enter)
            module.register_forward_hook(leave, always_call=True)  # a recompute stops early

    def _add(self, action: str, addr: int, size: int) -> None:
        self.entries.append(
            {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": now_us()}
        )

    def _freed(self, addr: int, size: int) -> None:
        self._add("free_requested", addr, size)
        self._add("free_completed", addr, size)
        self.allocated -= _block(size)

    def _see(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st in self.info or st.nbytes() == 0:
            return
        addr, size = st.data_ptr(), st.nbytes()
        self.info[st] = {"size": _block(size), "category": None, "phase": self.phase_now()}
        weakref.finalize(st, self._freed, addr, size)
        self.allocs += 1
        self._add("alloc", addr, size)
        self.allocated += _block(size)

    def _name(self) -> None:
        if not self.parts:
            return
        model, optimizer = self.parts
        named = [(p, "parameters") for p in [*model.parameters(), *model.buffers()]]
        named += [(p.grad, "gradients") for p in model.parameters()]
        for state in optimizer.state.values():
            named += [(v, "optimizer_state") for v in state.values()]
        for t, category in named:
            if isinstance(t, torch.Tensor):
                info = self.info.get(t.untyped_storage())
                if info is not None and info["category"] is None:
                    info["category"] = category

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._see, out)
        self._name()
        if self.allocated > self.peak:
            self.peak = self.allocated
            self.at_peak = list(self.info.values())
        return out

    def truth(self) -> dict[str, int]:
        """Bytes at the peak of the storages that were (or became, as a gradient does when
        autograd accumulates it) parameters, gradients or optimizer state, and of the rest
        by the phase they were made in."""
        self._name()
        out = dict.fromkeys(("parameters", "gradients", "optimizer_state", *PHASED), 0)
        for info in self.at_peak:
            out[info["category"] or info["phase"]] += info["size"]
        return out


def record(
    build: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]],
    train: Callable[..., None],
    phases: bool = False,
) -> tuple[dict[str, Any], dict[str, int], Marks]:
    """The snapshot of ``train`` (after ``build``, both recorded; ``train`` is given the
    recording too, to say its phase), with what the hooks noted under ``KEY`` (and with
    ``phases``, ``phase_marks``' marks, counted by the recording's own allocations), and
    the truth at the peak."""
    marks = Marks(torch, device_type="cpu")
    marks.install()
    recording = Recording()
    phase_marks_ = phase_marks.Phases(torch, lambda: recording.allocs) if phases else None
    if phase_marks_ is not None:
        phase_marks_.install()
    try:
        with recording:
            recording.parts.extend(build())
            recording.watch(recording.parts[0])
            train(*recording.parts, recording)
        marks.see_all()
    finally:
        marks.uninstall()
        if phase_marks_ is not None:
            phase_marks_.uninstall()
    snapshot = {
        "segments": [],
        "device_traces": [list(recording.entries)],
        KEY: marks.data(),
    }
    if phase_marks_ is not None:
        snapshot[phase_marks.KEY] = phase_marks_.data()
    return snapshot, recording.truth(), marks
