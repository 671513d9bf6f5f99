"""What live workers offer, as submits ask it: read at most once a second per database.

Every submit answers whether a live worker can run it (``queue.runnable``), and a spec
that names no device gets one that a live worker offers. Reading the workers for each
submit cost it about a tenth of its time, for a hint; here they are read at most once
every ``CACHE_SECONDS`` per database and process.

- A change made in this process (a worker registers, is heard from, or stops) clears
  what was read as soon as its transaction commits: a read that began before the commit
  is not kept. A change made through another API replica shows within ``CACHE_SECONDS``.
- Liveness is judged at each use against the caller's own time (``now``), so a worker
  still drops out the moment it has been silent for ``worker_live_seconds``.
"""

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, event, select
from sqlalchemy.orm import Session, SessionTransaction

from app.core.db import Reader
from app.tables import Worker

CACHE_SECONDS = 1.0
_CHANGED = "vramlab_workers_changed"
_BEGUN_AT = "vramlab_workers_generation"

# Built once: on SQLite, building a statement costs more than running it.
_SEEN_SINCE = select(Worker.last_seen_at, Worker.capabilities).where(
    Worker.last_seen_at >= bindparam("cutoff"), Worker.stopped_at.is_(None)
)

_lock = threading.Lock()
# Counts the changes this process committed to any database's workers; a read is kept
# only if no change committed since its transaction began.
_generation = 0


@dataclass(frozen=True)
class _Read:
    generation: int
    live_seconds: float
    at: float  # time.monotonic()
    rows: list[tuple[datetime, dict[str, Any]]]  # (last seen, capabilities)


_reads: dict[str, _Read] = {}  # by database URL


def capabilities(session: Reader, now: datetime, live_seconds: float) -> list[dict[str, Any]]:
    """The capabilities of each worker live at ``now``, read on a session or a Core
    connection (whose read is kept as of the moment it is made: on SQLite it begins
    then, and on PostgreSQL each statement sees what was committed when it starts)."""
    engine = session.engine if isinstance(session, Connection) else session.get_bind().engine
    key = str(engine.url)
    with _lock:
        read = _reads.get(key)
        begun = _generation
        if isinstance(session, Session):
            begun = session.info.get(_BEGUN_AT, _generation)
        fresh = (
            read is not None
            and read.generation == _generation
            and read.live_seconds == live_seconds
            and time.monotonic() - read.at < CACHE_SECONDS
        )
    if read is None or not fresh:
        # A second more than needed, for callers whose clock reads a little behind.
        cutoff = now - timedelta(seconds=live_seconds + CACHE_SECONDS)
        rows = [(seen, caps) for seen, caps in session.execute(_SEEN_SINCE, {"cutoff": cutoff})]
        read = _Read(begun, live_seconds, time.monotonic(), rows)
        with _lock:
            if begun == _generation:
                _reads[key] = read
    cutoff = now - timedelta(seconds=live_seconds)
    return [caps for seen, caps in read.rows if seen >= cutoff]


def changed(session: Session) -> None:
    """This transaction changes a worker: forget what was read once it commits."""
    session.info[_CHANGED] = True


@event.listens_for(Session, "after_transaction_create")
def _begun(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        session.info[_BEGUN_AT] = _generation


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    global _generation
    if session.info.pop(_CHANGED, False):
        with _lock:
            _generation += 1


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_CHANGED, None)
