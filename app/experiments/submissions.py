"""Queuing one experiment for a request (POST /v1/experiments), in one trip to the
thread pool.

FastAPI runs each synchronous dependency, the handler, the commit and the check of the
answer in a trip of its own to the thread pool, and on a busy machine a trip costs about
what a statement does. Here the caller's look-up, the device, planning, the quota, the
insert and the commit run together, in the order that keeps each bound: nothing is
planned for a caller who is refused, and planning runs before the write transaction
(on SQLite, the caller and the device are read in a short read transaction first, so
that the write slot is held for the quota and the insert alone).

A model spec is predicted first (``prepare``, then the endpoint awaits the predictor without
a thread), and its answer is handed to ``submit``: a submit that waits for a prediction
holds neither a thread nor a database connection while it waits.

Every statement of a submit without an Idempotency-Key is Core, run on Core connections
(``Database.transaction``): an ORM session costs several times what SQLite takes to run
a short statement. A keyed submit, which may answer an earlier experiment read back,
runs in a session.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from app.access import tokens as auth
from app.catalog import hub
from app.core.config import Settings
from app.core.db import Database, Reader
from app.core.signals import WorkSignal
from app.experiments import service as experiments
from app.experiments import views
from app.experiments.predictor import INTERNAL, ModelPrediction
from app.experiments.schemas import ExperimentOut
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import (
    AcceptedSpec,
    ModelQuestion,
    accept,
    model_question,
    predict_device,
)


@dataclass(frozen=True)
class Prepared:
    """A model spec checked before its prediction: its device chosen, what the predictor
    is asked (None: nothing), and who asks (a token's id, or an address)."""

    spec: ExperimentSpec
    question: ModelQuestion | None
    submitter: str
    predict_for: str | None = None


def prepare(
    db: Database,
    caller: Callable[[Reader], auth.Principal],
    spec: ExperimentSpec,
    settings: Settings,
    now: datetime,
    address: str | None,
) -> Prepared:
    """Check a model spec's caller and everything but its prediction (InvalidSpec, 401,
    403 before any prediction is asked)."""
    with db.transaction(write=False) as read:
        who, resolved = _caller_and_device(read, caller, spec, settings, now)
    accepted = accept(resolved, settings, predict_models=False)
    submitter = f"token:{who.id}" if who.id is not None else f"address:{address or INTERNAL}"
    predict_for = predict_device(spec, resolved)
    return Prepared(resolved, model_question(accepted, predict_for), submitter, predict_for)


def with_hub_config(
    db: Database,
    caller: Callable[[Reader], auth.Principal],
    spec: ExperimentSpec,
    settings: Settings,
) -> ExperimentSpec:
    """A model spec that names a hub id, with the id's config.json as its ``config_json``
    (app/catalog/hub.py): the caller is checked first, so that no one who would be refused
    makes the service reach the hub; any other spec as it is."""
    if not hub.names_hub_id(spec.params):
        return spec
    with db.transaction(write=False) as read:
        caller(read)
    return spec.model_copy(update={"params": hub.resolve_params(spec.params, settings)})


def submit(
    db: Database,
    caller: Callable[[Reader], auth.Principal],
    spec: ExperimentSpec,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    idempotency_key: str | None,
    predicted: ModelPrediction | None = None,
    submitter: str = INTERNAL,
    predict_for: str | None = None,
) -> tuple[ExperimentOut, bool]:
    """Queue ``spec`` for the caller (``caller`` looks them up and checks their scope)
    and commit; the answer, and whether it replays an earlier submit with the same
    Idempotency-Key. ``predicted``: a model spec's prediction, asked already (for the
    device type ``predict_for``, where ``prepare`` chose one other than the one it runs on)."""
    if idempotency_key is not None:
        return _submit_keyed(
            db,
            caller,
            spec,
            settings,
            signal,
            now,
            idempotency_key,
            predicted,
            submitter,
            predict_for,
        )
    if db.is_sqlite:
        with db.transaction(write=False) as read:
            who, resolved = _caller_and_device(read, caller, spec, settings, now)
        accepted = _accept(spec, resolved, settings, predicted, submitter, predict_for)
        with db.transaction() as conn:
            queue = experiments.queue_info(conn, accepted, settings, now)
            row = experiments.insert_queued(conn, accepted, settings, now, submitted_by=who.id)
    else:  # one connection, one transaction
        with db.transaction() as conn:
            who, resolved = _caller_and_device(conn, caller, spec, settings, now)
            accepted = _accept(spec, resolved, settings, predicted, submitter, predict_for)
            queue = experiments.queue_info(conn, accepted, settings, now)
            # The insert last: it locks the submitter's queued count until the commit.
            row = experiments.insert_queued(conn, accepted, settings, now, submitted_by=who.id)
    signal.notify(1)  # committed: wake a waiting claim here, and every replica's
    return views.queued_out(row, accepted, queue), False


def _caller_and_device(
    read: Reader,
    caller: Callable[[Reader], auth.Principal],
    spec: ExperimentSpec,
    settings: Settings,
    now: datetime,
) -> tuple[auth.Principal, ExperimentSpec]:
    who = caller(read)
    auth.check_priority(who, spec.priority, settings)
    return who, experiments.with_device(read, spec, settings, now)


def _submit_keyed(
    db: Database,
    caller: Callable[[Reader], auth.Principal],
    spec: ExperimentSpec,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    idempotency_key: str,
    predicted: ModelPrediction | None,
    submitter: str,
    predict_for: str | None = None,
) -> tuple[ExperimentOut, bool]:
    with db.session() as s:
        with db.reads_before_writing(s) as read:
            who, resolved = _caller_and_device(read, caller, spec, settings, now)
        accepted = _accept(spec, resolved, settings, predicted, submitter, predict_for)
        return experiments.submit_once(
            s,
            accepted,
            settings,
            signal,
            now,
            submitted_by=who.id,
            idempotency_key=idempotency_key,
        )


def _accept(
    given: ExperimentSpec,
    resolved: ExperimentSpec,
    settings: Settings,
    predicted: ModelPrediction | None,
    submitter: str,
    predict_for: str | None,
) -> AcceptedSpec:
    """``resolved`` accepted with the prediction asked already (if any), predicted for the
    device type ``prepare`` chose, else the one ``predict_device`` chooses now."""
    return accept(
        resolved,
        settings,
        predicted=predicted,
        submitter=submitter,
        predict_for=predict_for or predict_device(given, resolved),
    )
