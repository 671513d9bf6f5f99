"""The queue: claims as leases, heartbeats, outcomes. The database is the queue.

A claim is one transaction. On PostgreSQL the candidate row is taken with
``FOR UPDATE SKIP LOCKED``, so concurrent claimers never wait on each other nor take
the same row; on SQLite the whole transaction holds the write lock (``BEGIN
IMMEDIATE``). Expired leases go back to the queue inside the claim itself.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.errors import LeaseLost
from app.models import Experiment, Result, TraceChunk, Worker
from app.schemas.worker import OutcomeRequest
from app.services import workers


@dataclass(frozen=True)
class Claim:
    experiment: Experiment
    lease_token: str


def expire_leases(session: Session, now: datetime, max_attempts: int) -> None:
    """Expired leases: cancel what was being cancelled, fail what used every attempt as
    `lost`, and put the rest back in the queue."""
    expired = (Experiment.status == "running", Experiment.lease_expires_at < now)
    cleared: dict[str, Any] = {"lease_token": None, "lease_expires_at": None}
    session.execute(
        update(Experiment)
        .where(*expired, Experiment.cancel_requested.is_(True))
        .values(status="cancelled", finished_at=now, **cleared)
    )
    session.execute(
        update(Experiment)
        .where(*expired, Experiment.attempts >= max_attempts)
        .values(
            status="failed",
            finished_at=now,
            error_type="lost",
            error_message=(
                f"the worker's lease expired {max_attempts} time(s): "
                "its worker died or lost contact while running it"
            ),
            error_hint="a crash that takes the worker down repeats; check the worker's log",
            **cleared,
        )
    )
    session.execute(
        update(Experiment).where(*expired).values(status="queued", worker_id=None, **cleared)
    )


def claim(session: Session, worker: Worker, settings: Settings, now: datetime) -> Claim | None:
    expire_leases(session, now, settings.max_attempts)
    stmt = (
        select(Experiment)
        .where(Experiment.status == "queued", workers.runnable_clause(worker.capabilities))
        .order_by(Experiment.priority.desc(), Experiment.created_at, Experiment.id)
        .limit(1)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True, of=Experiment)
    exp = session.scalars(stmt).first()
    worker.last_seen_at = now
    if exp is None:
        worker.state = "idle"
        worker.current_experiment_id = None
        return None
    token = secrets.token_hex(16)
    exp.status = "running"
    exp.attempts += 1
    exp.lease_token = token
    exp.lease_expires_at = now + timedelta(seconds=settings.lease_seconds)
    exp.worker_id = worker.id
    exp.started_at = now
    exp.progress = None
    worker.state = "busy"
    worker.current_experiment_id = exp.id
    # A trace left by an earlier attempt whose lease expired belongs to no result.
    session.execute(delete(TraceChunk).where(TraceChunk.experiment_id == exp.id))
    return Claim(exp, token)


def owned(session: Session, experiment_id: str, token: str) -> Experiment:
    """The running experiment this token leases, locked for the rest of the transaction."""
    stmt = select(Experiment).where(Experiment.id == experiment_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    exp = session.scalars(stmt).first()
    if exp is None or exp.status != "running" or exp.lease_token != token:
        state = "gone" if exp is None else exp.status
        raise LeaseLost(
            f"this lease no longer owns experiment {experiment_id} (it is {state}); "
            "drop the work: another attempt owns it or it has ended"
        )
    return exp


def _touch_worker(session: Session, exp: Experiment, now: datetime, *, done: bool) -> None:
    if exp.worker_id is None:
        return
    worker = session.get(Worker, exp.worker_id)
    if worker is not None:
        worker.last_seen_at = now
        if done:
            worker.state = "idle"
            worker.current_experiment_id = None


def heartbeat(
    session: Session,
    exp: Experiment,
    progress: dict[str, Any] | None,
    settings: Settings,
    now: datetime,
) -> Experiment:
    exp.lease_expires_at = now + timedelta(seconds=settings.lease_seconds)
    if progress is not None:
        exp.progress = progress
    _touch_worker(session, exp, now, done=False)
    return exp


def release(session: Session, exp: Experiment, now: datetime) -> Experiment:
    """A worker gives work back unrun (it is shutting down): no attempt is counted."""
    exp.status = "queued"
    exp.attempts = max(0, exp.attempts - 1)
    exp.lease_token = None
    exp.lease_expires_at = None
    exp.worker_id = None
    exp.progress = None
    _touch_worker(session, exp, now, done=True)
    return exp


def finish(session: Session, exp: Experiment, req: OutcomeRequest, now: datetime) -> Experiment:
    exp.status = req.status
    exp.finished_at = now
    exp.lease_token = None
    exp.lease_expires_at = None
    if req.error is not None:
        exp.error_type = req.error.type
        exp.error_message = req.error.message
        exp.error_hint = req.error.hint
        exp.error_details = req.error.details
    if req.result is not None:
        exp.result = Result(
            worker_id=exp.worker_id,
            attempt=exp.attempts,
            data=req.result,
            trace_events=req.trace_events,
        )
    _touch_worker(session, exp, now, done=True)
    return exp
