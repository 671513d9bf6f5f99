"""Categories from a recorded program's phases (``vramlab record``'s ``vramlab_phases``:
where its forwards, backwards and optimizer steps began and ended, on the allocator's own
count of allocations; see ``client/vramlab/recorder_boot/phase_marks.py``).

Allocation number ``n`` of the device (the trace's allocations are numbered back from the
count read at the dump) was made in the phase the marks had reached by then: a mark taken
when ``c`` allocations had been made comes before allocation ``c + 1``. The phases are
PyTorch MemTracker's: made in a forward, or after it up to the backward (the loss), an
activation; in a forward recomputed inside a backward (checkpointing), an activation too;
in a backward or an optimizer step, a temporary; outside all of them, the program's own
(inputs, targets, what it does between a backward and the step: other). Parameters, gradients and
optimizer state come from the tensors the program recorded (``recorded``), and library
workspaces keep the evidence that names them.
"""

from bisect import bisect_left
from typing import Any, NamedTuple

from app.snapshots.load import Invalid
from vramlab.contract import Category

KEY = "vramlab_phases"
MAX_MARKS = 20_000_000
KINDS = frozenset(
    {"forward_start", "forward_end", "backward_start", "backward_end", "step_start", "step_end"}
)

OUTSIDE, FORWARD, RECOMPUTE, BACKWARD, STEP = range(5)
A, T, OTH = Category.ACTIVATIONS.value, Category.TEMPORARIES.value, Category.OTHER.value
PHASED = (A, T, OTH)
VERDICTS = {
    OUTSIDE: (OTH, "recorded: made outside any forward, backward or optimizer step"),
    FORWARD: (A, "recorded: made in a forward (a module's call up to the backward after it)"),
    RECOMPUTE: (A, "recorded: made in a forward recomputed inside a backward (checkpointing)"),
    BACKWARD: (T, "recorded: made in a backward"),
    STEP: (T, "recorded: made in an optimizer step (not its state)"),
}
RULES = {
    A: "recorded by vramlab record (phases): made in a forward, from a module's call up to the "
    "backward after it (the loss too), or in a forward recomputed inside a backward",
    T: "recorded by vramlab record (phases): made in a backward or an optimizer step (not its "
    "state); and library workspaces, by their evidence",
    OTH: "recorded by vramlab record (phases): made outside any forward, backward or optimizer "
    "step (inputs, targets; between a backward and the step, as gradient clipping)",
}


def _after(state: int, kind: str) -> int:
    """The phase after a mark of ``kind``."""
    if kind == "forward_start":
        return RECOMPUTE if state in (BACKWARD, RECOMPUTE) else FORWARD
    if kind == "forward_end":
        return BACKWARD if state == RECOMPUTE else state
    if kind == "backward_start":
        return BACKWARD
    if kind == "step_start":
        return STEP
    return OUTSIDE  # backward_end, step_end


class Bound(NamedTuple):
    """The phases tied to one trace: allocation ``j`` of the trace (from 0) is number
    ``base + j + 1`` of the device."""

    phases: "Phases"
    base: int

    def at(self, j: int) -> tuple[str, str] | None:
        """The category and reason of the trace's allocation ``j`` (None: not known)."""
        n = self.base + j + 1
        i = bisect_left(self.phases.counts, n) - 1
        if i < 0:
            if self.phases.truncated:
                return None  # the marks before it went
            return VERDICTS[OUTSIDE]
        return VERDICTS[self.phases.states[i]]


class Phases:
    """The marks as (count, phase after it), in order."""

    def __init__(self, raw: dict[str, Any], counts: list[int], states: list[int]) -> None:
        self.counts = counts
        self.states = states
        self.truncated = raw.get("truncated") is True
        errors = raw.get("errors")
        self.errors = errors if type(errors) is int else 0
        at_dump = raw.get("allocations_at_dump")
        self.at_dump = at_dump if type(at_dump) is int else None
        device = raw.get("device")
        self.device = device if type(device) is int else 0
        self.problem: str | None = None

    def bind(self, device: int, allocations: int) -> Bound | None:
        """Tied to a trace of ``device`` with ``allocations`` allocations; None (and
        ``problem`` says why) where the counts cannot be tied to it."""
        if self.problem is not None:
            return None
        if device != self.device:
            self.problem = f"the phases were recorded on device {self.device}"
        elif self.at_dump is None:
            self.problem = "no allocation count at the dump"
        elif self.at_dump < allocations or (self.counts and self.counts[-1] > self.at_dump):
            self.problem = "the allocation counts do not fit the trace (a counter reset?)"
        else:
            return Bound(self, self.at_dump - allocations)
        return None

    def summary(self, used: bool) -> dict[str, Any]:
        return {
            "marks": len(self.counts),
            "used": used,
            "problem": self.problem,
            "truncated": self.truncated,
            "hook_errors": self.errors,
        }


def read(data: dict[str, Any]) -> Phases | None:
    """The snapshot's recorded phases (None where it has none)."""
    raw = data.get(KEY)
    if raw is None:
        return None
    if type(raw) is not dict or type(raw.get("marks")) is not list:
        raise Invalid(f"'{KEY}' must be a dict with a list 'marks'")
    marks = raw["marks"]
    if len(marks) > MAX_MARKS:
        raise Invalid(f"'{KEY}' has more than {MAX_MARKS} marks")
    counts: list[int] = []
    states: list[int] = []
    state = OUTSIDE
    reset = False
    for mark in marks:
        if type(mark) is not list or len(mark) != 3:
            raise Invalid(f"a mark of '{KEY}' is not [kind, allocations, time]")
        kind, count, _ = mark
        if kind not in KINDS or type(count) is not int or count < 0:
            raise Invalid(f"a mark of '{KEY}' has a bad kind or allocation count")
        if counts and count < counts[-1]:
            reset = True
        state = _after(state, kind)
        counts.append(count)
        states.append(state)
    phases = Phases(raw, counts, states)
    if reset:
        phases.problem = "the allocation counts go back (a counter reset?)"
        phases.counts, phases.states = [], []
        phases.at_dump = None
    return phases
