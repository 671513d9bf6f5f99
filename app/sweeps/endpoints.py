"""Sweeps: queue a grid of specs, follow its progress, read its table and plot."""

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

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
from app.core.signals import wait_for
from app.experiments.specs import AcceptedSpec
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond
from app.queue import local_worker, workers
from app.sweeps import service as sweeps
from app.sweeps.changes import CHANGES, LOOK_AGAIN_SECONDS
from app.sweeps.schemas import SweepIn, SweepOut, SweepProgress

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=ERROR_RESPONSES)
SweepId = Annotated[str, Path(max_length=64, description=SHORT_ID)]


def planned_sweep(
    body: SweepIn,
    db: Annotated[Database, Depends(get_db)],
    settings: SettingsDep,
    now: NowDep,
) -> tuple[SweepIn, list[AcceptedSpec]]:
    """Every point checked and planned, before the handler's SessionDep opens the write
    transaction (FastAPI resolves dependencies in the order the handler lists them: the
    caller is checked before a hub id the spec names is fetched)."""
    body = sweeps.with_hub_config(body, settings)

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
    sweep_id: SweepId,
    s: SessionDep,
    format: Literal["json", "csv"] = "json",
    offset: Annotated[int, Query(ge=0, le=sweeps.MAX_POINTS)] = 0,
    limit: Annotated[int, Query(ge=1, le=sweeps.MAX_POINTS)] = sweeps.MAX_POINTS,
) -> SweepOut | Response:
    """One row per point: its grid values, measured delta, peak and reserved bytes, the
    prediction, time and status; every point by default, or a page of them (``offset``,
    ``limit``; ``next_offset`` says where the next starts). ``format=csv`` gives the table
    alone. To follow a running sweep, read ``/progress``: it costs the same at any size."""
    out = sweeps.read(s, sweeps.get(s, sweep_id), offset, limit)
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


MAX_WAIT_SECONDS = 30.0


def _progress(db: Database, sweep_id: str) -> SweepProgress:
    with db.session(write=False) as s:
        return sweeps.progress_of(s, sweep_id)


@router.get(
    "/{sweep_id}/progress",
    response_model=SweepProgress,
    summary="A sweep's counts by status, at once or at their next change",
    dependencies=[require("read", apart=True)],
)
async def progress(
    sweep_id: SweepId,
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    seen: Annotated[
        str | None,
        Query(max_length=200, description="a ``version`` read before: answer when it changes"),
    ] = None,
    wait: Annotated[
        float,
        Query(ge=0, le=MAX_WAIT_SECONDS, description="with ``seen``: wait up to this long"),
    ] = 0.0,
) -> SweepProgress:
    """Counts by status and whether the sweep is done: two reads by key, whatever the
    sweep's size. With ``seen`` and ``wait``, a long-poll: the answer comes when the counts
    differ from ``seen`` (or the sweep is done), or after ``wait`` seconds as they stand.
    While it waits it holds no thread and no database connection."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        ticket = CHANGES.enlist()  # before reading, so no commit slips between
        try:
            out = await run_in_threadpool(_progress, db, sweep_id)
            remaining = deadline - loop.time()
            if seen is None or out.version != seen or out.done or remaining <= 0:
                return out
            if await request.is_disconnected():
                return out
            await wait_for(ticket, min(remaining, LOOK_AGAIN_SECONDS))
        finally:
            CHANGES.leave(ticket)
