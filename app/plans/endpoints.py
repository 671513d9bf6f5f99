"""Plans: will a model's step fit these GPUs; predicted, nothing run, no worker needed."""

import time
from typing import Annotated

from fastapi import APIRouter, Request

from app.access.tokens import Principal
from app.api.deps import DatabaseDep, NowDep, SettingsDep, require
from app.core.errors import ERROR_RESPONSES
from app.gpus import service as gpus
from app.plans import service as plans
from app.plans.schemas import PlanIn, PlanOut

router = APIRouter(
    prefix="/v1/plans",
    tags=["plans"],
    responses=ERROR_RESPONSES,
)


@router.post("", response_model=PlanOut, summary="Will it fit: a plan for GPUs, predicted")
def create(
    body: PlanIn,
    who: Annotated[Principal, require("read", apart=True)],
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    now: NowDep,
) -> PlanOut:
    """Per GPU (or ``capacity_bytes``) and variant: the step's predicted peak and what
    held it, whether it fits the card's usable memory and by how much, the largest
    ``vary`` predicted to fit; and what would make it fit, most bytes saved first. Nothing
    runs: no worker is needed and the experiment cap does not apply (a plan's own bounds:
    its size and its time)."""
    body = plans.with_hub_configs(body, settings)  # the caller was checked: fetch now
    with db.session(write=False) as s:
        live = gpus.worker_cards(s, now, settings.worker_live_seconds)
    predict = plans.predictor_of(settings, submitter(who, request))
    return plans.plan(body, live, predict, time.monotonic)


def submitter(who: Principal, request: Request) -> str:
    """Whose turn a plan's predictions take: its token, or its address when tokens are
    off (as a submit's)."""
    if who.id is not None:
        return f"token:{who.id}"
    return f"address:{request.client.host if request.client else 'unknown'}"
