"""What held memory at a step's peak, by category: a tally of every tensor storage's life.

A ``Tally`` is a dispatch mode: each op's outputs are seen as they are made, and each
storage's end is seen through a weak reference, so the tally knows the live bytes after
every op, the moment of the peak, and which storages were alive then. It is O(1) per op
(the categories are worked out once, after the step), and it runs the same on real
tensors (the worker's measured step) and on fake ones (the predictor, no device at all).

Categories follow PyTorch's memory profiler: a storage is a parameter, gradient or
optimizer state by identity (the storages those objects hold after the step); what the
forward made is an activation (saved for backward, the KV cache, the output); what the
backward and the optimizer made besides is a temporary. Memory that no op output holds
(library workspaces, kernels' internal buffers) is not seen here: the caller adds it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from vramlab.contract import Category

BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of this

# A phase's start ends once it has ended more than this fraction (1/64) of what was live
# when it began (a backward's first frees are the loss's few saved tensors).
START_GIVEN = 64
FORWARD, BACKWARD, OPTIMIZER, OTHER = "forward", "backward", "optimizer", "other"
# The phases whose outputs are activations: a forward, a generation's prefill and decode
# (there the KV cache is the activations that stay).
_MAKES_ACTIVATIONS = (FORWARD, "prefill", "decode")


@dataclass
class _Life:
    size: int
    phase: str
    born: int
    died: int | None = None
    category: str | None = None  # known when it is born (FSDP's gathered parameters)


@dataclass
class Peak:
    """A step's peak: the bytes then, and what held them."""

    bytes: int
    categories: dict[str, int]
    phase: str  # the phase in which the peak came
    # Each phase's own peak by category (filled by steps.tally_step).
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    # A recorded tally's record, and the storages' categories by their names in it.
    record: Record | None = None
    identities: dict[int, str] = field(default_factory=dict)


def rounded(nbytes: int, block: int) -> int:
    return -(-nbytes // block) * block if block > 1 else nbytes


class PhasedMode(TorchDispatchMode):
    """A dispatch mode that knows which phase of the step is running (``during``)."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = OTHER

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


class Tally(PhasedMode):
    """Count live storages while a step runs. ``block``: the allocator's rounding (512 on
    CUDA, 1 on the CPU)."""

    def __init__(self, block: int = 1, recorded: bool = False) -> None:
        super().__init__()
        self.block = block
        # With ``recorded``, what the tally saw, in order (``Record``): the step's births
        # (their sizes apart), ends, peak checks and phases, to be replayed at other sizes.
        self.record: Record | None = Record() if recorded else None
        self._lives: dict[int, _Life] = {}  # the live storages, by identity
        self._ended: list[_Life] = []
        self._keep: list[Any] = []  # the weak references, alive until the tally is
        self._watched: set[int] = set()  # the storages a weak reference watches
        self.live = 0
        self.peak = 0
        self.peak_seq = 0
        self.peak_phase = OTHER
        self.seq = 0
        self.phase_peaks: dict[str, tuple[int, int]] = {}  # each phase's own (bytes, seq)
        # Each phase's own peak over its start: from its first op while what was made
        # before it is still nearly all alive (less than 1/START_GIVEN of the bytes live
        # at its entry ended; the largest over its runs). A backward's start holds every
        # saved activation, a moment that grows with the model's depth as much as any.
        self.phase_starts: dict[str, tuple[int, int]] = {}
        self._starting = False
        self._entered_at = 0
        self._given = 0  # bytes made before the phase and ended in it
        self._given_limit = 0

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        if self.record is not None:
            self.record.steps.append((ENTER, 0, phase))
        self._starting, self._entered_at = True, self.seq
        self._given, self._given_limit = 0, self.live // START_GIVEN
        try:
            with super().during(phase):
                yield
        finally:
            self._starting = False
            if self.record is not None:
                self.record.steps.append((LEAVE, 0, ""))

    # -- what the step does --------------------------------------------------------------

    def adopt(self, tensors: Iterable[torch.Tensor], phase: str = OTHER) -> None:
        """Count storages that exist before the tally starts (parameters, inputs, state)."""
        for t in tensors:
            self._see(t, phase)
        self._maybe_peak()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._see(leaf, self.phase)
        self._maybe_peak()
        return out

    def derive(self, t: torch.Tensor, recipe: tuple[Any, ...], *counts: int) -> None:
        """``t``'s bytes follow from ``counts`` by ``recipe`` (a kernel's own buffer whose
        size is not linear in them, workers/models/kernel_scratch.py): a replay at another
        batch size works them out again instead of putting them on a line."""
        key = _key(t)
        if self.record is not None and key is not None:
            self.record.derive(key, recipe, counts)

    def resized(self, t: torch.Tensor, category: str | None = None) -> None:
        """A storage given back or taken again in place (``resize_``, as FSDP frees and
        re-gathers its unsharded parameters): its old life ends, a new one of its new size
        starts (``category``: what it holds)."""
        if self.record is not None:  # a storage that changes size is not replayed
            self.record.replayable = False
        storage = _local(t).untyped_storage()
        key = storage._cdata
        self._end(key)
        size = rounded(storage.nbytes(), self.block)
        if size:
            self.seq += 1
            self._lives[key] = _Life(size, self.phase, self.seq, category=category)
            self.live += size
            self._watch(storage, key)
        self._maybe_peak()

    # -- after the step ------------------------------------------------------------------

    def categorize(
        self,
        parameters: Iterable[torch.Tensor],
        gradients: Iterable[torch.Tensor],
        optimizer_state: Iterable[torch.Tensor],
        phase: str | None = None,
        start: bool = False,
    ) -> Peak:
        """What was alive at the peak (or at ``phase``'s own peak, or with ``start`` at its
        start), by category (identities read after the step)."""
        return self.categorize_by(identities(parameters, gradients, optimizer_state), phase, start)

    def categorize_by(
        self, by_identity: dict[int, str], phase: str | None = None, start: bool = False
    ) -> Peak:
        """``categorize`` with the storages' categories given by identity."""
        totals = {str(c): 0 for c in Category if c != Category.UNKNOWN}
        if phase is None:
            peak, at_peak = self.peak, self.peak_seq
        else:
            peak, at_peak = (self.phase_starts if start else self.phase_peaks)[phase]
        for key, life in self._lives.items():
            if life.born <= at_peak:
                totals[self._category(by_identity.get(key), life)] += life.size
        for life in self._ended:
            if life.born <= at_peak < (life.died or 0):
                totals[self._category(None, life)] += life.size
        return Peak(peak, totals, phase or self.peak_phase)

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _category(identity: str | None, life: _Life) -> str:
        if identity is not None:
            return identity
        if life.category is not None:
            return life.category
        if life.phase in _MAKES_ACTIVATIONS:
            return str(Category.ACTIVATIONS)
        if life.phase in (BACKWARD, OPTIMIZER):
            return str(Category.TEMPORARIES)
        return str(Category.OTHER)

    def _see(self, t: torch.Tensor, phase: str) -> None:
        t = _local(t)
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            return
        key = storage._cdata
        if key in self._lives:
            return
        self._born(key, storage.nbytes(), phase)
        self._watch(storage, key)

    def _born(self, key: int, nbytes: int, phase: str) -> None:
        if self.record is not None:
            self.record.born(key, nbytes, phase)
        size = rounded(nbytes, self.block)
        self.seq += 1
        self._lives[key] = _Life(size, phase, self.seq)
        self.live += size

    def _watch(self, storage: Any, key: int) -> None:
        if key not in self._watched:
            self._watched.add(key)
            self._keep.append(weakref.ref(storage, self._ender(key)))

    def _ender(self, key: int) -> Any:
        def end(_: object) -> None:
            self._watched.discard(key)  # the address may be another storage's next
            self._end(key)

        return end

    def _end(self, key: int) -> None:
        """The life of the storage at ``key`` ends here (if it is live)."""
        life = self._lives.pop(key, None)
        if life is not None:
            if self.record is not None:
                self.record.ended(key)
            if life.born <= self._entered_at:  # made before this phase
                self._given += life.size
                if self._given > self._given_limit:  # its start is over
                    self._starting = False
            self.seq += 1
            life.died = self.seq
            self._ended.append(life)
            self.live -= life.size

    def _maybe_peak(self) -> None:
        if self.record is not None:
            self.record.steps.append((PEAK, 0, ""))
        if self._starting and self.live > self.phase_starts.get(self.phase, (-1, 0))[0]:
            self.phase_starts[self.phase] = (self.live, self.seq)
        if self.live > self.phase_peaks.get(self.phase, (-1, 0))[0]:
            self.phase_peaks[self.phase] = (self.live, self.seq)
            if self.live > self.peak:
                self.peak, self.peak_seq, self.peak_phase = self.live, self.seq, self.phase


def identities(
    parameters: Iterable[torch.Tensor],
    gradients: Iterable[torch.Tensor],
    optimizer_state: Iterable[torch.Tensor],
) -> dict[int, str]:
    """The category of each storage these hold, by its identity (a storage in several
    is the first category's: optimizer state, gradients, parameters)."""
    by_identity: dict[int, str] = {}
    for category, tensors in (
        (Category.OPTIMIZER_STATE, optimizer_state),
        (Category.GRADIENTS, gradients),
        (Category.PARAMETERS, parameters),
    ):
        for t in tensors:
            key = _key(t)
            if key is not None:
                by_identity[key] = str(category)
    return by_identity


# What a recorded tally saw, step by step: (what, which storage, its phase).
BORN, END, PEAK, ENTER, LEAVE = range(5)


@dataclass
class Record:
    """A tally's steps, replayable (``replayed``) with each birth's size given anew: a
    storage is named by the order of its birth (its address is another run's next), and
    the sizes, in birth order, are kept apart from the steps."""

    steps: list[tuple[int, int, str]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    replayable: bool = True
    # Births whose sizes follow from counts by a recipe: (name, recipe, the counts' indices
    # in ``sizes``). Their own entries in ``sizes`` are 0 (not put on a line).
    derived: list[tuple[int, tuple[Any, ...], tuple[int, ...]]] = field(default_factory=list)
    _names: dict[int, int] = field(default_factory=dict)  # live address -> name

    def born(self, key: int, nbytes: int, phase: str) -> None:
        name = len(self.sizes)
        self._names[key] = name
        self.sizes.append(nbytes)
        self.steps.append((BORN, name, phase))

    def ended(self, key: int) -> None:
        self.steps.append((END, self._names.pop(key), ""))

    def derive(self, key: int, recipe: tuple[Any, ...], counts: tuple[int, ...]) -> None:
        name = self._names.get(key)
        if name is None:
            return
        self.sizes[name] = 0
        start = len(self.sizes)
        self.sizes.extend(counts)  # counts, not births: no step names them
        self.derived.append((name, recipe, tuple(range(start, start + len(counts)))))

    def named(self, by_identity: dict[int, str]) -> dict[int, str]:
        """``by_identity``'s live storages by their names in this record."""
        return {self._names[k]: c for k, c in by_identity.items() if k in self._names}


def replayed(steps: list[tuple[int, int, str]], sizes: list[int], block: int) -> Tally:
    """A tally that saw ``steps`` with these births' sizes (storages named as recorded)."""
    tally = Tally(block)
    phases: list[Any] = []
    for what, name, phase in steps:
        if what == BORN:
            tally._born(name, sizes[name], phase)
        elif what == END:
            tally._end(name)
        elif what == PEAK:
            tally._maybe_peak()
        elif what == ENTER:
            phases.append(tally.during(phase))
            phases[-1].__enter__()
        else:
            phases.pop().__exit__(None, None, None)
    return tally


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a sharded parameter holds only that on this rank)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _key(t: torch.Tensor) -> int | None:
    try:
        return int(_local(t).untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return None
