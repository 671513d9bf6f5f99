"""Experiments: submit, read, list, cancel."""

from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import (
    AuthenticateFirst,
    ExperimentDep,
    NowDep,
    OneTripDep,
    SessionDep,
    SettingsDep,
    require,
)
from app.catalog import CatalogError
from app.core.errors import ERROR_RESPONSES, InvalidSpec
from app.experiments import predictor as predictor_service
from app.experiments import service as experiments
from app.experiments import submissions
from app.experiments import views as experiment_views
from app.experiments.predictor import INTERNAL
from app.experiments.schemas import ExperimentOut, ExperimentPage
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import MODEL_OP
from app.queue import local_worker
from vramlab.contract import Status

router = APIRouter(
    prefix="/v1/experiments",
    tags=["experiments"],
    responses=ERROR_RESPONSES,
    route_class=AuthenticateFirst,
)


@router.post("", status_code=202, response_model=ExperimentOut, summary="Queue an experiment")
async def submit(
    spec: ExperimentSpec,
    trip: OneTripDep,
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
    local = local_worker.of(trip.request)
    await local.ready()  # `vramlab up`'s worker, while it starts: it chooses the device
    # The caller's look-up, planning, the insert and the commit in one trip to the thread
    # pool (app/experiments/submissions.py); a model spec's prediction is awaited before
    # it, holding no thread.
    caller = partial(trip.principal, scope="submit")
    if spec.op == MODEL_OP:  # a hub id's config.json, fetched here: the worker gets data
        spec = await run_in_threadpool(
            submissions.with_hub_config, trip.db, caller, spec, trip.settings
        )
    predicted, submitter, predict_for = None, INTERNAL, None
    if spec.op == MODEL_OP and trip.settings.model_predictions:
        address = trip.request.client.host if trip.request.client else None
        prepared = await run_in_threadpool(
            submissions.prepare, trip.db, caller, spec, trip.settings, trip.now, address
        )
        spec, question, submitter = prepared.spec, prepared.question, prepared.submitter
        predict_for = prepared.predict_for
        predictor = predictor_service.shared(trip.settings)
        if question is not None and predictor is not None:
            try:
                predicted = await predictor.apredict(
                    question.params, question.device_type, question.allocator, submitter
                )
            except CatalogError as exc:
                raise InvalidSpec(exc.field, exc.message) from None
    out, replayed = await run_in_threadpool(
        submissions.submit,
        trip.db,
        caller,
        spec,
        trip.settings,
        trip.signal,
        trip.now,
        idempotency_key,
        predicted,
        submitter,
        predict_for,
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    if local.starting and out.queue is not None and not out.queue.live_workers:
        out.queue.reason = local_worker.STARTING
    return out


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
    return ExperimentPage(items=[experiment_views.to_out(e) for e in rows], next_cursor=next_cursor)


@router.get(
    "/{experiment_id}",
    response_model=ExperimentOut,
    summary="One experiment",
    dependencies=[require("read")],
)
def read(exp: ExperimentDep, s: SessionDep, settings: SettingsDep, now: NowDep) -> ExperimentOut:
    return experiments.answer(s, exp, settings, now)


@router.post(
    "/{experiment_id}/cancel",
    response_model=ExperimentOut,
    summary="Cancel",
    dependencies=[require("submit")],
)
def cancel(exp: ExperimentDep, s: SessionDep, now: NowDep) -> ExperimentOut:
    return experiment_views.to_out(experiments.cancel(s, exp, now))
