"""The planner's ledger: the named tensors, their storages, and the bytes held per device.

Kept up to date as names are bound and dropped, so each step costs what it touches, not
every name; it records the peaks (inside a step included) and charges the work done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.catalog.model import CatalogError, TensorSpec
from app.catalog.rounding import rounded_block_bytes
from app.catalog.scenario.bounds import MAX_TENSOR_STEPS


@dataclass
class Storage:
    key: int
    device: str
    block: int  # its bytes as the allocator rounds them on its device


@dataclass
class Tensor:
    spec: TensorSpec
    storage: Storage  # shared with its views and with names bound to it


@dataclass(frozen=True)
class Many:
    """A list of alike tensors from one create with a count (or what delete left of it).
    Each has its own storage and no other name can hold one (steps take single tensors),
    so they are counted rather than kept one by one: a step on a list costs one unit."""

    spec: TensorSpec
    block: int
    count: int


Value = Tensor | Many


def size(value: Value | None) -> int:
    return 0 if value is None else 1 if isinstance(value, Tensor) else value.count


@dataclass
class Ledger:
    """The named tensors, and the bytes their storages hold per device, kept up to date
    as names are bound and dropped: each step costs what it touches, not every name."""

    dtype: str
    device: str
    names: dict[str, Value] = field(default_factory=dict)
    next_key: int = 0
    executed: int = 0  # steps the worker will run
    planned: int = 0  # steps planned one by one (the rest were counted: see plan.py)
    work: int = 0  # tensor-steps: steps run plus tensors bound or dropped
    peak: int = 0  # the most held at once on the scenario's device, inside steps included
    peak_all: int = 0  # the most held at once on every device together
    refs: dict[int, int] = field(default_factory=dict)  # storage key -> names holding it
    held: dict[str, int] = field(default_factory=dict)  # device -> bytes of live storages

    def new(self, shape: tuple[int, ...], dtype: str, device: str) -> Tensor:
        spec = TensorSpec("t", shape, dtype, device)
        return self.tensor(spec)

    def tensor(self, spec: TensorSpec) -> Tensor:
        self.next_key += 1
        block = rounded_block_bytes(spec.nbytes, "cuda" if spec.device != "cpu" else "cpu")
        return Tensor(spec, Storage(self.next_key, spec.device, block))

    def charge(self, units: int, where: str) -> None:
        self.work += units
        if self.work > MAX_TENSOR_STEPS:
            raise CatalogError(
                "steps",
                f"the scenario does too much: over {MAX_TENSOR_STEPS:,} tensor-steps by {where} "
                f"(each step run counts 1, and each tensor it makes, binds to a name or frees "
                f"counts 1); use fewer or shorter lists, or fewer repeats",
            )

    def bind(self, name: str, value: Value, where: str) -> None:
        """Bind ``name`` to a new value. It exists before the old one goes (``x = exp(x)``
        holds both for a moment), so the peak is taken in between."""
        old = self.names.get(name)
        self.charge(size(value) + size(old), where)
        self._hold(value, 1)
        self.names[name] = value
        self.mark()
        if old is not None:
            self._hold(old, -1)

    def drop(self, name: str, where: str) -> None:
        old = self.names.pop(name, None)
        self.charge(size(old), where)
        if old is not None:
            self._hold(old, -1)

    def live(self, device: str) -> int:
        return self.held.get(device, 0)

    def signature(self, names: frozenset[str]) -> tuple[Any, ...]:
        """What the next iteration of a repeat block that binds ``names`` depends on: the
        bytes held, and those names' tensors with how their storages are shared."""
        keys: dict[int, int] = {}
        out: list[Any] = [tuple(sorted(self.held.items()))]
        for name in sorted(names):
            value = self.names.get(name)
            if value is None or isinstance(value, Many):
                out.append(value)
                continue
            key = value.storage.key
            index = keys.setdefault(key, len(keys))
            out.append((value.spec, value.storage.block, index, self.refs[key]))
        return tuple(out)

    def mark(self) -> None:
        self.peak = max(self.peak, self.held.get(self.device, 0))
        self.peak_all = max(self.peak_all, sum(self.held.values()))

    def _hold(self, value: Value, sign: int) -> None:
        if isinstance(value, Many):
            device = value.spec.device
            self.held[device] = self.held.get(device, 0) + sign * value.count * value.block
            return
        s = value.storage
        n = self.refs.get(s.key, 0) + sign
        if n:
            self.refs[s.key] = n
        else:
            del self.refs[s.key]
        if n == 0 or (n == 1 and sign > 0):
            self.held[s.device] = self.held.get(s.device, 0) + sign * s.block
