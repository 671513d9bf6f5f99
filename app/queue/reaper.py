"""Housekeeping that no request waits for: expired leases are settled by the API itself.

A task in the app's lifespan looks every ``lease_check_seconds`` (its own session, its
own transaction), so an experiment whose worker died shows ``queued`` again (or
``lost``) within about a lease period even when no worker is polling. It is the only
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

from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
from app.core.db import Database
from app.core.signals import WorkSignal
from app.queue import service as queue

log = logging.getLogger("vramlab.reaper")


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
    while True:
        await nudge.wait(settings.lease_check_seconds)
        try:
            settled = await run_in_threadpool(settle, db, settings, clock())
        except Exception as exc:  # the database may be away for a while: keep going
            log.warning("settling expired leases failed: %s", exc)
            continue
        if settled:
            log.info("settled %d expired lease(s)", settled)
            signal.notify(settled)  # requeued work: wake as many waiting claims
