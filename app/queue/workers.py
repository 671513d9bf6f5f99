"""Workers: registration, liveness, and which experiments a worker can run.

A worker's state is derived: ``stopped`` once it said it exits, ``busy`` while it
leases a running experiment, ``idle`` otherwise.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from typing import Any, Protocol

from sqlalchemy import ColumnElement, and_, func, literal, or_, select, update
from sqlalchemy.orm import Session

from app.access.tokens import Principal
from app.core.db import Reader
from app.core.errors import NotFound, WorkerTooOld
from app.queue import live_workers
from app.queue.schemas import RegisterRequest
from app.tables import Experiment, Worker
from vramlab.contract import (
    MIN_WORKER_VERSION,
    WORKER_DISTRIBUTION,
    Status,
    WorkerState,
    version_key,
)


def _server_version() -> str:
    try:
        return installed_version("vramlab")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "from a checkout"


def check_version(version: str | None) -> None:
    """Refuse a worker older than the oldest this API speaks to, naming both versions and
    what to do. A worker that says no version predates versioned registers: still taken."""
    if version is None or version_key(version) >= version_key(MIN_WORKER_VERSION):
        return
    raise WorkerTooOld(
        f"this worker is {WORKER_DISTRIBUTION} {version}; this API (vramlab "
        f"{_server_version()}) takes workers from {WORKER_DISTRIBUTION} {MIN_WORKER_VERSION} "
        f"on: upgrade the worker on its host (pip install -U '{WORKER_DISTRIBUTION}>="
        f"{MIN_WORKER_VERSION}', or its newer image) and start it again",
        details=[{"field": "version", "message": f"{version} is older than {MIN_WORKER_VERSION}"}],
    )


def register(
    session: Session, req: RegisterRequest, now: datetime, registered_by: str | None = None
) -> Worker:
    check_version(req.version)
    worker = Worker(
        id=str(uuid.uuid4()),
        registered_by=registered_by,
        name=req.name,
        hostname=req.hostname,
        capabilities=req.capabilities.model_dump(),
        registered_at=now,
        last_seen_at=now,
    )
    session.add(worker)
    live_workers.changed(session)
    return worker


def get(session: Session, worker_id: str) -> Worker:
    """A worker that may claim work: registered and not stopped."""
    worker = session.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"no worker {worker_id!r}: register again")
    if worker.stopped_at is not None:
        raise NotFound(f"worker {worker_id!r} said it stopped: register again")
    return worker


def may_act_as(who: Principal, worker: Worker) -> bool:
    """A worker id is usable by the token that registered it (and by admins)."""
    return who.id == worker.registered_by or who.allows("admin")


def may_act_for_claim(session: Session, experiment_id: str, who: Principal) -> bool:
    """Whether ``who`` may speak for the worker that claimed this experiment: true when
    nobody (or no known worker) holds it, which the lease check then settles. One
    indexed look-up of two short columns, not the experiment's row."""
    stmt = (
        select(Worker.registered_by)
        .join(Experiment, Experiment.worker_id == Worker.id)
        .where(Experiment.id == experiment_id)
    )
    found = session.execute(stmt).first()
    return found is None or who.id == found[0] or who.allows("admin")


def get_for(session: Session, worker_id: str, who: Principal) -> Worker:
    """The worker, if this caller may act as it; another token's worker is not found."""
    worker = session.get(Worker, worker_id)
    if worker is None or not may_act_as(who, worker):
        raise NotFound(f"no worker {worker_id!r} of this token: register again")
    if worker.stopped_at is not None:
        raise NotFound(f"worker {worker_id!r} said it stopped: register again")
    return worker


def seen(session: Session, worker_id: str, now: datetime) -> None:
    stmt = update(Worker).where(Worker.id == worker_id).values(last_seen_at=now)
    session.execute(stmt.execution_options(synchronize_session=False))
    live_workers.changed(session)


def stop(session: Session, worker_id: str, who: Principal, now: datetime) -> None:
    """The worker exits: it stops counting as live at once. Saying it twice is fine."""
    worker = session.get(Worker, worker_id)
    if worker is None or not may_act_as(who, worker):
        raise NotFound(f"no worker {worker_id!r} of this token")
    stmt = (
        update(Worker)
        .where(Worker.id == worker_id, Worker.stopped_at.is_(None))
        .values(stopped_at=now, last_seen_at=now)
    )
    session.execute(stmt.execution_options(synchronize_session=False))
    live_workers.changed(session)


def _live_clause(now: datetime, live_seconds: float) -> ColumnElement[bool]:
    cutoff = now - timedelta(seconds=live_seconds)
    return and_(Worker.last_seen_at >= cutoff, Worker.stopped_at.is_(None))


def is_live(worker: Worker, now: datetime, live_seconds: float) -> bool:
    return worker.stopped_at is None and worker.last_seen_at >= now - timedelta(
        seconds=live_seconds
    )


def live(session: Session, now: datetime, live_seconds: float) -> list[Worker]:
    return list(session.scalars(select(Worker).where(_live_clause(now, live_seconds))))


def count_live(session: Session, now: datetime, live_seconds: float) -> int:
    stmt = select(func.count()).select_from(Worker).where(_live_clause(now, live_seconds))
    return session.scalar(stmt) or 0


@dataclass(frozen=True)
class WorkerView:
    worker: Worker
    state: WorkerState
    current_experiment_id: str | None


def list_all(session: Session) -> list[WorkerView]:
    rows = list(session.scalars(select(Worker).order_by(Worker.last_seen_at.desc())))
    stmt = select(Experiment.worker_id, Experiment.id).where(
        Experiment.status == Status.RUNNING, Experiment.worker_id.in_([w.id for w in rows])
    )
    running = {worker_id: exp_id for worker_id, exp_id in session.execute(stmt)}
    out = []
    for w in rows:
        current = running.get(w.id)
        if w.stopped_at is not None:
            state = WorkerState.STOPPED
        else:
            state = WorkerState.BUSY if current is not None else WorkerState.IDLE
        out.append(WorkerView(w, state, current))
    return out


def default_device(session: Reader, now: datetime, live_seconds: float) -> str:
    """The device for a spec that names none: CUDA where a live worker offers it, else
    the CPU (every worker runs CPU experiments, so this never leaves work stranded)."""
    offered = {
        t
        for caps in live_workers.capabilities(session, now, live_seconds)
        for t in caps.get("device_types") or []
    }
    return "cuda" if "cuda" in offered else "cpu"


def _gpus(caps: dict[str, Any]) -> list[dict[str, Any]]:
    return list(caps.get("gpus") or [])


def runnable_clause(caps: dict[str, Any]) -> ColumnElement[bool]:
    """SQL: the experiments a worker with these capabilities can run."""
    gpus = _gpus(caps)
    names = "|".join(str(g.get("name", "")) for g in gpus).lower()
    memory = max((int(g.get("total_memory", 0)) for g in gpus), default=0)
    return and_(
        Experiment.device_type.in_(list(caps.get("device_types") or ["cpu"])),
        Experiment.gpus_needed <= len(gpus),
        or_(
            Experiment.gpu_name.is_(None),
            literal(names).contains(func.lower(Experiment.gpu_name)),
        ),
        or_(Experiment.min_memory_bytes.is_(None), Experiment.min_memory_bytes <= memory),
    )


class Needs(Protocol):
    """What a worker must offer to run an experiment: a queued one, or a spec accepted
    for queuing."""

    @property
    def device_type(self) -> str: ...
    @property
    def gpus_needed(self) -> int: ...
    @property
    def gpu_name(self) -> str | None: ...
    @property
    def min_memory_bytes(self) -> int | None: ...


def why_not(caps: dict[str, Any], exp: Needs) -> str | None:
    """Python's twin of ``runnable_clause``: None if the worker can run it, else why not."""
    gpus = _gpus(caps)
    if exp.device_type not in (caps.get("device_types") or ["cpu"]):
        return f"needs a {exp.device_type} worker"
    if exp.gpus_needed > len(gpus):
        return f"needs a worker with {exp.gpus_needed} GPU(s)"
    names = "|".join(str(g.get("name", "")) for g in gpus).lower()
    if exp.gpu_name is not None and exp.gpu_name.lower() not in names:
        return f"needs a GPU whose name contains {exp.gpu_name!r}"
    memory = max((int(g.get("total_memory", 0)) for g in gpus), default=0)
    if exp.min_memory_bytes is not None and exp.min_memory_bytes > memory:
        return f"needs a GPU with at least {exp.min_memory_bytes} bytes"
    return None
