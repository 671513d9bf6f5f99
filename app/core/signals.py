"""Wakes claims that wait for work as soon as an experiment is queued, on every replica.

Waiters enlist *before* they look for work, so a notification that lands between their
look and their wait still wakes them. A transaction that queues work calls
``after_commit`` with how many experiments it queued: once it commits, as many of this
process's waiting claims wake, the longest waiting first (one experiment submitted wakes
one claim, not every loop of every worker: the others would each take the database's
write slot to find nothing), and a sweep wakes them all. A waiter that was woken and
leaves without looking hands the wake on. On
PostgreSQL the ``Replicas`` task sends ``NOTIFY`` on a connection of its own, off the
request's path and coalesced (at most one each ``NOTIFY_GAP_SECONDS``), which wakes the
waiting claims of every other API replica through their ``LISTEN``. The poll every
``claim_poll_seconds`` stays as the fallback (expired leases, a connection that is being
re-made).
"""

import asyncio
import logging
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("vramlab")

CHANNEL = "vramlab_work"
_PENDING = "vramlab_wakes_workers"
# At most one NOTIFY this often: the first after a quiet spell goes at once, and what a
# steady stream of submits queues meanwhile waits for the next. Each NOTIFY is work for
# every replica (PostgreSQL queues it at commit and wakes each listening connection,
# this replica's own included), and a claim waiting elsewhere needs only one.
NOTIFY_GAP_SECONDS = 0.05


class WorkSignal:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # Waiting claims, the longest waiting first: each an event that its wake sets.
        self._waiting: deque[asyncio.Event] = deque()
        # Names this process in its NOTIFY payloads, so its listener skips its own.
        self.replica = uuid.uuid4().hex
        # Set when work was queued here and the other replicas are yet to be told.
        self.outgoing = asyncio.Event()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def enlist(self) -> asyncio.Event:
        """A ticket that a wake sets; take it before looking for work. On the event loop."""
        ticket = asyncio.Event()
        self._waiting.append(ticket)
        return ticket

    def leave(self, ticket: asyncio.Event, *, unused_wake: bool = False) -> None:
        """The waiter is done: off the list; a wake it got and did not look after (or
        ``unused_wake``) goes to the next waiter."""
        try:
            self._waiting.remove(ticket)
        except ValueError:
            unused_wake = True  # it was woken: taken off the list by the wake
        if unused_wake:
            self.wake(1)

    def wake(self, count: int | None = None) -> None:
        """Wake ``count`` waiting claims (every one when None); call on the event loop."""
        n = len(self._waiting) if count is None else min(count, len(self._waiting))
        for _ in range(n):
            self._waiting.popleft().set()

    def notify(self, count: int | None = None) -> None:
        """``count`` experiments were queued (None: unknown): wake as many waiting claims
        of this process, and have the other replicas told; safe to call from any thread."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._queued, count)

    def _queued(self, count: int | None) -> None:
        self.wake(count)
        self.outgoing.set()

    def after_commit(self, session: Session, count: int | None = None) -> None:
        """Wake ``count`` waiting claims here (None: all), and every replica's, once this
        transaction commits; once per transaction, the counts of its calls added up."""
        pending = session.info.get(_PENDING)
        if pending is not None and pending[1] is not None and count is not None:
            count += pending[1]
        elif pending is not None:
            count = None
        session.info[_PENDING] = (self, count)


# One listener for every session (cheaper than one registered per transaction): a
# transaction that queued work wakes the signal it named; one rolled back forgets it.
@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if pending is not None:
        signal, count = pending
        signal.notify(count)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


async def wait_for(event_: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event_.wait(), timeout)
    except TimeoutError:
        return False
    return True


def libpq_url(database_url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as psycopg's own connect() takes it."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class Replicas:
    """Tells the other API replicas on one PostgreSQL database when work was queued here,
    and wakes this replica's waiting claims when they tell it. Two connections of its own,
    outside the pool: one LISTENs, one sends NOTIFY. Each is made again after it is
    lost; meanwhile claims fall back to polling."""

    def __init__(self, database_url: str, signal: WorkSignal, retry_seconds: float = 1.0):
        self.conninfo = libpq_url(database_url)
        self.signal = signal
        self.retry_seconds = retry_seconds

    async def run(self) -> None:
        await asyncio.gather(self._listen(), self._announce())

    async def _connect(self) -> "psycopg.AsyncConnection[Any]":
        import psycopg

        return await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, connect_timeout=5
        )

    async def _listen(self) -> None:
        while True:
            try:
                async with await self._connect() as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.signal.wake()  # work queued while no one listened
                    while True:
                        async for note in conn.notifies(timeout=30):
                            if note.payload != self.signal.replica:
                                self.signal.wake()
                        await conn.execute("SELECT 1")  # still connected?
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("vramlab: LISTEN connection lost (%s); claims poll meanwhile", exc)
                await asyncio.sleep(self.retry_seconds)

    async def _announce(self) -> None:
        outgoing = self.signal.outgoing
        while True:
            try:
                async with await self._connect() as conn:
                    while True:
                        await outgoing.wait()
                        # Cleared before sending: commits meanwhile make one more NOTIFY.
                        outgoing.clear()
                        await conn.execute(
                            "SELECT pg_notify(%s, %s)", (CHANNEL, self.signal.replica)
                        )
                        await asyncio.sleep(NOTIFY_GAP_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("vramlab: NOTIFY connection lost (%s); other replicas poll", exc)
                await asyncio.sleep(self.retry_seconds)
