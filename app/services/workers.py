"""Workers: registration, liveness, and which experiments a worker can run."""

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, literal, or_, select
from sqlalchemy.orm import Session

from app.errors import NotFound
from app.models import Experiment, Worker
from app.schemas.worker import RegisterRequest
from app.services.auth import Principal


def register(
    session: Session, req: RegisterRequest, now: datetime, registered_by: str | None = None
) -> Worker:
    worker = Worker(
        id=str(uuid.uuid4()),
        registered_by=registered_by,
        name=req.name,
        hostname=req.hostname,
        capabilities=req.capabilities.model_dump(),
        registered_at=now,
        last_seen_at=now,
        state="idle",
    )
    session.add(worker)
    return worker


def get(session: Session, worker_id: str) -> Worker:
    worker = session.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"no worker {worker_id!r}: register again")
    return worker


def may_act_as(who: Principal, worker: Worker) -> bool:
    """A worker id is usable by the token that registered it (and by admins)."""
    return who.id == worker.registered_by or who.allows("admin")


def get_for(session: Session, worker_id: str, who: Principal) -> Worker:
    """The worker, if this caller may act as it; another token's worker is not found."""
    worker = session.get(Worker, worker_id)
    if worker is None or not may_act_as(who, worker):
        raise NotFound(f"no worker {worker_id!r} of this token: register again")
    return worker


def is_live(worker: Worker, now: datetime, live_seconds: float) -> bool:
    return worker.state != "stopped" and worker.last_seen_at >= now - timedelta(
        seconds=live_seconds
    )


def list_all(session: Session) -> list[Worker]:
    return list(session.scalars(select(Worker).order_by(Worker.last_seen_at.desc())))


def live(session: Session, now: datetime, live_seconds: float) -> list[Worker]:
    cutoff = now - timedelta(seconds=live_seconds)
    stmt = select(Worker).where(Worker.last_seen_at >= cutoff, Worker.state != "stopped")
    return list(session.scalars(stmt))


def default_device(session: Session, now: datetime, live_seconds: float) -> str:
    """The device for a spec that names none: CUDA where a live worker offers it, else
    the CPU (every worker runs CPU experiments, so this never leaves work stranded)."""
    workers = live(session, now, live_seconds)
    offered = {t for w in workers for t in w.capabilities.get("device_types") or []}
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


def why_not(caps: dict[str, Any], exp: Experiment) -> str | None:
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
