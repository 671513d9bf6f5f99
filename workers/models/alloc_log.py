"""The order in which a step asks the CUDA caching allocator for memory and gives it back,
recorded on fake tensors, for the allocator model (workers/models/caching_allocator.py).

An ``AllocationLog`` is a dispatch mode like the category tally (workers/models/tally.py):
each op's new storages are allocations, in the order the op returns them, and each
storage's end (a weak reference) is a free. What no op returns is added where CUDA
makes it: cuBLAS's workspace (one per thread that runs matmuls, allocated at its first
matmul and kept). Each event also carries the phase and, for a model made of a stack of
identical blocks, the block it happened in, so that a log traced at a shallow depth can
be extended to the model's full depth (``deepen``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from workers.models.tally import PhasedMode

# ATen ops that call cuBLAS (the first one on a thread makes that thread's workspace).
CUBLAS_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "addmv",
        "mv",
        "dot",
        "vdot",
        "addr",
        "_addmm_activation",
        "_scaled_mm",
    }
)
# Phases run by autograd's own thread on CUDA (its own cuBLAS handle and workspace).
AUTOGRAD_PHASES = frozenset({"backward"})

Window = tuple[int, int] | None  # (stack, block) the event happened in, or None
TIMED = frozenset({"forward", "backward"})  # phases whose blocks are told by hooks


@dataclass(frozen=True)
class Event:
    key: int  # one allocation's identity (its alloc and its free share it)
    nbytes: int  # the request; -1 for a free
    phase: str
    window: Window


class AllocationLog(PhasedMode):
    """Record every storage's birth and end while ops run. ``workspace``: cuBLAS's
    workspace bytes per thread (0: none, as on the CPU)."""

    def __init__(self, workspace: int = 0) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.window: Window = None
        self.workspace = workspace
        self._lives: dict[int, tuple[int, Window]] = {}  # storage identity -> key, window
        self._keep: list[Any] = []
        self._threads: set[str] = set()
        self._next = 0
        self._closed = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.phase in TIMED or not args:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self._see(leaf, self.window)
        elif isinstance(out, list | tuple) and isinstance(args[0], list | tuple):
            # A foreach op: its i-th output belongs with its i-th input's block.
            for i, leaf in enumerate(out):
                if isinstance(leaf, torch.Tensor):
                    source = args[0][i] if i < len(args[0]) else None
                    self._see(leaf, self._window_of(source))
        else:
            window = self._window_of(next(iter(_tensors(args)), None))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self._see(leaf, window)
        if self.workspace and func.__name__.split(".")[0] in CUBLAS_OPS:
            thread = "autograd" if self.phase in AUTOGRAD_PHASES else "main"
            if thread not in self._threads:
                self._threads.add(thread)
                self._next += 1
                self.events.append(Event(-self._next, self.workspace, self.phase, self.window))
        return out

    def close(self) -> None:
        """Record nothing more (frees included)."""
        self._closed = True

    def _see(self, t: torch.Tensor, window: Window) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # storage-less tensors
            return
        ident = storage._cdata
        if ident in self._lives or self._closed:
            return
        self._next += 1
        key = self._next
        self._lives[ident] = (key, window)
        self.events.append(Event(key, storage.nbytes(), self.phase, window))
        self._keep.append(weakref.ref(storage, self._ender(ident, key)))

    def _ender(self, ident: int, key: int) -> Any:
        def end(_: object) -> None:
            if self._closed:
                return
            life = self._lives.get(ident)
            if life is not None and life[0] == key:
                del self._lives[ident]
                # In the forward and backward an event is where it happens; elsewhere
                # (the optimizer, zeroing gradients) it goes with what it frees.
                window = self.window if self.phase in TIMED else life[1]
                self.events.append(Event(key, -1, self.phase, window))

        return end

    def _window_of(self, t: Any) -> Window:
        if not isinstance(t, torch.Tensor):
            return self.window
        try:
            life = self._lives.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return self.window
        return life[1] if life is not None else self.window

    def own(self, tensors: Sequence[torch.Tensor], window: Window) -> None:
        """Give these storages (built before the log knew their block) to ``window``."""
        keys = set()
        for t in tensors:
            try:
                ident = t.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):
                continue
            life = self._lives.get(ident)
            if life is not None:
                self._lives[ident] = (life[0], window)
                keys.add(life[0])
        self.events = [
            Event(e.key, e.nbytes, e.phase, window) if e.key in keys else e for e in self.events
        ]

    def keys_of(self, tensors: Sequence[torch.Tensor]) -> set[int]:
        """The keys of these tensors' storages (alive now)."""
        out = set()
        for t in tensors:
            try:
                life = self._lives.get(t.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                continue
            if life is not None:
                out.add(life[0])
        return out


def blocks_of(model: torch.nn.Module, count: int) -> list[torch.nn.ModuleList]:
    """The model's stacks of ``count`` repeated blocks (a ModuleList of that length whose
    blocks are all of one class), outermost first."""
    stacks = []
    for module in model.modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) == count
            and len({type(m) for m in module}) == 1
        ):
            stacks.append(module)
    return stacks


def mark_windows(log: AllocationLog, stacks: Sequence[torch.nn.ModuleList]) -> list[Any]:
    """Tag the log's events with the block they happen in. In the forward a block's
    window runs from its start to the next block's (the frees its caller makes after it
    returns belong to it); in the backward, from the gradient of its output to the
    gradient of its input. Recomputation (checkpointing) stays in the backward's window.
    Returns the hook handles."""
    handles: list[Any] = []

    def grad_hook(window: Window) -> Any:
        def hook(grad: torch.Tensor) -> None:
            log.window = window

        return hook

    for s, stack in enumerate(stacks):
        last = len(stack) - 1
        for b, block in enumerate(stack):

            def pre(module: Any, args: Any, kwargs: Any, s: int = s, b: int = b) -> None:
                if log.phase == "backward":
                    return
                log.window = (s, b)
                first = _first_tensor((args, kwargs))
                if first is not None and first.requires_grad and torch.is_grad_enabled():
                    first.register_hook(grad_hook((s, b - 1) if b > 0 else None))

            def post(
                module: Any,
                args: Any,
                kwargs: Any,
                out: Any,
                s: int = s,
                b: int = b,
                last: int = last,
            ) -> None:
                if log.phase == "backward":
                    return
                first = _first_tensor(out)
                if first is not None and first.requires_grad and torch.is_grad_enabled():
                    first.register_hook(grad_hook((s, b)))
                if b == last:
                    log.window = None

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(block.register_forward_hook(post, with_kwargs=True))
    return handles


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    return (leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor))


def _first_tensor(value: Any) -> torch.Tensor | None:
    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    return None


class NotRegular(Exception):
    """The shallow log's blocks do not repeat cleanly: trace the model whole instead."""


TRACED_DEPTH = 3  # blocks in the shallow trace: a first, a middle and a last


def deepen(events: Sequence[Event], depth: int) -> list[tuple[int, int]]:
    """The log of a model ``depth`` blocks deep, from ``events`` traced at 3 blocks per
    stack. Every run of the middle block's events is repeated for blocks 1 to depth-2,
    in the direction its sweep goes (up in the forward, down in the backward), and each
    free is pointed at the same allocation of the block it refers to. A free outside
    every block's window goes with what it frees (the autocast cache emptied at the end
    of the forward frees a tensor of each block). Returns ``(key, nbytes)`` pairs
    (nbytes -1: a free); NotRegular where the blocks do not allocate alike."""
    if depth < TRACED_DEPTH:
        raise NotRegular(f"{depth} blocks is shallower than the trace")
    owner = {e.key: e.window for e in events if e.nbytes >= 0}
    events = [
        Event(e.key, -1, e.phase, owner[e.key])
        if e.nbytes < 0 and e.window is None and owner.get(e.key) is not None
        else e
        for e in events
    ]
    runs = _runs(events)
    sweeps = _sweeps(runs)
    if not sweeps:
        raise NotRegular("no stack of blocks was seen")
    # Each allocation of a block: (sweep, block in the trace, ordinal in its run).
    place: dict[int, tuple[int, int, int]] = {}
    ordinals: dict[tuple[int, int], list[int]] = {}  # (sweep, block) -> allocations' keys
    for sweep, members in enumerate(sweeps):
        sizes = []
        for block, r in enumerate(members):
            allocs = [e for e in runs[r][1] if e.nbytes >= 0 and e.key >= 0]
            ordinals[(sweep, block)] = [e.key for e in allocs]
            sizes.append([e.nbytes for e in allocs])
            for j, e in enumerate(allocs):
                place[e.key] = (sweep, block, j)
        if not sizes[0] == sizes[1] == sizes[2]:
            raise NotRegular("the first, middle and last blocks allocate differently")
    stride = max((abs(e.key) for e in events), default=0) + 1
    in_sweep = {
        r: (sweep, block) for sweep, members in enumerate(sweeps) for block, r in enumerate(members)
    }

    def key_at(key: int, at: int) -> int:
        """The allocation ``key`` stands for in block ``at`` of the deep model."""
        sweep, _, j = place[key]
        block = 0 if at == 0 else 2 if at == depth - 1 else 1
        original = ordinals[(sweep, block)][j]
        return original if block != 1 or at == 1 else original + at * stride

    out: list[tuple[int, int]] = []

    def emit(run: list[Event], block: int | None, here: int) -> None:
        """A run of the trace's ``block`` (None: outside the blocks) as block ``here``."""
        copy = block == 1 and here != 1  # the middle block's run again, for another block
        for e in run:
            if e.nbytes >= 0:
                if not copy:
                    out.append((e.key, e.nbytes))
                elif e.key >= 0:  # (a cuBLAS workspace is made once)
                    out.append((e.key + here * stride, e.nbytes))
                continue
            target = place.get(e.key)
            if target is None:  # frees what no block made: once
                if not copy:
                    out.append((e.key, -1))
                continue
            if block is None:
                raise NotRegular("a free outside the blocks refers to a block")
            at = here + target[1] - block
            if not 0 <= at < depth:
                raise NotRegular("a free refers past the stack")
            out.append((key_at(e.key, at), -1))

    last: tuple[int, int] | None = None  # (block in the trace, block here) last emitted
    for r, (window, run) in enumerate(runs):
        if window is None:
            emit(run, None, 0)
            continue
        block = window[1]
        if r in in_sweep:
            sweep, _ = in_sweep[r]
            if block == 1:
                members = sweeps[sweep]
                copies = list(range(1, depth - 1))
                for here in copies if members[0] < members[2] else reversed(copies):
                    emit(run, 1, here)
                    last = (1, here)
                continue
        elif block == 1:
            # The middle block's frees on their own, after the sweep: they belong to the
            # block next to the last one seen.
            if last is None or any(e.nbytes >= 0 for e in run):
                raise NotRegular("a middle block's events outside a sweep of its stack")
            here = last[1] + 1 - last[0]
            if not 1 <= here <= depth - 2:
                raise NotRegular("a middle block's frees far from the sweep")
            emit(run, 1, here)
            continue
        here = 0 if block == 0 else depth - 1
        emit(run, block, here)
        last = (block, here)
    return out


def _runs(events: Sequence[Event]) -> list[tuple[Window, list[Event]]]:
    runs: list[tuple[Window, list[Event]]] = []
    for e in events:
        if runs and runs[-1][0] == e.window and runs[-1][1][-1].phase == e.phase:
            runs[-1][1].append(e)
        else:
            runs.append((e.window, [e]))
    return runs


def _sweeps(runs: list[tuple[Window, list[Event]]]) -> list[tuple[int, int, int]]:
    """Runs of blocks 0, 1 and 2 of one stack, one after another (either way round), as
    (run of block 0, of block 1, of block 2)."""
    sweeps = []
    for r in range(len(runs) - 2):
        first, middle, last = (runs[r + i][0] for i in range(3))
        if first is None or middle is None or last is None:
            continue
        if not first[0] == middle[0] == last[0]:
            continue
        blocks = [first[1], middle[1], last[1]]
        if blocks == [0, 1, 2]:
            sweeps.append((r, r + 1, r + 2))
        elif blocks == [2, 1, 0]:
            sweeps.append((r + 2, r + 1, r))
    return sweeps
