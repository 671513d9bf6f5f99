"""Advancing fit searches in the background: a task of the API process, never a request.

A fit's state is in the database (``Fit.variants`` and its trial experiments), so the
task resumes whatever was accepted after a restart. It wakes when a trial's outcome is
stored (``FitWake.after_commit`` from the worker's report), when a fit is created, and
every ``fit_check_seconds`` as a catch-up. Each step reads the fit, decides outside any
transaction (predictions take seconds), then writes in one transaction guarded by the
fit's ``version`` (compare-and-set): a step that loses to another replica or to a
cancel is dropped, and taken again from the new state next time.
"""

import asyncio
import copy
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, event, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
from app.core.db import Busy, Database
from app.core.errors import ApiError, InvalidSpec
from app.core.signals import WorkSignal, wait_for
from app.experiments import service as experiments
from app.experiments.specs import AcceptedSpec
from app.fits import search as fit_search
from app.fits.search import Outcome
from app.tables import Experiment, ExperimentTag, Fit
from vramlab.contract import FitStatus, Status
from vramlab.runspec import DEFAULT_SEQ_LEN, model_default

log = logging.getLogger("vramlab.fits")
OPEN = (FitStatus.QUEUED, FitStatus.RUNNING)
_PENDING = "vramlab_wakes_fits"
FINAL = ("done", "failed")
# Where a variant starts when nothing is predicted: the param's own default.
DEFAULT_START = {"batch_size": model_default("batch_size"), "seq_len": DEFAULT_SEQ_LEN}
STEPS_PER_ROUND = 16  # one fit cannot hold a round for ever


class FitWake:
    """Wakes this process's fit task; safe to call from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.event = asyncio.Event()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def notify(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.event.set)

    def after_commit(self, session: Session) -> None:
        session.info[_PENDING] = self


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    wake = session.info.pop(_PENDING, None)
    if wake is not None:
        wake.notify()


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


def _outcomes(trials: list[dict[str, Any]], found: dict[str, Experiment]) -> list[Outcome]:
    out = []
    for t in trials:
        exp = found.get(t["experiment_id"])
        if exp is None:  # deleted under the fit: count it as a stop, not a guess
            out.append(Outcome(t["value"], Status.CANCELLED, None, "its experiment is gone"))
            continue
        out.append(Outcome(t["value"], Status(exp.status), exp.error_type, exp.error_message))
    return out


def step_variant(
    fit: Fit, variant: dict[str, Any], found: dict[str, Experiment], settings: Settings
) -> tuple[dict[str, Any], list[AcceptedSpec]]:
    """One variant's next state, and the trial to queue (none or one)."""
    v = copy.deepcopy(variant)
    if v["state"] in FINAL:
        return v, []
    params = fit_search.merged_params(fit.spec, v["overrides"])
    step = fit_search.step_of(fit.vary, params)
    gpu = (fit.spec.get("requirements") or {}).get("gpu_name")

    def attempt(value: int) -> AcceptedSpec:
        raw = fit_search.trial_spec(
            fit.spec, v["overrides"], fit.vary, value, fit.capacity_bytes, gpu, fit.id
        )
        return fit_search.check(raw, settings)

    if v["state"] == "predicting":
        upper = fit_search.upper_bound(v, fit.vary, fit.max_value)
        v.update(fit_search.predict(attempt, step, upper))
        v["state"] = "measuring"
    outcomes = _outcomes(v["trials"], found)
    if any(not o.status.finished for o in outcomes):
        return v, []
    for _ in range(fit_search.MAX_TRIALS):
        upper = fit_search.upper_bound(v, fit.vary, fit.max_value)
        predicted = v.get("predicted_max_fitting")
        start = params.get(fit.vary) or DEFAULT_START[fit.vary]
        if predicted is not None:
            start = max(predicted, step)
        decision = fit_search.decide(v, outcomes, fit.vary, step, upper, start)
        if decision.fields is not None:
            v.update(decision.fields)
            return v, []
        assert decision.value is not None
        try:
            accepted = attempt(decision.value)
        except InvalidSpec as exc:  # the catalog refuses it: the search stops below it
            v["limit"], v["note"] = decision.value, fit_search.refusal(exc)
            continue
        return v, [accepted]
    v.update(state="failed", error="the catalog refused every value tried")
    return v, []


def fit_status(variants: list[dict[str, Any]]) -> tuple[FitStatus, str | None]:
    if any(v["state"] not in FINAL for v in variants):
        return FitStatus.RUNNING, None
    failed = [
        f"variant {i}: {v['error']}" for i, v in enumerate(variants) if v["state"] == "failed"
    ]
    return (FitStatus.FAILED, "; ".join(failed)) if failed else (FitStatus.SUCCEEDED, None)


def advance(
    db: Database, settings: Settings, now: Callable[[], datetime], signal: WorkSignal, fit_id: str
) -> bool:
    """Take one step of one fit; True if it changed."""
    with db.session(write=False) as s:
        fit = s.get(Fit, fit_id)
        if fit is None or FitStatus(fit.status).finished:
            return False
        found = {e.id: e for e in s.scalars(select(Experiment).where(Experiment.fit_id == fit_id))}
        s.expunge_all()
    version, before = fit.version, fit.variants
    planned = [step_variant(fit, v, found, settings) for v in before]
    variants = [v for v, _ in planned]
    status, error = fit_status(variants)
    queued = any(points for _, points in planned)
    if variants == before and status == fit.status and not queued:
        return False
    with db.session() as s:
        at = now()
        rows = []
        for v, points in zip(variants, planned, strict=True):
            for point in points[1]:
                row = experiments.columns(point, at, submitted_by=fit.submitted_by, fit_id=fit.id)
                rows.append((row, point))
                value = point.spec.params[fit.vary]
                v["trials"].append({"value": value, "experiment_id": row["id"]})
        stmt = (
            update(Fit)
            .where(Fit.id == fit_id, Fit.version == version)
            .values(
                variants=variants,
                status=status,
                error=error,
                version=version + 1,
                finished_at=at if status.finished else None,
            )
            .execution_options(synchronize_session=False)
        )
        if cast(CursorResult[Any], s.execute(stmt)).rowcount != 1:
            return False  # cancelled, or another replica stepped it: next time, from there
        if rows:
            experiments.check_quota(s, fit.submitted_by, settings, adding=len(rows))
            s.execute(insert(Experiment), [r for r, _ in rows])
            tags = [
                {"experiment_id": r["id"], "tag": t, "created_at": at}
                for r, point in rows
                for t in point.spec.tags
            ]
            s.execute(insert(ExperimentTag), tags)
            signal.after_commit(s, len(rows))
    return True


def open_fits(db: Database, limit: int = 100) -> list[str]:
    with db.session(write=False) as s:
        stmt = select(Fit.id).where(Fit.status.in_(OPEN)).order_by(Fit.created_at).limit(limit)
        return list(s.scalars(stmt))


def advance_all(
    db: Database, settings: Settings, now: Callable[[], datetime], signal: WorkSignal
) -> int:
    """Step every open fit until none changes; returns how many steps were taken."""
    taken = 0
    for fit_id in open_fits(db):
        try:
            for _ in range(STEPS_PER_ROUND):
                if not advance(db, settings, now, signal, fit_id):
                    break
                taken += 1
        except (ApiError, Busy) as exc:  # a full queue (429), a busy predictor: next round
            log.info("fit %s waits: %s", fit_id, exc)
        except SQLAlchemyError:
            raise  # the database is away: the round ends, the next one tries again
        except Exception:  # a bug in one fit's step must not stop every other fit
            log.exception("fit %s: its step failed", fit_id)
    return taken


async def run(
    db: Database,
    settings: Settings,
    clock: Callable[[], datetime],
    signal: WorkSignal,
    wake: FitWake,
) -> None:
    while True:
        await wait_for(wake.event, settings.fit_check_seconds)
        wake.event.clear()
        try:
            await run_in_threadpool(advance_all, db, settings, clock, signal)
        except Exception as exc:  # the database may be away for a while: keep going
            log.warning("advancing fit searches failed: %s", exc)
