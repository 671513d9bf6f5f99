"""The web pages under /ui/: experiments (list, one, submit), a sweep, a comparison, a plan.

Server-rendered with Jinja2; every asset is inline, so the pages work with no network.
Reads go through the same services and the same ``read`` scope as the JSON API; the
submit form posts to ``POST /v1/experiments`` from the browser, with a token if given.
"""

import contextlib
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from app.access.tokens import Principal
from app.api.deps import ExperimentDep, NowDep, SessionDep, SettingsDep, SignalDep, require
from app.catalog.endpoints import listing as catalog_listing
from app.catalog.endpoints import model_catalog
from app.compare import service as compare
from app.core.errors import ApiError, Conflict, NotFound
from app.experiments import service as experiments
from app.experiments import views as experiment_views
from app.figures import html
from app.figures import service as figures
from app.figures.chart import busy_range
from app.fits import service as fits
from app.gpus import service as gpus
from app.plans import service as plans
from app.plans import views as plan_views
from app.plans.schemas import PlanIn
from app.presets import service as presets
from app.presets.schemas import PresetRun
from app.queue import workers
from app.snapshots import service as snapshots
from app.snapshots.categories import telling_frames
from app.sweeps import service as sweeps
from vramlab import experiment_view
from vramlab.contract import Status
from vramlab.units import human_bytes

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parent / "templates"))
# A missing figure is an empty cell, never Python's "None".
TEMPLATES.env.finalize = lambda value: "" if value is None else value
TEMPLATES.env.globals["strategy_words"] = experiment_view.strategy_words
TEMPLATES.env.globals["rank_rows"] = experiment_view.rank_rows
TEMPLATES.env.globals["rank_headers"] = experiment_view.RANK_HEADERS
TEMPLATES.env.globals["ranks_over_words"] = experiment_view.ranks_over_words
TEMPLATES.env.filters["bytes"] = lambda n: "" if n is None else human_bytes(n)
TEMPLATES.env.globals["off_prediction"] = experiment_views.off_prediction
# base.html wraps the charts' script in a tag that carries the response's CSP nonce.
TEMPLATES.env.globals["chart_js"] = html.CHART_JS
TEMPLATES.env.globals["Status"] = Status
TEMPLATES.env.filters["telling"] = telling_frames
router = APIRouter(prefix="/ui", include_in_schema=False, dependencies=[require("read")])
EXAMPLE_SPEC = '{\n  "op": "add",\n  "shape": [1000, 1000],\n  "dtype": "float32"\n}'


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, name, context)


@router.get("", response_class=RedirectResponse)
def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/", response_class=HTMLResponse)
def index(
    request: Request,
    s: SessionDep,
    status: Annotated[Status | None, Query()] = None,
    op: Annotated[str | None, Query(max_length=64)] = None,
    device: Annotated[str | None, Query(max_length=16)] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    filters = experiments.Filters(
        [status] if status else None, op or None, device or None, tag or None
    )
    rows, next_cursor = experiments.page(s, filters, 50, cursor or None)
    return _page(
        request,
        "index.html",
        items=[experiment_views.to_out(e) for e in rows],
        next_cursor=next_cursor,
        filters={"status": status or "", "op": op or "", "device": device or "", "tag": tag or ""},
        statuses=list(Status),
        sweeps=sweeps.recent(s, 10),
        fits=fits.page(s, 10, None)[0],
    )


def _live_devices(s: SessionDep, settings: SettingsDep, now: NowDep) -> list[str]:
    """The devices live workers offer, CUDA first: what the submit form offers."""
    offered = {
        t
        for w in workers.live(s, now, settings.worker_live_seconds)
        for t in w.capabilities.get("device_types") or []
    }
    return [d for d in ("cuda", "cpu") if d in offered]


@router.get("/submit", response_class=HTMLResponse)
def submit_form(
    request: Request, s: SessionDep, settings: SettingsDep, now: NowDep
) -> HTMLResponse:
    return _page(
        request,
        "submit.html",
        example=EXAMPLE_SPEC,
        catalog=catalog_listing(settings),
        models=_model_choices(),
        devices=_live_devices(s, settings, now),
    )


def _model_choices() -> dict[str, Any]:
    """What the form's model list offers: the presets, then every transformers model_type."""
    known = model_catalog()
    types = sorted({t for kind in known.model_types.values() for t in kind})
    return {
        "presets": [{"name": p.name, "about": p.about} for p in known.presets],
        "model_types": types,
    }


@router.get("/presets", response_class=HTMLResponse)
def presets_page(
    request: Request, s: SessionDep, settings: SettingsDep, now: NowDep
) -> HTMLResponse:
    devices = _live_devices(s, settings, now)
    return _page(request, "presets.html", presets=presets.listing(), devices=devices)


@router.post("/presets/{name}/run", response_class=RedirectResponse)
def run_preset(
    name: Annotated[str, PathParam(max_length=64)],
    s: SessionDep,
    settings: SettingsDep,
    signal: SignalDep,
    now: NowDep,
    who: Annotated[Principal, require("submit")],
    run: Annotated[PresetRun, Form()],
) -> RedirectResponse:
    exp = presets.queue(s, name, run, settings, signal, now, who.id)
    s.flush()
    return RedirectResponse(f"/ui/experiments/{exp.id}", status_code=303)


@router.post("/experiments/{experiment_id}/cancel", response_class=RedirectResponse)
def cancel(
    exp: ExperimentDep,
    s: SessionDep,
    now: NowDep,
    _who: Annotated[Principal, require("submit")],
) -> RedirectResponse:
    if not Status(exp.status).finished:
        with contextlib.suppress(Conflict):  # it ended meanwhile: the page shows how
            experiments.cancel(s, exp, now)
    return RedirectResponse(f"/ui/experiments/{exp.id}", status_code=303)


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
def experiment(
    request: Request, exp: ExperimentDep, s: SessionDep, settings: SettingsDep, now: NowDep
) -> HTMLResponse:
    out = experiments.answer(s, exp, settings, now)
    chart = peak = None
    if out.status.finished:
        try:
            chart = html.fragment(figures.timeline(s, exp))
            peak = figures.peak(s, exp, 10)
        except NotFound:
            pass  # no trace: the page shows the figures alone
    return _page(request, "experiment.html", exp=out, chart=chart, peak=peak)


@router.get("/snapshots/{snapshot_id}", response_class=HTMLResponse)
def snapshot(
    request: Request,
    snapshot_id: Annotated[str, PathParam(max_length=64)],
    s: SessionDep,
    x: Annotated[Literal["changes", "full"], Query(description="the timeline's x range")] = (
        "changes"
    ),
) -> HTMLResponse:
    exp = snapshots.get(s, snapshot_id)
    chart = zoom = None
    with contextlib.suppress(NotFound):  # a snapshot of segments alone has no trace
        drawn = snapshots.timeline(s, exp)
        # A long flat stretch (a program that sleeps, or loads data, before the work)
        # would take most of the width: zoom to where memory changes, the full range a
        # link away.
        zoom = busy_range(drawn)
        if zoom is not None and x == "changes":
            drawn.x_range = (zoom.x0, zoom.x1)
        chart = html.fragment(drawn)
        unit = drawn.x_label.rsplit("(", 1)[-1].rstrip(")") if "(" in drawn.x_label else ""
    return _page(
        request,
        "snapshot.html",
        snap=snapshots.to_out(s, exp),
        chart=chart,
        zoom=zoom,
        zoomed=zoom is not None and x == "changes",
        unit=unit if chart else "",
    )


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep(
    request: Request, sweep_id: Annotated[str, PathParam(max_length=64)], s: SessionDep
) -> HTMLResponse:
    out = sweeps.read(s, sweeps.get(s, sweep_id))
    return _page(request, "sweep.html", sweep=out, chart=html.fragment(sweeps.chart(out)))


@router.get("/fits/{fit_id}", response_class=HTMLResponse)
def fit(
    request: Request, fit_id: Annotated[str, PathParam(max_length=64)], s: SessionDep
) -> HTMLResponse:
    out = fits.read(s, fits.get(s, fit_id))
    return _page(
        request, "fit.html", fit=out, chart=html.fragment(fits.chart(out)), label=fits.label
    )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, s: SessionDep, ids: Annotated[str, Query(max_length=400)] = ""
) -> HTMLResponse:
    result = chart = error = None
    if ids:
        try:
            exps = compare.load(s, compare.parse_ids(ids))
            result = compare.compare(exps)
            chart = html.fragment(figures.overlay(s, exps))
        except ApiError as exc:
            error = exc.message
    return _page(request, "compare.html", ids=ids, result=result, chart=chart, error=error)


PLAN_FIELDS = ("model", "batch", "seq", "task", "precision", "optimizer", "gpus", "capacity",
               "variants", "vary", "quick")  # fmt: skip


@router.get("/plan", response_class=HTMLResponse)
def plan_page(
    request: Request,
    s: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    model: Annotated[str, Query(max_length=200)] = "",
    batch: Annotated[str, Query(max_length=20)] = "",
    seq: Annotated[str, Query(max_length=20)] = "",
    task: Annotated[str, Query(max_length=20)] = "train",
    precision: Annotated[str, Query(max_length=20)] = "",
    optimizer: Annotated[str, Query(max_length=20)] = "",
    gpus_given: Annotated[str, Query(alias="gpus", max_length=1000)] = "",
    capacity: Annotated[str, Query(max_length=40)] = "",
    variants: Annotated[str, Query(max_length=2000)] = "",
    vary: Annotated[str, Query(max_length=20)] = "batch_size",
    quick: Annotated[str, Query(max_length=4)] = "",
) -> HTMLResponse:
    """Will it fit: the plan form, and its answer drawn per GPU and variant."""
    live = gpus.worker_cards(s, now, settings.worker_live_seconds)
    form = dict(zip(PLAN_FIELDS, (model, batch, seq, task, precision, optimizer, gpus_given,
                                  capacity, variants, vary, quick), strict=True))  # fmt: skip
    result = error = None
    if model.strip():
        try:
            body = PlanIn.model_validate(plan_views.request(form))
            address = request.client.host if request.client else "unknown"
            predict = plans.predictor_of(settings, f"address:{address}")
            result = plans.plan(body, live, predict, time.monotonic)
        except ApiError as exc:
            details = exc.details if isinstance(exc.details, list) else []
            error = "; ".join(f"{d['field']}: {d['message']}" for d in details) or exc.message
        except ValidationError as exc:
            error = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return _page(
        request,
        "plan.html",
        form=form,
        plan=result,
        bars=plan_views.bars(result) if result is not None else [],
        legend=plan_views.legend(),
        cards=[c.name for c in gpus.listing(s, now, settings.worker_live_seconds)],
        error=error,
    )
