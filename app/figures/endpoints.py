"""What an experiment's trace shows: the peak and what held it, and a timeline figure."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app.api.deps import ExperimentDep, NonceDep, SessionDep, require
from app.core.errors import ERROR_RESPONSES
from app.figures import service as figures
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond
from app.figures.schemas import PeakOut

router = APIRouter(
    prefix="/v1/experiments",
    tags=["results"],
    responses=ERROR_RESPONSES,
    dependencies=[require("read")],
)


@router.get("/{experiment_id}/peak", response_model=PeakOut, summary="What held memory at the peak")
def peak(
    exp: ExperimentDep, s: SessionDep, top: Annotated[int, Query(ge=1, le=1000)] = 20
) -> PeakOut:
    """Replays the trace: the moment of highest allocated bytes, the blocks alive then
    (largest first, with phase and frames where recorded), and the largest blocks overall."""
    return figures.peak(s, exp, top)


@router.get(
    "/{experiment_id}/timeline",
    summary="Allocated and reserved bytes over time",
    responses=FIGURE_RESPONSES,
    response_class=Response,
)
def timeline(
    exp: ExperimentDep, s: SessionDep, nonce: NonceDep, format: FigureFormat = "html"
) -> Response:
    """Phases marked, the peak and the largest blocks labelled. ``html`` is interactive
    (hover for values) and needs no network; ``svg`` and ``png`` are drawn by matplotlib."""
    return respond(figures.timeline(s, exp), format, nonce)
