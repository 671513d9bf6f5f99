"""Workers as operators see them."""

from fastapi import APIRouter

from app.api.deps import NowDep, SessionDep, SettingsDep, require
from app.schemas.worker import WorkerOut
from app.services import workers

router = APIRouter(prefix="/v1/workers", tags=["workers"], dependencies=[require("read")])


@router.get("", response_model=list[WorkerOut], summary="Workers, their capabilities and liveness")
def list_workers(s: SessionDep, settings: SettingsDep, now: NowDep) -> list[WorkerOut]:
    return [
        WorkerOut(
            id=w.id,
            name=w.name,
            hostname=w.hostname,
            capabilities=w.capabilities,
            state=w.state,
            live=workers.is_live(w, now, settings.worker_live_seconds),
            current_experiment_id=w.current_experiment_id,
            registered_at=w.registered_at,
            last_seen_at=w.last_seen_at,
        )
        for w in workers.list_all(s)
    ]
