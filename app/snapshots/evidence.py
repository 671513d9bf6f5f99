"""The time order of a snapshot's entries, as evidence for categories: which of the main
thread's calls (a backward, an optimizer step) was running at each entry.

Only entries with frames of their own move the clock: an allocation's, or a free's recorded
at its own call site (PyTorch's ``context="all"``). Entries with no frames leave it where
it is, which is what places autograd's thread: with Python frames alone it records none,
and it runs while the main thread waits inside ``Tensor.backward`` (seen where it starts,
``_make_grads``, and where it returns, the free of its seed gradient). The few Python
frames that thread does record (a checkpointed forward recomputed, an
``autograd.Function``'s ``backward``) leave the clock inside the backward, and mark a
forward's allocations there as recomputed.
"""

from app.snapshots import categories as cat


class Timeline:
    """The clock of the main thread's calls, moved entry by entry."""

    __slots__ = (
        "backward_end",
        "backward_start",
        "forward",
        "in_backward",
        "in_step",
        "step_end",
        "step_start",
    )

    def __init__(self) -> None:
        self.backward_start = self.backward_end = -1
        self.step_start = self.step_end = -1
        self.forward = -1
        self.in_backward = self.in_step = False

    def see(
        self, seq: int, where: int, zero_grad: bool, alloc: bool, in_backward: bool = False
    ) -> None:
        """An entry at ``seq`` whose own frames have site ``where``; ``in_backward``: frames
        autograd's thread records itself (``categories.runs_in_backward``)."""
        if where == cat.EMPTY or where == cat.WORKSPACE:
            return  # says nothing of the main thread
        if in_backward and self.in_backward and where != cat.OPTIMIZER:
            return  # autograd's thread, while the main thread waits in backward
        if where == cat.BACKWARD:
            if not self.in_backward:
                self.in_backward, self.backward_start = True, seq
            self._end_step(seq)
            return
        if self.in_backward:
            self.in_backward, self.backward_end = False, seq
        if where == cat.OPTIMIZER and not zero_grad:
            if not self.in_step:
                self.in_step, self.step_start = True, seq
            return
        self._end_step(seq)
        if where == cat.FORWARD and alloc:
            self.forward = seq

    def _end_step(self, seq: int) -> None:
        if self.in_step:
            self.in_step, self.step_end = False, seq

    def where(self, site: int) -> int:
        """An allocation's site, with what the time says of one that has no frames, and of
        a forward's inside a backward (only autograd's thread records one there: a
        checkpointed forward recomputed)."""
        if self.in_backward:
            if site == cat.EMPTY:
                return cat.AUTOGRAD
            if site == cat.FORWARD:
                return cat.RECOMPUTE
        return site

    def now(self) -> cat.Clock:
        return cat.Clock(
            self.backward_start,
            self.backward_end,
            self.step_start,
            self.step_end,
            self.forward,
            self.in_backward,
            self.in_step,
        )
