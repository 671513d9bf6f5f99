"""Experiments as clients see them: submit, look up, list, cancel."""

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Insert,
    Select,
    Table,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core import cursors, ids
from app.core.config import Settings
from app.core.db import Reader
from app.core.errors import Conflict, NotFound, TooManyRequests
from app.core.signals import WorkSignal
from app.experiments import views
from app.experiments.schemas import ExperimentOut, QueueInfo
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import AcceptedSpec
from app.queue import live_workers, workers
from app.queue import service as queue
from app.tables import Experiment, ExperimentTag, SubmitterQueue
from app.tables.submitter_queue import OPEN_SUBMITTER
from vramlab.contract import Status

CANCEL_TRIES = 3
# Core statements: the ORM's unit of work would cost more than the insert itself.
_INSERT_EXPERIMENT = insert(cast(Table, Experiment.__table__))
_INSERT_TAG = insert(cast(Table, ExperimentTag.__table__))


def submit(
    session: Session,
    accepted: AcceptedSpec,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    *,
    submitted_by: str | None = None,
    idempotency_key: str | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """Queue an accepted spec in the caller's transaction (``insert_queued``) and return
    the row inserted; waiting workers wake once it commits."""
    row = insert_queued(
        session.connection(),
        accepted,
        settings,
        now,
        submitted_by=submitted_by,
        idempotency_key=idempotency_key,
        preset=preset,
    )
    signal.after_commit(session, 1)
    return row


def insert_queued(
    conn: Connection,
    accepted: AcceptedSpec,
    settings: Settings,
    now: datetime,
    *,
    submitted_by: str | None = None,
    idempotency_key: str | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """Insert a queued experiment for an accepted spec on ``conn``, in its transaction,
    unless its submitter already has as many queued as allowed (429); the row inserted.
    The spec was planned (``specs.accept``) before the transaction began. One INSERT
    that checks the quota too, and one for the tags: no ORM object to flush, and nothing
    to read back (``queued_out`` answers from the row). Whoever commits wakes the
    waiting workers (``WorkSignal``)."""
    row = columns(accepted, now, submitted_by=submitted_by, preset=preset)
    row["idempotency_key"] = idempotency_key
    quota = {"cap": settings.max_queued_per_token, "who": _submitter_key(submitted_by)}
    stmt = _insert_within_quota(tuple(row))
    if cast(CursorResult[Any], conn.execute(stmt, {**row, **quota})).rowcount != 1:
        check_quota(conn, submitted_by, settings)  # 429, saying how many are queued
        conn.execute(_INSERT_EXPERIMENT, row)  # the queue moved on meanwhile
    if accepted.spec.tags:
        conn.execute(
            _INSERT_TAG,
            [{"experiment_id": row["id"], "tag": t, "created_at": now} for t in accepted.spec.tags],
        )
    return row


@functools.lru_cache(maxsize=4)
def _insert_within_quota(names: tuple[str, ...]) -> Insert:
    """INSERT one experiment (the columns ``names``, each a parameter) if its submitter
    ``:who`` has fewer than ``:cap`` queued: the quota check and the insert in one
    statement, one round trip."""
    table = cast(Table, Experiment.__table__)
    values = select(*(bindparam(n, type_=table.c[n].type) for n in names)).where(
        _QUEUED_OF.scalar_subquery() < bindparam("cap")
    )
    # Whether it inserted is its row count, which SQLAlchemy reads for an INSERT only
    # when asked to.
    stmt = insert(table).from_select(list(names), values)
    return stmt.execution_options(preserve_rowcount=True)


def with_device(
    session: Reader, spec: ExperimentSpec, settings: Settings, now: datetime
) -> ExperimentSpec:
    """The spec with its device: as given, or one that a live worker offers."""
    if spec.device is not None:
        return spec
    device = workers.default_device(session, now, settings.worker_live_seconds)
    return spec.model_copy(update={"device": device})


def columns(
    accepted: AcceptedSpec,
    now: datetime,
    *,
    submitted_by: str | None = None,
    preset: str | None = None,
    sweep_id: str | None = None,
    fit_id: str | None = None,
) -> dict[str, Any]:
    """A queued experiment's columns, for an ORM object or a bulk insert."""
    s = accepted.spec
    return {
        "id": str(uuid.uuid4()),
        "status": Status.QUEUED,
        "op": s.op,
        "shape": list(s.shape),
        "params": s.params,
        "dtype": s.dtype,
        "device": s.device,
        "device_type": accepted.device_type,
        "gpus_needed": accepted.gpus_needed,
        "gpu_name": s.requirements.gpu_name,
        "min_memory_bytes": s.requirements.min_memory_bytes,
        "warmup": s.warmup,
        "repeat": s.repeat,
        "timeout_s": s.timeout_s,
        "allocator": s.allocator.model_dump(exclude_none=True),
        "trace_mode": s.trace,
        "isolation": s.isolation,
        "priority": s.priority,
        "prediction": accepted.prediction,
        "created_at": now,
        "available_at": now,
        "steps": s.steps,
        "preset": preset,
        "sweep_id": sweep_id,
        "fit_id": fit_id,
        "submitted_by": submitted_by,
    }


def _queued_of() -> Select[int]:
    """How many experiments the submitter ``:who`` has queued: one row that the database
    keeps exact (``SubmitterQueue``), so the check costs the same however long the
    queue; a submitter with no row has none queued."""
    count = select(SubmitterQueue.queued).where(SubmitterQueue.submitter == bindparam("who"))
    return select(func.coalesce(count.scalar_subquery(), 0))


# Built once: on SQLite, building a statement costs more than running it.
_QUEUED_OF = _queued_of()


def _submitter_key(submitted_by: str | None) -> str:
    return OPEN_SUBMITTER if submitted_by is None else submitted_by


def check_quota(
    session: Reader, submitted_by: str | None, settings: Settings, adding: int = 1
) -> None:
    """Refuse (429) a submitter that already has as many queued experiments as allowed."""
    cap = settings.max_queued_per_token
    queued = session.scalar(_QUEUED_OF, {"who": _submitter_key(submitted_by)}) or 0
    if queued + adding > cap:
        raise TooManyRequests(
            f"{queued} experiments of yours are queued and {adding} more were asked for; at most "
            f"{cap} may wait at once (VRAMLAB_MAX_QUEUED_PER_TOKEN)",
            headers={"Retry-After": "30"},
        )


def _by_key(session: Session, scoped_key: str) -> Experiment | None:
    return session.scalar(select(Experiment).where(Experiment.idempotency_key == scoped_key))


def submit_once(
    session: Session,
    accepted: AcceptedSpec,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    *,
    submitted_by: str | None,
    idempotency_key: str | None,
) -> tuple[ExperimentOut, bool]:
    """Submit and answer, unless this submitter already used this Idempotency-Key: then
    answer the first experiment, and True (replayed). Keys are namespaced by the
    submitter."""
    scoped = None if idempotency_key is None else f"{submitted_by or '-'}:{idempotency_key}"
    if scoped is not None and (first := _by_key(session, scoped)) is not None:
        return answer(session, first, settings, now), True
    if scoped is None:
        row = submit(session, accepted, settings, signal, now, submitted_by=submitted_by)
    else:
        try:
            # A savepoint: if a concurrent request with the same key commits first, the
            # unique index refuses this insert and the transaction goes on to return that one.
            with session.begin_nested():
                row = submit(
                    session,
                    accepted,
                    settings,
                    signal,
                    now,
                    submitted_by=submitted_by,
                    idempotency_key=scoped,
                )
        except IntegrityError:
            if (first := _by_key(session, scoped)) is None:
                raise
            return answer(session, first, settings, now), True
    return views.queued_out(row, accepted, queue_info(session, accepted, settings, now)), False


def get(session: Session, experiment_id: str, field: str = "experiment_id") -> Experiment:
    """By its id or a unique prefix of it (``app.core.ids``)."""
    found: Experiment = ids.resolve(
        session, Experiment, experiment_id, noun="experiment", field=field
    )
    return found


def cancel(session: Session, exp: Experiment, now: datetime) -> Experiment:
    """Cancel at once if queued; if running, ask its worker to stop (it reports back).

    Each step is a compare-and-set on the status it expects: a claim that commits
    between the look-up and the write makes the first one miss, and the second one asks
    the new worker to stop instead of overwriting its lease.
    """
    for _ in range(CANCEL_TRIES):
        if queue.transition(
            session, exp.id, Status.QUEUED, status=Status.CANCELLED, finished_at=now
        ):
            break
        if queue.transition(session, exp.id, Status.RUNNING, cancel_requested=True):
            break
        current = session.scalar(select(Experiment.status).where(Experiment.id == exp.id))
        if current is None:
            raise NotFound(f"no experiment {exp.id!r}")
        if Status(current).finished:
            raise Conflict(f"experiment {exp.id} is already {current}")
    else:
        raise Conflict(f"experiment {exp.id} keeps changing state; try again")
    session.refresh(exp)
    return exp


@dataclass(frozen=True)
class Filters:
    status: Sequence[Status] | None = None
    op: str | None = None
    device: str | None = None
    tag: str | None = None
    worker_id: str | None = None
    id_prefix: str | None = None
    kind: str | None = None


def page(
    session: Session, filters: Filters, limit: int, cursor: str | None
) -> tuple[list[Experiment], str | None]:
    """Newest first; the cursor is the last item's (created_at, id).

    With a tag, the page is read through the tag's rows, which carry their experiment's
    created_at: one walk down ``ix_experiment_tags_newest``, as short for a tag on one
    experiment in a thousand as for one on every experiment, on both engines.
    """
    stmt = select(Experiment)
    created, ident = Experiment.created_at, Experiment.id
    if filters.tag:
        stmt = stmt.join(
            ExperimentTag,
            and_(ExperimentTag.experiment_id == Experiment.id, ExperimentTag.tag == filters.tag),
        )
        created, ident = ExperimentTag.created_at, ExperimentTag.experiment_id
    if filters.status:
        stmt = stmt.where(Experiment.status.in_(filters.status))
    if filters.op:
        stmt = stmt.where(Experiment.op == filters.op)
    if filters.device:
        stmt = stmt.where(Experiment.device == filters.device)
    if filters.worker_id:
        stmt = stmt.where(Experiment.worker_id == filters.worker_id)
    if filters.id_prefix:
        # Ids are lower-case UUIDs; the schema admits only [0-9a-f-], so no LIKE wildcards.
        stmt = stmt.where(Experiment.id.startswith(filters.id_prefix.lower()))
    if filters.kind:
        stmt = stmt.where(Experiment.kind == filters.kind)
    if cursor:
        at, last_id = cursors.decode(cursor)
        stmt = stmt.where(or_(created < at, and_(created == at, ident < last_id)))
    stmt = stmt.order_by(created.desc(), ident.desc()).limit(limit + 1)
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (cursors.encode(rows[-1].created_at, rows[-1].id) if more and rows else None)


def queue_info(
    session: Reader, needs: workers.Needs, settings: Settings, now: datetime
) -> QueueInfo:
    """Whether a live worker can run an experiment with these needs, and if not, why."""
    live = live_workers.capabilities(session, now, settings.worker_live_seconds)
    reasons = [workers.why_not(caps, needs) for caps in live]
    if any(r is None for r in reasons):
        return QueueInfo(runnable=True, live_workers=len(live))
    if not live:
        reason = "no live worker is connected; start one with `vramlab worker`"
    else:
        reason = f"no live worker can run it: it {reasons[0]}"
    return QueueInfo(runnable=False, live_workers=len(live), reason=reason)


def answer(session: Session, exp: Experiment, settings: Settings, now: datetime) -> ExperimentOut:
    """An experiment as clients read it; while it is queued, whether a live worker can
    run it."""
    queued = exp.status == Status.QUEUED
    return views.to_out(exp, queue_info(session, exp, settings, now) if queued else None)
