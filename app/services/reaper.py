"""Housekeeping that no request waits for: expired leases are settled by the API itself.

A task in the app's lifespan looks every ``lease_check_seconds`` (its own session, its
own transaction), so an experiment whose worker died shows ``queued`` again (or
``lost``) within about a lease period even when no worker is polling. Claims settle
expired leases too, as a backstop. A failed round (the database away) is logged and the
next one tries again.
"""

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
from app.core.db import Database
from app.services import queue
from app.services.signals import WorkSignal

log = logging.getLogger("vramlab.reaper")


def settle(db: Database, settings: Settings, now: datetime) -> int:
    """One round: settle every expired lease; returns how many were settled."""
    with db.session() as s:
        return queue.expire_leases(s, now, settings.max_attempts)


async def run(
    db: Database, settings: Settings, clock: Callable[[], datetime], signal: WorkSignal
) -> None:
    while True:
        await asyncio.sleep(settings.lease_check_seconds)
        try:
            settled = await run_in_threadpool(settle, db, settings, clock())
        except Exception as exc:  # the database may be away for a while: keep going
            log.warning("settling expired leases failed: %s", exc)
            continue
        if settled:
            log.info("settled %d expired lease(s)", settled)
            signal.notify()  # requeued work: wake the claims that wait
