"""The queue: claims as leases, heartbeats, outcomes, expiry. The database is the queue.

Every state change is one conditional UPDATE on the status it expects (and, once
claimed, the lease token), and the row count says whether it happened: nothing reads a
row, decides in Python and writes it back, so two changes that race (a cancel and a
claim, a late report and an expiry) cannot both win.

No transaction here ever waits for a row another one holds while it holds rows of its
own in another order, so PostgreSQL finds no deadlock between them. A claim takes its
candidates with ``FOR UPDATE SKIP LOCKED`` in the claim order (one fixed order: that of
the index ``ix_experiments_claim``) and passes rows that others hold; it never settles
expired leases itself. Expired leases are settled by the API's housekeeping task alone
(app/queue/reaper.py, which a claim that finds nothing nudges): it too takes the
expired rows with ``SKIP LOCKED``, in the order of their ids, and a row held by a
heartbeat or an outcome is left for its next round. Calls on claimed experiments, and
claims, lock the experiments first and the worker's row last; in between, a change into
or out of ``queued`` moves its submitters' queued counts (``submitter_queues``), which
the database's triggers lock in the order of the submitters within one statement. On
SQLite the write transaction holds the database's write lock (``BEGIN IMMEDIATE``) and
none of this arises. A requeued
experiment goes to the back of its priority (``available_at``), so one that kills its
workers is not retaken first every time.
"""

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, Select, Table, bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session

from app.access.tokens import Principal
from app.core.config import Settings
from app.core.errors import ApiError, LeaseLost
from app.queue import workers
from app.queue.schemas import LeasedOutcome, ReportItem
from app.tables import Experiment, Result, TraceChunk, Worker
from app.traces.service import InlineTrace
from vramlab.contract import ErrorType, ReportVerdict, Status

# Expired leases settled in one statement at most (a round settles them all, in slices).
EXPIRE_SLICE = 500
_NO_LEASE: dict[str, Any] = {"lease_token": None, "lease_expires_at": None}


@dataclass(frozen=True)
class Claim:
    experiment: Experiment
    lease_token: str


def transition(
    session: Session,
    experiment_id: str,
    expected: Status,
    token: str | None = None,
    **values: Any,
) -> bool:
    """Compare-and-set: change the experiment only if it is still ``expected`` (and
    leased under ``token`` when given). True if it changed."""
    stmt = update(Experiment).where(Experiment.id == experiment_id, Experiment.status == expected)
    if token is not None:
        stmt = stmt.where(Experiment.lease_token == token)
    result = session.execute(stmt.values(**values).execution_options(synchronize_session=False))
    return cast(CursorResult[Any], result).rowcount == 1


def _reload(session: Session, experiment_id: str) -> Experiment:
    stmt = select(Experiment).where(Experiment.id == experiment_id)
    exp = session.scalars(stmt.execution_options(populate_existing=True)).one()
    return exp


def _lease_lost_message(experiment_id: str, status: str | None) -> str:
    return (
        f"this lease no longer owns experiment {experiment_id} (it is {status or 'gone'}); "
        "drop the work: another attempt owns it or it has ended"
    )


def _lease_lost(session: Session, experiment_id: str) -> LeaseLost:
    status = session.scalar(select(Experiment.status).where(Experiment.id == experiment_id))
    return LeaseLost(_lease_lost_message(experiment_id, status))


def _locked_in_order(session: Session, stmt: Select[Any]) -> Select[Any]:
    """On PostgreSQL, the rows ``stmt`` selects, locked, passing those another transaction
    holds (``stmt`` fixes the order they are taken in); SQLite's write lock holds them all."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True, of=Experiment)
    return stmt


def expire_leases(session: Session, now: datetime, max_attempts: int) -> int:
    """Expired leases, ``EXPIRE_SLICE`` at most: cancel what was being cancelled, fail
    what used every attempt as `lost`, and put the rest at the back of the queue. Returns
    how many were settled; the reaper calls again, in a new transaction, while a slice
    comes back full.

    The reaper's work alone. The rows are taken in the order of their ids, passing any
    that another transaction holds (a heartbeat or an outcome that raced the expiry: the
    next round sees it again if it still needs settling), so this never waits on a row.
    A slice a transaction: the requeue moves the submitters' queued counts (locked in
    their order within one statement, as a claim's are), and a second slice in the same
    transaction could take them in another order than a claim between the two."""
    stmt = (
        select(Experiment.id)
        .where(Experiment.status == Status.RUNNING, Experiment.lease_expires_at < now)
        .order_by(Experiment.id)
        .limit(EXPIRE_SLICE)
    )
    ids = list(session.scalars(_locked_in_order(session, stmt)))
    settled = 0
    expired = (Experiment.id.in_(ids), Experiment.status == Status.RUNNING)
    for where, values in (
        (
            (Experiment.cancel_requested.is_(True),),
            {"status": Status.CANCELLED, "finished_at": now},
        ),
        (
            (Experiment.attempts >= max_attempts,),
            {
                "status": Status.FAILED,
                "finished_at": now,
                "error_type": ErrorType.LOST,
                "error_message": (
                    f"the worker's lease expired {max_attempts} time(s): "
                    "its worker died or lost contact while running it"
                ),
                "error_hint": (
                    "a crash that takes the worker down repeats; check the worker's log"
                ),
            },
        ),
        ((), {"status": Status.QUEUED, "worker_id": None, "available_at": now}),
    ):
        if not ids:
            break
        stmt_u = update(Experiment).where(*expired, *where).values(**values, **_NO_LEASE)
        result = session.execute(stmt_u.execution_options(synchronize_session=False))
        settled += cast(CursorResult[Any], result).rowcount
    return settled


def next_candidates(capabilities: dict[str, Any], limit: int = 1) -> Select[Any]:
    """The queued experiments a worker with these capabilities takes next, in the order
    of the index ``ix_experiments_claim``."""
    return (
        select(Experiment.id)
        .where(Experiment.status == Status.QUEUED, workers.runnable_clause(capabilities))
        .order_by(Experiment.priority.desc(), Experiment.available_at, Experiment.id)
        .limit(limit)
    )


def claim_many(
    session: Session, worker: Worker, settings: Settings, now: datetime, limit: int
) -> list[Claim]:
    """Up to ``limit`` experiments for this worker, in the claim order, each leased under
    one new token (the claim's). Rows another claim holds are passed, never waited for;
    expired leases are the reaper's (a claim that finds nothing nudges it)."""
    ids = list(
        session.scalars(_locked_in_order(session, next_candidates(worker.capabilities, limit)))
    )
    if not ids:
        workers.seen(session, worker.id, now)
        return []
    token = secrets.token_hex(16)
    stmt = (
        update(Experiment)
        .where(Experiment.id.in_(ids), Experiment.status == Status.QUEUED)
        .values(
            status=Status.RUNNING,
            attempts=Experiment.attempts + 1,
            lease_token=token,
            lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
            worker_id=worker.id,
            started_at=now,
        )
    )
    session.execute(stmt.execution_options(synchronize_session=False))
    # The worker's row last, as every call on claimed experiments takes it: the UPDATE
    # above waits for the submitters' queued counts, which a release holds while it
    # waits for this row.
    workers.seen(session, worker.id, now)
    # A trace left by an earlier attempt whose lease expired belongs to no result.
    session.execute(delete(TraceChunk).where(TraceChunk.experiment_id.in_(ids)))
    taken = select(Experiment).where(Experiment.id.in_(ids), Experiment.lease_token == token)
    rows = session.scalars(taken.execution_options(populate_existing=True)).all()
    order = {exp_id: i for i, exp_id in enumerate(ids)}
    return [Claim(exp, token) for exp in sorted(rows, key=lambda e: order[e.id])]


def claim(session: Session, worker: Worker, settings: Settings, now: datetime) -> Claim | None:
    got = claim_many(session, worker, settings, now, 1)
    return got[0] if got else None


def owned(session: Session, experiment_id: str, token: str) -> Experiment:
    """The running experiment this token leases, locked for the rest of the transaction
    (a guard for work that is not a state change, such as storing a trace chunk)."""
    stmt = select(Experiment).where(Experiment.id == experiment_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    exp = session.scalars(stmt).first()
    if exp is None or exp.status != Status.RUNNING or exp.lease_token != token:
        raise _lease_lost(session, experiment_id)
    return exp


def heartbeat(
    session: Session, experiment_id: str, token: str, settings: Settings, now: datetime
) -> Experiment:
    """Extend the lease; the reply carries whether a cancel was asked for."""
    if not transition(
        session,
        experiment_id,
        Status.RUNNING,
        token,
        lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
    ):
        raise _lease_lost(session, experiment_id)
    exp = _reload(session, experiment_id)
    if exp.worker_id is not None:
        workers.seen(session, exp.worker_id, now)
    return exp


def release(session: Session, experiment_id: str, token: str, now: datetime) -> Experiment:
    """A worker gives work back unrun (it is shutting down): no attempt is counted."""
    worker_id = session.scalar(select(Experiment.worker_id).where(Experiment.id == experiment_id))
    if not transition(
        session,
        experiment_id,
        Status.RUNNING,
        token,
        status=Status.QUEUED,
        attempts=Experiment.attempts - 1,
        worker_id=None,
        **_NO_LEASE,
    ):
        raise _lease_lost(session, experiment_id)
    if worker_id is not None:
        workers.seen(session, worker_id, now)
    return _reload(session, experiment_id)


def _finish_values(req: LeasedOutcome, now: datetime) -> dict[str, Any]:
    """The experiment's columns an outcome sets: its status, the end, its error if any."""
    values: dict[str, Any] = {"status": req.status, "finished_at": now, **_NO_LEASE}
    if req.error is not None:
        values |= {
            "error_type": req.error.type,
            "error_message": req.error.message,
            "error_hint": req.error.hint,
            "error_details": req.error.details,
        }
    return values


def _trace_mismatch(req: LeasedOutcome, stored: int) -> str:
    return (
        f"trace_events: the outcome says {req.trace_events} events but "
        f"{stored} were uploaded under this lease; upload every chunk first"
    )


def _result_data(req: LeasedOutcome) -> dict[str, Any] | None:
    if req.result is None:
        return None
    return req.result.model_dump(mode="json", by_alias=True, exclude_unset=True)


def finish(
    session: Session, experiment_id: str, req: LeasedOutcome, now: datetime, *, seen: bool = True
) -> Experiment:
    """Store the outcome under its lease. ``seen=False``: the caller marks the worker seen
    once it has stored every outcome of a batch (the worker's row is locked last)."""
    if not transition(
        session, experiment_id, Status.RUNNING, req.lease_token, **_finish_values(req, now)
    ):
        raise _lease_lost(session, experiment_id)
    # The transaction rolls back on this refusal: the lease stays and the worker may retry.
    if req.trace_events:
        stored = session.scalar(
            select(func.coalesce(func.sum(TraceChunk.n_events), 0)).where(
                TraceChunk.experiment_id == experiment_id
            )
        )
        if stored != req.trace_events:
            raise ApiError(
                _trace_mismatch(req, stored or 0),
                details=[{"field": "trace_events", "message": f"{stored} stored"}],
            )
    exp = _reload(session, experiment_id)
    if (data := _result_data(req)) is not None:
        exp.result = Result(worker_id=exp.worker_id, attempt=exp.attempts, data=data)
    if seen and exp.worker_id is not None:
        workers.seen(session, exp.worker_id, now)
    return exp


@dataclass(frozen=True)
class Verdict:
    experiment_id: str
    verdict: ReportVerdict
    status: str | None = None
    error: str | None = None


def finish_many(
    session: Session,
    items: Sequence[ReportItem],
    who: Principal,
    now: datetime,
    inline: Mapping[str, InlineTrace | str] | None = None,
) -> list[Verdict]:
    """Store a batch of outcomes, each on its own: one whose lease was lost, or that
    another token's worker claimed, or that does not hold up is refused and changes
    nothing; the others are stored. Verdicts in the items' order.

    A few statements for the whole batch, not several an outcome: the experiments are
    read (on PostgreSQL locked, in the order of their ids) with what decides each verdict
    (status, lease, the claimer's token, the trace events stored), then the stored ones
    are written together and the workers' rows touched last, the order of every other
    call on claimed experiments. The rows are held from the read to the commit, so what
    was decided still holds when it is written.

    ``inline``: the traces sent inside outcomes (``trace_gz``), checked (or why not), by
    experiment: each is stored as the experiment's chunk 0 with its outcome, and counts
    as its uploaded events; one sent after chunks were uploaded is refused."""
    inline = inline or {}
    ids = sorted({item.experiment_id for item in items})
    stmt = (
        select(
            Experiment.id,
            Experiment.status,
            Experiment.lease_token,
            Experiment.worker_id,
            Experiment.attempts,
            Worker.registered_by,
        )
        .outerjoin(Worker, Worker.id == Experiment.worker_id)
        .where(Experiment.id.in_(ids))
        .order_by(Experiment.id)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(of=Experiment)
    rows = {row.id: row for row in session.execute(stmt)}
    traced = sorted(
        {item.experiment_id for item in items if item.trace_events or item.trace_gz is not None}
    )
    events: dict[str, int] = {}
    if traced:
        counted = (
            select(TraceChunk.experiment_id, func.sum(TraceChunk.n_events))
            .where(TraceChunk.experiment_id.in_(traced))
            .group_by(TraceChunk.experiment_id)
        )
        events = {exp_id: int(n or 0) for exp_id, n in session.execute(counted)}

    verdicts: list[Verdict] = []
    stored: list[tuple[ReportItem, Any]] = []
    # An experiment reported twice in one batch: the first counts; its status, by id.
    taken: dict[str, str] = {}
    for item in items:
        exp_id = item.experiment_id
        row = rows.get(exp_id)
        claimer = row.registered_by if row is not None else None
        if claimer is not None and claimer != who.id and not who.allows("admin"):
            error = f"forbidden: experiment {exp_id} was claimed by another token's worker"
            verdicts.append(Verdict(exp_id, ReportVerdict.REFUSED, error=error))
            continue
        if (
            row is None
            or exp_id in taken
            or row.status != Status.RUNNING
            or row.lease_token != item.lease_token
        ):
            status = (
                "gone" if row is None else (Status.SUCCEEDED if exp_id in taken else row.status)
            )
            lost = _lease_lost_message(exp_id, status)
            verdicts.append(Verdict(exp_id, ReportVerdict.LEASE_LOST, error=lost))
            continue
        sent = inline.get(exp_id) if item.trace_gz is not None else None
        if isinstance(sent, str) or (sent is not None and events.get(exp_id, 0)):
            why = sent if isinstance(sent, str) else "trace_gz: chunks were uploaded already"
            verdicts.append(Verdict(exp_id, ReportVerdict.REFUSED, error=f"{ApiError.type}: {why}"))
            continue
        uploaded = sent.checked.n_events if sent is not None else events.get(exp_id, 0)
        if item.trace_events and uploaded != item.trace_events:
            error = f"{ApiError.type}: {_trace_mismatch(item, uploaded)}"
            verdicts.append(Verdict(exp_id, ReportVerdict.REFUSED, error=error))
            continue
        taken[exp_id] = item.status
        stored.append((item, row))
        verdicts.append(Verdict(exp_id, ReportVerdict.STORED, status=item.status))
    chunks = [
        {
            "experiment_id": item.experiment_id,
            "seq": 0,
            "first_event": 0,
            "n_events": sent.checked.n_events,
            "data": sent.body,
            "event_columns": sent.checked.columns,
        }
        for item, _row in stored
        if isinstance(sent := inline.get(item.experiment_id), InlineTrace)
        and item.trace_gz is not None
    ]
    if chunks:
        session.execute(insert(TraceChunk), chunks)
    if stored:
        _store_outcomes(session, stored, now)
    for worker_id in sorted({row.worker_id for _, row in stored if row.worker_id is not None}):
        workers.seen(session, worker_id, now)
    return verdicts


def _store_outcomes(session: Session, stored: list[tuple[ReportItem, Any]], now: datetime) -> None:
    """Write outcomes whose leases were checked under lock: one UPDATE a set of columns
    (with an error, without one), run over every row, and one INSERT of the results."""
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for item, _row in stored:
        values = _finish_values(item, now)
        by_columns.setdefault(tuple(sorted(values)), []).append(
            {"b_id": item.experiment_id, **{f"b_{k}": v for k, v in values.items()}}
        )
    for columns, params in by_columns.items():
        # The table's (Core) UPDATE run over every row; the ORM's own form of it wants
        # primary keys among the values instead of a WHERE.
        table = cast(Table, Experiment.__table__)
        stmt = (
            update(table)
            .where(table.c.id == bindparam("b_id"))
            .values({k: bindparam(f"b_{k}") for k in columns})
        )
        session.execute(stmt, params)
    results = [
        {
            "experiment_id": item.experiment_id,
            "worker_id": row.worker_id,
            "attempt": row.attempts,
            "data": data,
            "created_at": now,
        }
        for item, row in stored
        if (data := _result_data(item)) is not None
    ]
    if results:
        ids = [r["experiment_id"] for r in results]
        session.execute(delete(Result).where(Result.experiment_id.in_(ids)))
        session.execute(insert(Result), results)
