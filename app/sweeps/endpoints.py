"""Sweeps: queue a grid of specs, follow its progress, read its table and plot."""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path
from fastapi.responses import PlainTextResponse, Response

from app.access import tokens as auth
from app.access.tokens import Principal
from app.api.deps import (
    SHORT_ID,
    NonceDep,
    NowDep,
    SessionDep,
    SettingsDep,
    SignalDep,
    get_db,
    require,
)
from app.core.db import Database
from app.core.errors import ERROR_RESPONSES
from app.experiments.specs import AcceptedSpec
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond
from app.queue import local_worker, workers
from app.sweeps import service as sweeps
from app.sweeps.schemas import SweepIn, SweepOut

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=ERROR_RESPONSES)
SweepId = Annotated[str, Path(max_length=64, description=SHORT_ID)]


def planned_sweep(
    body: SweepIn,
    db: Annotated[Database, Depends(get_db)],
    settings: SettingsDep,
    now: NowDep,
) -> tuple[SweepIn, list[AcceptedSpec]]:
    """Every point checked and planned, before the handler's SessionDep opens the write
    transaction (FastAPI resolves dependencies in the order the handler lists them)."""

    def default_device() -> str:  # for points with no device: a short read session
        with db.session(write=False) as s:
            return workers.default_device(s, now, settings.worker_live_seconds)

    return body, sweeps.plan(body, settings, default_device)


@router.post(
    "",
    status_code=202,
    response_model=SweepOut,
    summary="Queue a grid of experiments",
    dependencies=[Depends(local_worker.wait_for_it)],
)
def create(
    who: Annotated[Principal, require("submit")],
    planned: Annotated[tuple[SweepIn, list[AcceptedSpec]], Depends(planned_sweep)],
    s: SessionDep,
    settings: SettingsDep,
    signal: SignalDep,
    now: NowDep,
) -> SweepOut:
    """Every point is checked as ``POST /v1/experiments`` checks a spec; if one is invalid,
    nothing is queued and the 422 names the point and the field."""
    body, points = planned
    auth.check_priority(who, max((p.spec.priority for p in points), default=0), settings)
    return sweeps.create(s, body, points, settings, signal, now, submitted_by=who.id)


@router.get(
    "/{sweep_id}",
    response_model=SweepOut,
    summary="A sweep's progress and table",
    responses={200: {"content": {"text/csv": {}}}},
    dependencies=[require("read")],
)
def read(
    sweep_id: SweepId, s: SessionDep, format: Literal["json", "csv"] = "json"
) -> SweepOut | Response:
    """One row per point: its grid values, measured delta, peak and reserved bytes, the
    prediction, time and status. ``format=csv`` gives the table alone."""
    out = sweeps.read(s, sweeps.get(s, sweep_id))
    if format == "csv":
        return PlainTextResponse(sweeps.to_csv(out), media_type="text/csv")
    return out


@router.get(
    "/{sweep_id}/plot",
    summary="Peak and delta bytes against size",
    responses=FIGURE_RESPONSES,
    response_class=Response,
    dependencies=[require("read")],
)
def plot(
    sweep_id: SweepId, s: SessionDep, nonce: NonceDep, format: FigureFormat = "html"
) -> Response:
    return respond(sweeps.chart(sweeps.read(s, sweeps.get(s, sweep_id))), format, nonce)
