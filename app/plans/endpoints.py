"""Plans: will a model's step fit these GPUs; predicted, nothing run, no worker needed."""

import time

from fastapi import APIRouter

from app.api.deps import DatabaseDep, NowDep, SettingsDep, require
from app.core.errors import ERROR_RESPONSES
from app.gpus import service as gpus
from app.plans import service as plans
from app.plans.schemas import PlanIn, PlanOut

router = APIRouter(
    prefix="/v1/plans",
    tags=["plans"],
    responses=ERROR_RESPONSES,
    dependencies=[require("read", apart=True)],
)


@router.post("", response_model=PlanOut, summary="Will it fit: a plan for GPUs, predicted")
def create(body: PlanIn, db: DatabaseDep, settings: SettingsDep, now: NowDep) -> PlanOut:
    """Per GPU (or ``capacity_bytes``) and variant: the step's predicted peak and what
    held it, whether it fits the card's usable memory and by how much, the largest
    ``vary`` predicted to fit; and what would make it fit, most bytes saved first. Nothing
    runs: no worker is needed and the experiment cap does not apply (a plan's own bounds:
    its size and its time)."""
    with db.session(write=False) as s:
        live = gpus.worker_cards(s, now, settings.worker_live_seconds)
    return plans.plan(body, live, plans.predictor_of(settings), time.monotonic)
