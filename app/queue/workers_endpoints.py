"""Workers as operators see them."""

from fastapi import APIRouter

from app.api.deps import NowDep, SessionDep, SettingsDep, require
from app.queue import workers
from app.queue.schemas import WorkerOut

router = APIRouter(prefix="/v1/workers", tags=["workers"], dependencies=[require("read")])


@router.get("", response_model=list[WorkerOut], summary="Workers, their capabilities and liveness")
def list_workers(s: SessionDep, settings: SettingsDep, now: NowDep) -> list[WorkerOut]:
    return [
        WorkerOut(
            id=v.worker.id,
            name=v.worker.name,
            hostname=v.worker.hostname,
            capabilities=v.worker.capabilities,
            state=v.state,
            live=workers.is_live(v.worker, now, settings.worker_live_seconds),
            current_experiment_id=v.current_experiment_id,
            registered_at=v.worker.registered_at,
            last_seen_at=v.worker.last_seen_at,
        )
        for v in workers.list_all(s)
    ]
