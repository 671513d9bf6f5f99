"""The GPU catalog: the cards a plan may name, and live workers' own."""

from fastapi import APIRouter

from app.api.deps import NowDep, SessionDep, SettingsDep, require
from app.core.errors import ERROR_RESPONSES
from app.gpus import service as gpus
from app.gpus.schemas import GpuList

router = APIRouter(
    prefix="/v1/gpus", tags=["gpus"], responses=ERROR_RESPONSES, dependencies=[require("read")]
)


@router.get("", response_model=GpuList, summary="GPUs, their usable memory and what changes bytes")
def list_gpus(s: SessionDep, settings: SettingsDep, now: NowDep) -> GpuList:
    """The catalog's CUDA cards, then each live worker's own GPU. ``usable_bytes`` is what
    a PyTorch process's caching allocator may reserve (``capacity_bytes``' scale);
    ``usable_source`` says whether it was measured. GB = 10^9 bytes, GiB = 2^30."""
    cards = gpus.listing(s, now, settings.worker_live_seconds)
    return GpuList(items=[gpus.to_out(c) for c in cards])
