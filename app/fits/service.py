"""Fit searches as clients see them: create (every input checked), read, list, cancel,
and the chart of a fit's trials. The search itself: ``fit_search`` and ``fit_engine``.

A fit is accepted whole or refused with a 422 before anything is stored: its spec goes
through the path POST /v1/experiments takes (``specs.accept``), and so does each
variant with the varied param set, so a trial the engine queues later is refused only
where the catalog bounds the varied value itself (which ends that variant's search).
"""

import contextlib
import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, and_, or_, select, update
from sqlalchemy.orm import Session

from app.catalog import hub
from app.catalog.finetune import PAGED_OPTIMIZERS
from app.core import cursors, ids
from app.core.config import Settings
from app.core.errors import Conflict, InvalidSpec
from app.experiments import service as experiments
from app.figures.chart import Chart, Line
from app.fits import search as fit_search
from app.fits.engine import OPEN, FitWake
from app.fits.schemas import FitIn, FitOut, FitSummary, FitTrial, FitVariant, PredictedPoint
from app.queue import live_workers
from app.tables import Experiment, Fit
from vramlab.contract import FitStatus, Status
from vramlab.units import human_bytes

# Params a variant may not override: the search sets them.
SET_BY_SEARCH = ("capacity_bytes",)


def _refused(field: str, exc: InvalidSpec) -> InvalidSpec:
    detail = exc.details[0] if exc.details else {"field": "spec", "message": exc.message}
    return InvalidSpec(f"{field}.{detail['field']}", detail["message"])


def gpu_capacity(
    session: Session, gpu_name: str, now: datetime, live_seconds: float, count: int = 1
) -> int | None:
    """The memory of the smallest live worker's GPU whose name contains ``gpu_name``, on
    a worker with at least ``count`` of them (a fit measures on one, all N ranks of a
    distributed trial on one host; a worker that registered once and is gone runs no
    trial)."""
    sizes = []
    for caps in live_workers.capabilities(session, now, live_seconds):
        named = [
            int(g.get("total_memory") or 0)
            for g in (caps.get("gpus") or [])
            if gpu_name.lower() in str(g.get("name", "")).lower()
        ]
        if len(named) >= count:
            sizes += named
    sizes = [s for s in sizes if s > 0]
    return min(sizes) if sizes else None


def plan_command(raw: dict[str, Any], gpu: str) -> str:
    """The ``vramlab plan`` command that answers a fit's question for ``gpu`` now."""
    params = raw.get("params") or {}
    words = ["vramlab plan", str(params.get("model"))]
    for flag, key in (("--batch", "batch_size"), ("--seq", "seq_len"), ("--task", "task")):
        if params.get(key) is not None:
            words.append(f"{flag} {params[key]}")
    return " ".join([*words, f'--gpu "{gpu}"'])


def most_gpus(base: dict[str, Any], variants: list[dict[str, Any]]) -> int:
    """The most GPUs one trial of the fit takes (1: none is distributed): the spec's
    ``distributed.gpus``, or a variant's that replaces it."""
    given = base.get("distributed")
    plans = [given, *(v.get("distributed", given) for v in variants)]
    gpus = [p.get("gpus") for p in plans if isinstance(p, dict)]
    return max([1, *(n for n in gpus if isinstance(n, int))])


def with_hub_config(body: FitIn, settings: Settings) -> FitIn:
    """``body`` with the hub id its spec names fetched as the spec's ``config_json``
    (app/catalog/hub.py); its variants compare knobs of that model."""
    changes = [(f"variants[{i}].model", v.keys()) for i, v in enumerate(body.variants)]
    spec = hub.resolve_spec(body.spec, settings, "spec.params", changes)
    return body if spec is body.spec else body.model_copy(update={"spec": spec})


def plan(
    body: FitIn, session: Session, settings: Settings, default_device: str, now: datetime
) -> Fit:
    """The fit as it will be stored, every input checked; nothing is written."""
    raw = dict(body.spec)
    if raw.get("op") != "model":
        raise InvalidSpec("spec.op", 'a fit searches a model experiment: op must be "model"')
    raw.setdefault("device", None)
    if raw["device"] is None:
        # A GPU named and no device: the fit is for that GPU, whatever workers are live.
        raw["device"] = "cuda" if body.requirements.gpu_name is not None else default_device
    params = raw.get("params")
    if not isinstance(params, dict):
        raise InvalidSpec("spec.params", "give the model's params (model, task, ...)")
    if "capacity_bytes" in params:
        raise InvalidSpec(
            "spec.params.capacity_bytes", "give the capacity as the fit's capacity_bytes"
        )
    if params.get("optimizer") in PAGED_OPTIMIZERS or "paged" in str(
        (params.get("trainer") or {}).get("optim", "")
    ):
        raise InvalidSpec(
            "spec.params.optimizer",
            "a paged optimizer keeps its state in managed memory, which the allocator's "
            "counters do not see and a capacity cannot bound: fit searches refuse it",
        )
    gpu = body.requirements.gpu_name
    on_cpu = str(raw["device"]).startswith("cpu")
    if gpu is not None:
        if on_cpu:
            raise InvalidSpec("requirements.gpu_name", "a fit on the CPU runs on no GPU")
        given = raw.get("requirements") or {}
        if not isinstance(given, dict):
            raise InvalidSpec("spec.requirements", 'an object, such as {"gpu_name": "H100"}')
        raw["requirements"] = {**given, "gpu_name": gpu}
    try:
        base = fit_search.check(raw, settings, predict=False)
    except InvalidSpec as exc:
        raise _refused("spec", exc) from None
    if body.capacity_bytes is not None:
        capacity, source = body.capacity_bytes, "capacity_bytes"
    elif on_cpu:
        raise InvalidSpec(
            "capacity_bytes", "a fit on the CPU needs capacity_bytes: the memory to fit in"
        )
    elif gpu is None:
        raise InvalidSpec(
            "capacity_bytes",
            "give capacity_bytes, or requirements.gpu_name to fit a live worker's GPU",
        )
    else:
        # A distributed trial runs its N ranks on N GPUs of one worker's host.
        count = most_gpus(base.spec.params, body.variants)
        found = gpu_capacity(session, gpu, now, settings.worker_live_seconds, count)
        if found is None:
            which = "a GPU" if count == 1 else f"{count} GPUs (one a rank)"
            raise InvalidSpec(
                "requirements.gpu_name",
                f"no live worker has {which} whose name contains {gpu!r}: a fit measures "
                f"on one. A plan predicts it now, with no worker: {plan_command(raw, gpu)} "
                "(POST /v1/plans); or give capacity_bytes to measure on an emulated card",
            )
        capacity, source = found, f"gpu {gpu}"
    upper = min(
        body.max_value or fit_search.PARAM_MAXIMUM[body.vary], fit_search.PARAM_MAXIMUM[body.vary]
    )
    variants: list[dict[str, Any]] = []
    for i, overrides in enumerate(body.variants):
        for key in (body.vary, *SET_BY_SEARCH):
            if key in overrides:
                raise InvalidSpec(f"variants[{i}].{key}", "the search sets it; leave it out")
        merged = fit_search.merged_params(base.spec.params, overrides)
        step = fit_search.step_of(body.vary, merged)
        if step > upper:
            raise InvalidSpec("max_value", f"variant {i} steps by {step}, above max_value")
        trial = fit_search.trial_spec(raw, overrides, body.vary, step, capacity, gpu, "check")
        try:
            fit_search.check(trial, settings, predict=False)
        except InvalidSpec as exc:
            detail = exc.details[0] if exc.details else {"field": "spec", "message": ""}
            if detail["field"] == f"params.{body.vary}":
                raise InvalidSpec("vary", detail["message"]) from None
            if detail["field"] == "params.capacity_bytes":
                raise InvalidSpec("capacity_bytes", detail["message"]) from None
            raise _refused(f"variants[{i}]", exc) from None
        variants.append(
            {
                "overrides": overrides,
                "state": "predicting",
                "predicted_max_fitting": None,
                "trials": [],
            }
        )
    return Fit(
        id=str(uuid.uuid4()),
        status=FitStatus.QUEUED,
        spec=raw,
        vary=body.vary,
        capacity_bytes=capacity,
        capacity_source=source,
        max_value=upper,
        variants=variants,
        version=0,
    )


def create(
    session: Session, fit: Fit, wake: FitWake, now: datetime, submitted_by: str | None
) -> FitOut:
    """Store a planned fit in the caller's transaction; its search starts once it commits."""
    fit.submitted_by, fit.created_at = submitted_by, now
    session.add(fit)
    session.flush()
    wake.after_commit(session)
    return read(session, fit)


def get(session: Session, fit_id: str) -> Fit:
    """By its id or a unique prefix of it (``app.core.ids``)."""
    fit: Fit = ids.resolve(session, Fit, fit_id, noun="fit", field="fit_id")
    return fit


def _model_figure(exp: Experiment, name: str) -> int | None:
    data = exp.result.data if exp.result is not None else None
    model = (data or {}).get("model") or {}
    value = model.get(name)
    return int(value) if isinstance(value, int) else None


def _rank(exp: Experiment) -> int | None:
    """A distributed trial's rank: the one out of memory, else the highest one."""
    named = (exp.error_details or {}).get("rank")
    if isinstance(named, int):
        return named
    data = exp.result.data if exp.result is not None else None
    ranks = ((data or {}).get("model") or {}).get("ranks") or []
    if not ranks:
        return None
    top = max(ranks, key=lambda r: (r.get("peak_allocated") or 0, -r.get("rank", 0)))
    rank = top.get("rank")
    return rank if isinstance(rank, int) else None


def _trial(t: dict[str, Any], exp: Experiment | None) -> FitTrial:
    if exp is None:
        return FitTrial(
            value=t["value"],
            status=Status.CANCELLED,
            experiment_id=t["experiment_id"],
            peak_allocated=None,
        )
    predicted = (exp.prediction or {}).get("peak_allocated")
    return FitTrial(
        rank=_rank(exp),
        value=t["value"],
        status=Status(exp.status),
        experiment_id=exp.id,
        peak_allocated=_model_figure(exp, "peak_allocated"),
        peak_reserved=_model_figure(exp, "peak_reserved"),
        predicted_peak_allocated=predicted if isinstance(predicted, int) else None,
        error_type=exp.error_type,
    )


def _variant(fit: Fit, i: int, v: dict[str, Any], found: dict[str, Experiment]) -> FitVariant:
    trials = [_trial(t, found.get(t["experiment_id"])) for t in v["trials"]]
    best = v.get("max_fitting")
    error = None
    at = next((t for t in trials if t.value == best and t.status == Status.SUCCEEDED), None)
    if at is not None and at.peak_allocated is not None and at.predicted_peak_allocated:
        predicted = at.predicted_peak_allocated
        error = round(100.0 * (at.peak_allocated - predicted) / predicted, 2)
    state = v["state"]
    if fit.status == FitStatus.CANCELLED and state not in ("done", "failed"):
        state = "cancelled"
    return FitVariant(
        index=i,
        overrides=v["overrides"],
        state=state,
        predicted_max_fitting=v.get("predicted_max_fitting"),
        max_fitting=best,
        first_failing=v.get("first_failing"),
        prediction_error=error,
        upper_bound=fit_search.upper_bound(v, fit.vary, fit.max_value),
        predicted_points=[
            PredictedPoint(value=x, peak_allocated=a, peak_reserved=r)
            for x, a, r in v.get("predicted_points") or []
        ],
        note=v.get("note"),
        error=v.get("error"),
        trials=sorted(trials, key=lambda t: t.value),
    )


def read(session: Session, fit: Fit) -> FitOut:
    stmt = select(Experiment).where(Experiment.fit_id == fit.id)
    found = {e.id: e for e in session.scalars(stmt)}
    return FitOut(
        id=fit.id,
        status=FitStatus(fit.status),
        created_at=fit.created_at,
        finished_at=fit.finished_at,
        spec=fit.spec,
        vary=fit.vary,
        capacity_bytes=fit.capacity_bytes,
        capacity_source=fit.capacity_source,
        max_value=fit.max_value,
        error=fit.error,
        variants=[_variant(fit, i, v, found) for i, v in enumerate(fit.variants)],
    )


def summary(fit: Fit) -> FitSummary:
    return FitSummary(
        id=fit.id,
        status=FitStatus(fit.status),
        created_at=fit.created_at,
        model=(fit.spec.get("params") or {}).get("model"),
        vary=fit.vary,
        capacity_bytes=fit.capacity_bytes,
        max_fitting=[v.get("max_fitting") for v in fit.variants],
    )


def page(
    session: Session, limit: int, cursor: str | None, status: FitStatus | None = None
) -> tuple[list[Fit], str | None]:
    """Newest first; the cursor is the last item's (created_at, id)."""
    stmt = select(Fit)
    if status is not None:
        stmt = stmt.where(Fit.status == status)
    if cursor:
        at, last_id = cursors.decode(cursor)
        stmt = stmt.where(or_(Fit.created_at < at, and_(Fit.created_at == at, Fit.id < last_id)))
    rows = list(
        session.scalars(stmt.order_by(Fit.created_at.desc(), Fit.id.desc()).limit(limit + 1))
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (cursors.encode(rows[-1].created_at, rows[-1].id) if more and rows else None)


def cancel(session: Session, fit: Fit, now: datetime) -> Fit:
    """Stop the search (compare-and-set on an open status) and cancel its unfinished
    trials: queued ones at once, running ones by asking their workers."""
    stmt = (
        update(Fit)
        .where(Fit.id == fit.id, Fit.status.in_(OPEN))
        .values(status=FitStatus.CANCELLED, version=Fit.version + 1, finished_at=now)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], session.execute(stmt)).rowcount != 1:
        session.refresh(fit)
        raise Conflict(f"fit {fit.id} is already {fit.status}")
    pending = select(Experiment).where(
        Experiment.fit_id == fit.id, Experiment.status.in_((Status.QUEUED, Status.RUNNING))
    )
    for exp in session.scalars(pending):
        with contextlib.suppress(Conflict):  # it finished meanwhile: nothing to stop
            experiments.cancel(session, exp, now)
    session.refresh(fit)
    return fit


def chart(out: FitOut) -> Chart:
    """Measured peaks (allocated, reserved) against the varied value, one group of lines
    per variant; OOM trials as rings; the capacity as a horizontal line."""
    result = Chart(
        title=f"Fit {out.id[:8]}: peak bytes against {out.vary} "
        f"(capacity {human_bytes(out.capacity_bytes)})",
        x_label=out.vary,
    )
    xs_all: list[float] = []
    for v in out.variants:
        name = label(v.overrides)
        ok = [t for t in v.trials if t.status == Status.SUCCEEDED]
        oom = [t for t in v.trials if t.status == Status.FAILED and t.error_type == "oom"]
        allocated = [(float(t.value), float(t.peak_allocated)) for t in ok if t.peak_allocated]
        reserved = [(float(t.value), float(t.peak_reserved)) for t in ok if t.peak_reserved]
        same = reserved == allocated  # the CPU reserves what it allocates: one line
        for pts, suffix in ((allocated, "peak allocated"), (reserved, "peak reserved")):
            if not pts or (same and suffix == "peak reserved"):
                continue
            result.lines.append(
                Line(
                    f"{name}: {suffix}" + (" (= reserved)" if same else ""),
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    step=False,
                    markers=True,
                    dashed=suffix == "peak reserved",
                )
            )
        pts = [(float(t.value), float(t.peak_allocated or out.capacity_bytes)) for t in oom]
        if pts:
            result.lines.append(
                Line(
                    f"{name}: out of memory (peak allocated)",
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    step=False,
                    markers=True,
                    rings_only=True,
                )
            )
        xs_all += [float(t.value) for t in v.trials]
        # The prediction's curve, drawn before any trial has run: what the search starts
        # from (reserved where predicted: it sets the edge, as the capacity line does).
        predicted = [
            (float(p.value), float(p.peak_reserved or p.peak_allocated or 0))
            for p in v.predicted_points
            if p.peak_reserved or p.peak_allocated
        ]
        if predicted:
            figure = "reserved" if any(p.peak_reserved for p in v.predicted_points) else "allocated"
            result.lines.append(
                Line(
                    f"{name}: predicted peak {figure}",
                    [p[0] for p in predicted],
                    [p[1] for p in predicted],
                    step=False,
                    dashed=True,
                )
            )
            xs_all += [p[0] for p in predicted]
    if xs_all:
        lo, hi = min(xs_all), max(xs_all)
        pad = max(1.0, (hi - lo) / 20)
        lo, hi = lo - pad, hi + pad
        result.x_range = (lo, hi)
        result.lines.append(
            Line("capacity", [lo, hi], [float(out.capacity_bytes)] * 2, dashed=True, step=False)
        )
    return result


def label(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "as given"
