"""Fit searches: the largest batch size or sequence length that fits a capacity."""

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from app.access.tokens import Principal
from app.api.deps import SHORT_ID, NonceDep, NowDep, SessionDep, SettingsDep, get_db, require
from app.core.db import Database
from app.core.errors import ERROR_RESPONSES
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond
from app.fits import service as fits
from app.fits.engine import FitWake
from app.fits.schemas import FitIn, FitOut, FitPage
from app.queue import local_worker, workers
from app.tables import Fit
from vramlab.contract import FitStatus

router = APIRouter(prefix="/v1/fits", tags=["fits"], responses=ERROR_RESPONSES)
FitId = Annotated[str, Path(max_length=64, description=SHORT_ID)]


def get_wake(request: Request) -> FitWake:
    wake: FitWake = request.app.state.fit_wake
    return wake


def planned_fit(
    body: FitIn,
    db: Annotated[Database, Depends(get_db)],
    settings: SettingsDep,
    now: NowDep,
) -> Fit:
    """Every input checked in a short read session, before the handler's SessionDep opens
    the write transaction; a hub id fetched after the caller was checked (``create``
    lists them first)."""
    body = fits.with_hub_config(body, settings)
    with db.session(write=False) as s:
        device = workers.default_device(s, now, settings.worker_live_seconds)
        return fits.plan(body, s, settings, device, now)


@router.post(
    "",
    status_code=202,
    response_model=FitOut,
    summary="Search what fits",
    dependencies=[Depends(local_worker.wait_for_it)],
)
def create(
    who: Annotated[Principal, require("submit")],
    fit: Annotated[Fit, Depends(planned_fit)],
    s: SessionDep,
    wake: Annotated[FitWake, Depends(get_wake)],
    now: NowDep,
) -> FitOut:
    """Queue a search for the largest ``vary`` (batch_size or seq_len) whose step fits
    ``capacity_bytes`` (or the named GPU's memory), per variant: predicted first, then
    measured by trials, each an ordinary experiment."""
    return fits.create(s, fit, wake, now, submitted_by=who.id)


@router.get("", response_model=FitPage, summary="List fits", dependencies=[require("read")])
def list_fits(
    s: SessionDep,
    status: Annotated[FitStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> FitPage:
    """Newest first."""
    rows, next_cursor = fits.page(s, limit, cursor, status)
    return FitPage(items=[fits.summary(f) for f in rows], next_cursor=next_cursor)


@router.get(
    "/{fit_id}", response_model=FitOut, summary="A fit's answer", dependencies=[require("read")]
)
def read(fit_id: FitId, s: SessionDep) -> FitOut:
    """Per variant: the largest fitting value measured, the first failing one, the
    prediction, and every trial."""
    return fits.read(s, fits.get(s, fit_id))


@router.post(
    "/{fit_id}/cancel",
    response_model=FitOut,
    summary="Cancel a fit and its unfinished trials",
    dependencies=[require("submit")],
)
def cancel(fit_id: FitId, s: SessionDep, now: NowDep) -> FitOut:
    return fits.read(s, fits.cancel(s, fits.get(s, fit_id), now))


@router.get(
    "/{fit_id}/plot",
    summary="Peak bytes against the varied value",
    responses=FIGURE_RESPONSES,
    response_class=Response,
    dependencies=[require("read")],
)
def plot(fit_id: FitId, s: SessionDep, nonce: NonceDep, format: FigureFormat = "html") -> Response:
    return respond(fits.chart(fits.read(s, fits.get(s, fit_id))), format, nonce)
