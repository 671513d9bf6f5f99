"""Sweeps: queue a grid of specs, follow its progress, read its table and plot."""

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import PlainTextResponse, Response

from app.api.deps import NowDep, SessionDep, SettingsDep, SignalDep, require
from app.api.figures import FIGURE_RESPONSES, FigureFormat, respond
from app.errors import ERROR_RESPONSES
from app.schemas.results import SweepIn, SweepOut
from app.services import sweeps
from app.services.auth import Principal

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=ERROR_RESPONSES)
SweepId = Annotated[str, Path(max_length=64)]


@router.post("", status_code=202, response_model=SweepOut, summary="Queue a grid of experiments")
def create(
    body: SweepIn,
    s: SessionDep,
    settings: SettingsDep,
    signal: SignalDep,
    now: NowDep,
    who: Annotated[Principal, require("submit")],
) -> SweepOut:
    """Every point is checked as ``POST /v1/experiments`` checks a spec; if one is invalid,
    nothing is queued and the 422 names the point and the field."""
    sweep = sweeps.create(s, body, settings, signal, now, submitted_by=who.id)
    s.flush()
    return sweeps.read(s, sweep)


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
def plot(sweep_id: SweepId, s: SessionDep, format: FigureFormat = "html") -> Response:
    return respond(sweeps.chart(sweeps.read(s, sweeps.get(s, sweep_id))), format)
