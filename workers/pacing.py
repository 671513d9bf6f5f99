"""How a crew's loops share their calls to the API when experiments come as a stream of
tiny ones: claims take turns, and outcomes ready at about the same time go in one report.

Under a stream of single submits each experiment arrives alone, so each loop's waiting
claim would take one, and each loop would report it alone: a claim and a report for every
experiment, which is most of the API's time for a tiny one. Two rules cut that, neither of
which makes a lone experiment wait:

- ``ClaimTurns``: the loops whose experiments are short take turns to claim, one claim
  at a time, and after a claim that emptied the queue (it took fewer than it asked for) the
  next waits until ``gap_s`` after it, so that what arrives meanwhile goes in one claim. A
  claim after a quiet spell, or after one that took all it asked for, goes at once.
- ``ReportGroup``: a loop's report waits for the one being sent, and goes at most every
  ``gap_s``, with every other loop's outcome ready by then, in one request (as many as the
  API's limits allow). A report after a quiet spell goes at once.

Each loop still waits until its own outcomes are stored, as it would alone, so leases,
heartbeats and what a signal does are unchanged.
"""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vramlab.contract import MAX_REPORT_BATCH
from workers.leases import Lease
from workers.outcome import REPORT_OVERHEAD_BYTES

# The default least time between a crew's claims after one that emptied the queue, and
# between its reports (vramlab worker --pace-ms).
PACE_S = 0.02
# Loops whose experiments take longer than this claim on their own, as before: their
# claims are rare, and a turn would hold a lone experiment back.
PACE_BELOW_S = 0.05
# How often a wait looks at whether the loop is stopping.
STOP_POLL_S = 0.1

Pending = list[tuple[Lease, dict[str, Any]]]


class ClaimTurns:
    """Claims of short experiments, one at a time, paced after a claim that emptied the
    queue."""

    def __init__(self, gap_s: float = PACE_S) -> None:
        self.gap_s = gap_s
        self._lock = threading.Lock()
        self._next = 0.0  # monotonic time before which no claim goes

    def take(
        self,
        call: Callable[[int], list[dict[str, Any]]],
        most: int,
        should_stop: Callable[[], bool],
    ) -> list[dict[str, Any]]:
        """``call(most)`` in its turn; [] if the loop stops while it waits for it."""
        while not self._lock.acquire(timeout=STOP_POLL_S):
            if should_stop():
                return []
        try:
            while (wait := self._next - time.monotonic()) > 0:
                if should_stop():
                    return []
                time.sleep(min(wait, STOP_POLL_S))
            if should_stop():
                return []
            claimed: list[dict[str, Any]] = []
            try:
                claimed = call(most)
            finally:
                drained = len(claimed) < most
                self._next = time.monotonic() + self.gap_s if drained else 0.0
            return claimed
        finally:
            self._lock.release()


@dataclass
class _Ticket:
    send: Callable[[Pending], None]
    pending: Pending
    max_body_bytes: int
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    error: BaseException | None = None


class ReportGroup:
    """Reports of a crew's loops, gathered: one request for all the outcomes ready within
    ``gap_s`` of the last report, one request at a time."""

    def __init__(self, gap_s: float = PACE_S) -> None:
        self.gap_s = gap_s
        self._lock = threading.Lock()
        self._waiting: list[_Ticket] = []
        self._sending = False
        self._last = float("-inf")

    def send(self, send: Callable[[Pending], None], pending: Pending, max_body_bytes: int) -> None:
        """Report ``pending`` (with ``send``, a Reporter's report_many) together with what
        the other loops have ready; returns once they are stored, as ``send`` would."""
        ticket = _Ticket(send, pending, max_body_bytes)
        with self._lock:
            self._waiting.append(ticket)
            if not self._sending:
                self._sending = ticket.lead = True
        if not ticket.lead:
            ticket.wake.wait()
        if ticket.lead:
            self._lead(ticket)
        if ticket.error is not None:
            raise ticket.error

    def _lead(self, ticket: _Ticket) -> None:
        """Send what is waiting (this ticket's among it), then hand the lead on."""
        wait = self._last + self.gap_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self._lock:
            batch, self._waiting = self._waiting, []
        error: BaseException | None = None
        try:
            for part in _parts(batch, ticket.max_body_bytes):
                ticket.send(part)
        except BaseException as exc:  # each loop of the batch sees it, as if it had sent
            error = exc
        with self._lock:
            self._last = time.monotonic()
            for one in batch:
                one.lead = False
                one.error = error
                one.wake.set()
            if self._waiting:
                nxt = self._waiting[0]
                nxt.lead = True
                nxt.wake.set()
            else:
                self._sending = False


def _parts(batch: list[_Ticket], max_body_bytes: int) -> list[Pending]:
    """The batch's outcomes in requests within the API's limits (each loop's own are
    already within them)."""
    parts: list[Pending] = []
    current: Pending = []
    size = 0
    for ticket in batch:
        for lease, body in ticket.pending:
            body_size = len(json.dumps(body)) + REPORT_OVERHEAD_BYTES
            if current and (size + body_size > max_body_bytes or len(current) >= MAX_REPORT_BATCH):
                parts.append(current)
                current, size = [], 0
            current.append((lease, body))
            size += body_size
    if current:
        parts.append(current)
    return parts
