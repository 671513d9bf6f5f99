"""Experiments: submit, read, list, cancel."""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Response

from app.api.deps import (
    ExperimentDep,
    NowDep,
    SessionDep,
    SettingsDep,
    SignalDep,
    get_db,
    require,
)
from app.contract import Status
from app.core.db import Database
from app.errors import ERROR_RESPONSES
from app.schemas.experiment import ExperimentOut, ExperimentPage
from app.schemas.spec import ExperimentSpec
from app.services import auth, experiments
from app.services.auth import Principal
from app.services.specs import AcceptedSpec, accept

router = APIRouter(prefix="/v1/experiments", tags=["experiments"], responses=ERROR_RESPONSES)


def accepted_spec(
    spec: ExperimentSpec,
    db: Annotated[Database, Depends(get_db)],
    settings: SettingsDep,
    now: NowDep,
) -> AcceptedSpec:
    """The spec checked and planned. A dependency that handlers list before SessionDep
    (FastAPI resolves them in order): planning runs before the write transaction opens.
    A spec with no device gets one from the live workers, in a short read session."""
    if spec.device is None:
        with db.session(write=False) as s:
            spec = experiments.with_device(s, spec, settings, now)
    return accept(spec, settings)


AcceptedDep = Annotated[AcceptedSpec, Depends(accepted_spec)]


@router.post("", status_code=202, response_model=ExperimentOut, summary="Queue an experiment")
def submit(
    who: Annotated[Principal, require("submit")],  # first: nothing is planned for a 401
    spec: AcceptedDep,  # before the session: planned outside the write transaction
    s: SessionDep,
    settings: SettingsDep,
    signal: SignalDep,
    now: NowDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=200,
            pattern=r"^[\x21-\x7e]+$",
            description="a key of yours: a repeated key returns the first experiment",
        ),
    ] = None,
) -> ExperimentOut:
    auth.check_priority(who, spec.spec.priority, settings)
    exp, replayed = experiments.submit_once(
        s, spec, settings, signal, now, submitted_by=who.id, idempotency_key=idempotency_key
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    queue = experiments.queue_info(s, exp, settings, now) if exp.status == Status.QUEUED else None
    return experiments.to_out(exp, queue)


@router.get(
    "",
    response_model=ExperimentPage,
    summary="List experiments, newest first",
    dependencies=[require("read")],
)
def list_experiments(
    s: SessionDep,
    status: Annotated[list[Status] | None, Query()] = None,
    op: Annotated[str | None, Query(max_length=64)] = None,
    device: Annotated[str | None, Query(max_length=16)] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    worker_id: Annotated[str | None, Query(max_length=36)] = None,
    id_prefix: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=36,
            pattern=r"^[0-9a-fA-F-]+$",
            description="experiments whose id starts with this (the 8-character ids pages print)",
        ),
    ] = None,
    kind: Annotated[Literal["experiment", "snapshot"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> ExperimentPage:
    filters = experiments.Filters(status, op, device, tag, worker_id, id_prefix, kind)
    rows, next_cursor = experiments.page(s, filters, limit, cursor)
    return ExperimentPage(items=[experiments.to_out(e) for e in rows], next_cursor=next_cursor)


@router.get(
    "/{experiment_id}",
    response_model=ExperimentOut,
    summary="One experiment",
    dependencies=[require("read")],
)
def read(exp: ExperimentDep, s: SessionDep, settings: SettingsDep, now: NowDep) -> ExperimentOut:
    queue = experiments.queue_info(s, exp, settings, now) if exp.status == Status.QUEUED else None
    return experiments.to_out(exp, queue)


@router.post(
    "/{experiment_id}/cancel",
    response_model=ExperimentOut,
    summary="Cancel",
    dependencies=[require("submit")],
)
def cancel(exp: ExperimentDep, s: SessionDep, now: NowDep) -> ExperimentOut:
    return experiments.to_out(experiments.cancel(s, exp, now))
