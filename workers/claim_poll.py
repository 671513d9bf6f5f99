"""A claim call in a thread of its own, which the loop can stop waiting for when a
signal comes; an answer that still comes is given back."""

import threading
from collections.abc import Callable
from typing import Any


class ClaimPoll:
    """One claim call in a thread of its own, so that the loop can stop waiting for it.

    A signal only sets ``stopping``: the loop, which looks at it while it waits, leaves
    the call behind. An answer that still comes (an experiment claimed after the
    signal) is given back by ``late``, in the call's thread.
    """

    def __init__(
        self,
        call: Callable[[], list[dict[str, Any]]],
        late: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        self.call, self.late = call, late
        self.done = threading.Event()
        self.result: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # handed to the loop, which raises it
            self.error = exc
        with self._lock:
            self.done.set()
            abandoned = self._abandoned
        if abandoned and self.result:
            self.late(self.result)

    def abandon(self) -> bool:
        """Leave the call behind; False if it had already answered."""
        with self._lock:
            if self.done.is_set():
                return False
            self._abandoned = True
            return True
