"""Housekeeping that no request waits for: expired leases are settled by the API itself.

A task in the app's lifespan (its own session, its own transaction) wakes when the
earliest lease it knows of expires, and at least every ``lease_check_seconds`` (or every
``lease_seconds``, if shorter: a lease claimed meanwhile expires no sooner), so an
experiment whose worker died shows ``queued`` again (or ``lost``) moments after its lease
expired, even when no worker is polling and however busy the host. It is the only
code that settles expired leases: a claim never does (claims that each settled them in
one bulk UPDATE deadlocked on each other on PostgreSQL). A claim that finds nothing to
take nudges it instead, so the next round starts at once, and a round that requeued work
wakes the claims that wait: an expired lease is back in the queue as soon as a worker
asks for work, without any claim waiting on the rows. A failed round (the database
away) is logged and the next one tries again.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
from app.core.db import Database
from app.core.signals import WorkSignal
from app.queue import service as queue
from app.tables import Experiment
from vramlab.contract import Status

log = logging.getLogger("vramlab.reaper")
# A round starts this long after the earliest lease's expiry (expiry is "before now").
EXPIRY_MARGIN_S = 0.02
# The shortest wait between rounds: a lease that stays expired (its row held by another
# transaction) is looked at again this often, not in a busy loop.
MIN_WAIT_S = 0.1


def settle(db: Database, settings: Settings, now: datetime) -> int:
    """One round: settle every expired lease, a slice a transaction; returns how many
    were settled."""
    settled = 0
    while True:
        with db.session() as s:
            n = queue.expire_leases(s, now, settings.max_attempts)
        settled += n
        if n < queue.EXPIRE_SLICE:
            return settled


def earliest_expiry(db: Database) -> datetime | None:
    """When the first running experiment's lease expires (None: none is running)."""
    with db.session(write=False) as s:
        stmt = select(func.min(Experiment.lease_expires_at)).where(
            Experiment.status == Status.RUNNING
        )
        earliest: datetime | None = s.scalar(stmt)
        return earliest


def next_wait(settings: Settings, now: datetime, earliest: datetime | None) -> float:
    """Seconds until the next round: the earliest expiry (and a margin), within the
    usual period; a lease claimed while this waits expires no sooner than lease_seconds."""
    longest = min(settings.lease_check_seconds, settings.lease_seconds)
    if earliest is None:
        return longest
    until = (earliest - now).total_seconds() + EXPIRY_MARGIN_S
    return max(MIN_WAIT_S, min(longest, until))


def round_(db: Database, settings: Settings, clock: Callable[[], datetime]) -> tuple[int, float]:
    """Settle what expired; how many, and how long until the next round."""
    settled = settle(db, settings, clock())
    return settled, next_wait(settings, clock(), earliest_expiry(db))


class Nudge:
    """Asks the reaper for a round now; nudges that come while one runs make one more."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __call__(self) -> None:
        """Call on the event loop."""
        self._event.set()

    async def wait(self, timeout: float) -> None:
        """Until nudged or ``timeout`` seconds passed, whichever comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()


async def run(
    db: Database,
    settings: Settings,
    clock: Callable[[], datetime],
    signal: WorkSignal,
    nudge: Nudge | None = None,
) -> None:
    nudge = nudge or Nudge()
    wait_s = min(settings.lease_check_seconds, settings.lease_seconds)
    while True:
        await nudge.wait(wait_s)
        try:
            settled, wait_s = await run_in_threadpool(round_, db, settings, clock)
        except Exception as exc:  # the database may be away for a while: keep going
            log.warning("settling expired leases failed: %s", exc)
            wait_s = settings.lease_check_seconds
            continue
        if settled:
            log.info("settled %d expired lease(s)", settled)
            signal.notify(settled)  # requeued work: wake as many waiting claims
