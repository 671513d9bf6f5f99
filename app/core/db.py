"""The one place that creates the engine and owns sessions and commits.

SQLite runs in WAL mode, and write transactions start with ``BEGIN IMMEDIATE`` so that
a read transaction never has to upgrade to a write (which fails at once when another
writer got in between). Inside one process, writers take an in-process lock *before*
they check out a connection: they queue on the lock, not on the pool, so a burst of
writers never starves readers of connections, and a writer that waits longer than
``wait_seconds`` gives up with :class:`Busy` (503 with Retry-After) instead of hanging.
Each request holds at most one connection at a time (app/api/deps.py), so the pool
cannot deadlock; a checkout that waits longer than ``wait_seconds`` is a 503 too.
PostgreSQL needs no lock: its row locks (``FOR UPDATE SKIP LOCKED``) serialise claims.
"""

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

IMMEDIATE = "vramlab_immediate"
# A PostgreSQL connection back in the pool longer than this is pinged before it is used
# again: one that was just in use is alive (a ping each checkout was a fifth of a
# submit's round trips, and the most of what separated one connection's submits from a
# bare app's).
IDLE_PING_SECONDS = 1.0
# A writer of another process (`vramlab token create`, a second `serve`) holding the
# lock: how long SQLite itself waits for it, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 5_000


# What read-only look-ups run on: a request's session, or a Core connection
# (``Database.reads_before_writing``); both take Core statements.
Reader = Session | Connection


class Busy(Exception):
    """The database is saturated: no connection or write slot came free in time."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _prepare_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(IMMEDIATE, False)
        statement = "BEGIN IMMEDIATE" if immediate else "BEGIN"
        # Straight to the driver: SQLAlchemy's execution of a statement costs several
        # times what SQLite takes to begin (a share of every request). Its errors are
        # wrapped as SQLAlchemy would (a lock not had in time: OperationalError, a 503).
        try:
            conn.connection.driver_connection.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 20,
    wait_seconds: float = 5.0,
    idle_ping_seconds: float = IDLE_PING_SECONDS,
) -> Engine:
    """``pool_size`` + ``max_overflow`` connections at most; a checkout waits
    ``wait_seconds`` at most (then SQLAlchemy's TimeoutError, answered 503); a PostgreSQL
    connection idle ``idle_ping_seconds`` is pinged before it is used again."""
    parsed = make_url(url)
    pool = {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": wait_seconds}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(
                url, connect_args={"check_same_thread": False, "timeout": 5}, **pool
            )
        else:
            engine = create_engine(url, connect_args={"check_same_thread": False})
        _prepare_sqlite(engine)
        return engine
    # The API's queries are short, and their latency is what counts: a parallel plan's
    # workers take tens of ms to start on a busy host (a tag filter went from 12 to 46 ms).
    options = {"options": "-c max_parallel_workers_per_gather=0"}
    engine = create_engine(url, connect_args=options, **pool)
    _ping_when_idle(engine, idle_ping_seconds)
    return engine


def _ping_when_idle(engine: Engine, idle_seconds: float) -> None:
    """Ping a connection at checkout if it sat in the pool ``idle_seconds`` or more (or
    was never used); a dead one is discarded and another taken (the pool retries on
    DisconnectionError). A connection that died within the window fails its request,
    which is answered 503, and SQLAlchemy then invalidates the pool's older connections."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("checked_in")
        if since is not None and time.monotonic() - since < idle_seconds:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"a pooled connection did not answer: {exc}") from exc
        if not alive:
            raise DisconnectionError("a pooled connection did not answer")


class Database:
    """An engine and its session factories; ``session()`` is the unit of work."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        max_overflow: int = 20,
        wait_seconds: float = 5.0,
    ) -> None:
        self.url = url
        self.wait_seconds = wait_seconds
        self.engine = make_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, wait_seconds=wait_seconds
        )
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        # A plain Lock, not an RLock: a request's session may begin in one worker thread
        # and commit in another.
        self._writer = threading.Lock()
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._immediate: Engine = self.engine
        if self.is_sqlite:
            # Writes begin with BEGIN IMMEDIATE, after taking this process's write slot.
            self._immediate = self.engine.execution_options(**{IMMEDIATE: True})
            self._write = sessionmaker(self._immediate, expire_on_commit=False, info={_SLOT: self})
        else:
            self._write = self._read

    def open(self, *, write: bool = True) -> Session:
        """A session that touches the database only when first used; finish it with
        ``close``. ``write`` on SQLite: its transaction queues for this process's write
        slot, then takes SQLite's write lock up front (``BEGIN IMMEDIATE``)."""
        return (self._write if write else self._read)()

    @staticmethod
    def close(session: Session, *, ok: bool) -> None:
        """Commit (``ok``) or roll back, and give the connection back."""
        try:
            if ok:
                session.commit()
            else:
                session.rollback()
        finally:
            session.close()

    @contextmanager
    def session(self, *, write: bool = True) -> Iterator[Session]:
        """A session that commits when the block ends and rolls back on any error.

        Do not nest sessions: one at a time per thread of work is what keeps the pool
        from deadlocking.
        """
        s = self.open(write=write)
        try:
            yield s
        except BaseException:
            self.close(s, ok=False)
            raise
        self.close(s, ok=True)

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Connection]:
        """A Core connection in a transaction that commits when the block ends and rolls
        back on any error, for a hot path whose statements are all Core (an ORM session
        costs several times a short statement). ``write`` on SQLite: this process's write
        slot is taken first, then ``BEGIN IMMEDIATE``, as for a write session."""
        slot = write and self.is_sqlite
        if slot:
            self.take_write_slot()
        try:
            with (self._immediate if slot else self.engine).begin() as conn:
                yield conn
        finally:
            if slot:
                self.give_write_slot()

    @contextmanager
    def reads_before_writing(self, write: Session) -> Iterator[Reader]:
        """What a write request reads before it writes (who is calling, which workers are
        live) runs on this. On SQLite, a short read transaction of its own on a Core
        connection (an ORM session would cost several times its one or two SELECTs),
        closed when the block ends, so that the write slot is not held meanwhile:
        ``write`` must not have been used yet. Elsewhere ``write`` itself: one
        connection, one transaction."""
        if not self.is_sqlite:
            yield write
            return
        with self.transaction(write=False) as conn:
            yield conn

    def take_write_slot(self) -> None:
        if not self._writer.acquire(timeout=self.wait_seconds):
            raise Busy(f"the database is busy: no write slot came free in {self.wait_seconds:g} s")

    def give_write_slot(self) -> None:
        self._writer.release()

    def dispose(self) -> None:
        self.engine.dispose()


_SLOT = "vramlab_write_slot"
_HELD = "vramlab_write_slot_held"


# A write session's transaction takes the write slot when it begins, before it checks
# out a connection (SQLAlchemy creates the transaction first, the connection on first
# use), and gives it back when it ends, committed or not.
@event.listens_for(Session, "after_transaction_create")
def _take_slot(session: Session, transaction: SessionTransaction) -> None:
    db = session.info.get(_SLOT)
    if db is not None and transaction.parent is None:
        db.take_write_slot()
        session.info[_HELD] = True


@event.listens_for(Session, "after_transaction_end")
def _give_slot(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None and session.info.pop(_HELD, False):
        session.info[_SLOT].give_write_slot()
