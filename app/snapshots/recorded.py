"""Categories recorded from inside the program (``vramlab record``'s ``vramlab_categories``:
where its parameters, gradients and optimizer state lived, by tensor identity), matched
to the snapshot's blocks: a sighting belongs to the block at its address whose lifetime
holds the time it was seen. The import prefers these to inference for the blocks they
cover; see ``client/vramlab/recorder_boot/tensor_marks.py`` for how they are taken."""

from typing import Any, NamedTuple

from app.snapshots.load import Invalid
from vramlab.contract import Category

KEY = "vramlab_categories"
RECORDED = (
    Category.PARAMETERS.value,
    Category.GRADIENTS.value,
    Category.OPTIMIZER_STATE.value,
)
MAX_TENSORS = 20_000_000

REASONS = {
    Category.PARAMETERS.value: "recorded: a module's parameter or buffer (or an optimizer's "
    "parameter) lived in this block",
    Category.GRADIENTS.value: "recorded: a parameter's .grad lived in this block",
    Category.OPTIMIZER_STATE.value: "recorded: an optimizer's state lived in this block",
}
RULES = {
    Category.PARAMETERS.value: "recorded by vramlab record (tensor identity): the blocks that "
    "held a module's parameters and buffers, or an optimizer's parameters",
    Category.GRADIENTS.value: "recorded by vramlab record (tensor identity): the blocks that "
    "held a parameter's .grad",
    Category.OPTIMIZER_STATE.value: "recorded by vramlab record (tensor identity): the blocks "
    "that held an optimizer's state",
}


class Sighting(NamedTuple):
    size: int
    category: str
    first: float  # microseconds since the trace's first entry
    last: float


class Recorded:
    """The sightings by address, on the trace's clock (None: match by address alone)."""

    def __init__(
        self, by_addr: dict[int, list[Sighting]], timed: bool, tensors: int, raw: dict[str, Any]
    ) -> None:
        self.by_addr = by_addr
        self.timed = timed
        self.tensors = tensors
        # The oldest sightings went (a long run); the hooks' own errors, counted.
        self.truncated = raw.get("truncated") is True
        errors = raw.get("errors")
        self.errors = errors if type(errors) is int else 0

    def summary(self) -> dict[str, Any]:
        return {
            "tensors": self.tensors,
            "matched_by_time": self.timed,
            "truncated": self.truncated,
            "hook_errors": self.errors,
        }

    def category(self, addr: Any, size: int, born: float | None, died: float | None) -> str | None:
        """The recorded category of the block at ``addr`` of ``size`` bytes alive from
        ``born`` to ``died`` (trace microseconds; None: before the trace / after its end)."""
        if type(addr) is not int:
            return None
        for s in self.by_addr.get(addr, ()):
            if s.size > size:
                continue  # a larger tensor was never in this block
            if self.timed and (
                (born is not None and s.last < born) or (died is not None and s.first > died)
            ):
                continue
            return s.category
        return None


def read(data: dict[str, Any], t0: float | None) -> Recorded | None:
    """The snapshot's recorded categories (None where it has none); ``t0``: the first
    entry's ``time_us`` (None: the trace has no times, so match by address alone)."""
    raw = data.get(KEY)
    if raw is None:
        return None
    if type(raw) is not dict or type(raw.get("tensors")) is not list:
        raise Invalid(f"'{KEY}' must be a dict with a list 'tensors'")
    tensors = raw["tensors"]
    if len(tensors) > MAX_TENSORS:
        raise Invalid(f"'{KEY}' has more than {MAX_TENSORS} tensors")
    timed = t0 is not None and raw.get("clock") == "unix_us"
    by_addr: dict[int, list[Sighting]] = {}
    for row in tensors:
        if type(row) is not list or len(row) != 5:
            raise Invalid(f"a row of '{KEY}' is not [address, bytes, category, first, last]")
        addr, size, category, first, last = row
        if type(addr) is not int or type(size) is not int or category not in RECORDED:
            raise Invalid(f"a row of '{KEY}' has a bad address, size or category")
        if type(first) not in (int, float) or type(last) not in (int, float):
            raise Invalid(f"a row of '{KEY}' has a time that is not a number")
        shift = t0 if timed and t0 is not None else 0.0
        by_addr.setdefault(addr, []).append(
            Sighting(size, category, float(first) - shift, float(last) - shift)
        )
    return Recorded(by_addr, timed, len(tensors), raw)
