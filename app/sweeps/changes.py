"""Wakes whoever follows a sweep's progress when a transaction that wrote experiments
commits in this process: a progress long-poll waits on this, holding no thread and no
session, and reads the sweep's counts again when woken.

Every write of ``experiments`` through a session (a bulk insert, update or delete, or an
object flushed) marks the transaction; its commit wakes every waiter of this process
(each looks at its own sweep's one row of counts and waits again if nothing changed).
Changes made by another API replica are not seen here: waiters look again every
``LOOK_AGAIN_SECONDS`` as well.
"""

import asyncio
import threading

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction

from app.tables import Experiment

LOOK_AGAIN_SECONDS = 1.0
_MARK = "vramlab_experiments_written"


class Changes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[asyncio.Event, asyncio.AbstractEventLoop] = {}

    def enlist(self) -> asyncio.Event:
        """A ticket that the next commit sets; take it before reading. On the event loop."""
        ticket = asyncio.Event()
        with self._lock:
            self._waiting[ticket] = asyncio.get_running_loop()
        return ticket

    def leave(self, ticket: asyncio.Event) -> None:
        with self._lock:
            self._waiting.pop(ticket, None)

    def committed(self) -> None:
        """Experiments changed: wake every waiter; safe from any thread."""
        with self._lock:
            woken, self._waiting = self._waiting, {}
        for ticket, loop in woken.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(ticket.set)


CHANGES = Changes()


@event.listens_for(Session, "do_orm_execute")
def _executed(state: ORMExecuteState) -> None:
    writes = state.is_insert or state.is_update or state.is_delete
    if writes and getattr(state.statement, "table", None) is Experiment.__table__:
        state.session.info[_MARK] = True


@event.listens_for(Session, "after_flush")
def _flushed(session: Session, _flush: UOWTransaction) -> None:
    if any(isinstance(o, Experiment) for o in (*session.new, *session.dirty, *session.deleted)):
        session.info[_MARK] = True


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    if session.info.pop(_MARK, False):
        CHANGES.committed()


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_MARK, None)
