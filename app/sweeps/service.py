"""Sweeps: a base spec and a grid; every point of the grid's product is an experiment.

Every point is validated as POST /v1/experiments would validate it before any is queued,
so a sweep is queued whole or not at all (one transaction). Points are planned before that
transaction begins (``plan``), each distinct scenario once, within one budget of work.
"""

import csv
import io
import itertools
import json
import math
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from app.catalog import hub
from app.catalog.scenario.bounds import MAX_PLANNED_STEPS
from app.core import ids
from app.core.config import Settings
from app.core.contract import Result
from app.core.errors import InvalidSpec
from app.core.signals import WorkSignal
from app.experiments import service as experiments
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import AcceptedSpec, PlanCache, accept
from app.figures.chart import Chart, Line
from app.sweeps.schemas import SweepIn, SweepOut, SweepProgress, SweepRow
from app.tables import Experiment, ExperimentTag, Sweep, SweepCount
from vramlab.contract import FINISHED, ErrorType, Figure, Status

MAX_POINTS = 1000
# A sweep's points may together cost the planner what four of the slowest scenarios do.
MAX_SWEEP_PLANNED_STEPS = 4 * MAX_PLANNED_STEPS
MAX_VALUES = 200
TOP_LEVEL = ("shape", "dtype", "device", "repeat", "warmup", "trace", "isolation")


def _place(spec: dict[str, Any], key: str, value: Any) -> None:
    """Put one grid value where it belongs in a spec."""
    if key in TOP_LEVEL:
        spec[key] = value
        return
    section, _, name = key.partition(".")
    if section == "allocator" and name:
        spec["allocator"] = {**(spec.get("allocator") or {}), name: value}
    elif section == "params" and name:
        spec["params"] = {**(spec.get("params") or {}), name: value}
    else:  # a bare name is an op parameter
        spec["params"] = {**(spec.get("params") or {}), key: value}


def _read(exp: Experiment | SimpleNamespace, key: str) -> Any:
    """A grid key's value as the experiment holds it."""
    if key in TOP_LEVEL:
        return {"trace": exp.trace_mode}.get(key, getattr(exp, key, None))
    section, _, name = key.partition(".")
    if section == "allocator" and name:
        return exp.allocator.get(name)
    return exp.params.get(name if section == "params" and name else key)


def points(body: SweepIn) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each point's grid values and its full spec, in the grid's product order."""
    for key, options in body.grid.items():
        if not options:
            raise InvalidSpec(f"grid.{key}", "give at least one value")
        if len(options) > MAX_VALUES:
            raise InvalidSpec(f"grid.{key}", f"at most {MAX_VALUES} values")
    if not body.grid:
        raise InvalidSpec("grid", "give at least one key with a list of values")
    n = math.prod(len(v) for v in body.grid.values())
    if n > MAX_POINTS:
        raise InvalidSpec(
            "grid", f"the grid makes {n} points; a sweep may have at most {MAX_POINTS}"
        )
    keys = list(body.grid)
    out = []
    for combo in itertools.product(*body.grid.values()):
        values = dict(zip(keys, combo, strict=True))
        spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in body.spec.items()}
        for key, value in values.items():
            _place(spec, key, value)
        out.append((values, spec))
    return out


def _point_error(i: int, values: dict[str, Any], field: str, message: str) -> InvalidSpec:
    where = ", ".join(f"{k}={v}" for k, v in values.items())
    return InvalidSpec(f"points[{i}].{field}", f"{message} (grid point {i}: {where})")


def with_hub_config(body: SweepIn, settings: Settings) -> SweepIn:
    """``body`` with the hub id its spec names fetched as the spec's ``config_json``
    (app/catalog/hub.py); its grid compares knobs of that model."""
    changes = [(f"grid.{key}", {key.removeprefix("params.")}) for key in body.grid]
    spec = hub.resolve_spec(body.spec, settings, "spec.params", changes)
    return body if spec is body.spec else body.model_copy(update={"spec": spec})


def plan(
    body: SweepIn, settings: Settings, default_device: Callable[[], str]
) -> list[AcceptedSpec]:
    """Every point accepted, in grid order; a 422 names the first point that is not.
    ``default_device`` gives the device for points that name none (asked at most once:
    every such point gets the same)."""
    grid_points = points(body)
    if any(raw.get("device") is None for _, raw in grid_points):
        chosen = default_device()
        for _, raw in grid_points:
            if raw.get("device") is None:
                raw["device"] = chosen
    cache: PlanCache = {}
    planned = 0
    accepted: list[AcceptedSpec] = []
    for i, (values, raw) in enumerate(grid_points):
        try:
            spec = ExperimentSpec.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "spec"
            raise _point_error(i, values, field, first["msg"]) from None
        try:
            point = accept(spec, settings, cache, predict_models=False)
        except InvalidSpec as exc:
            detail = exc.details[0] if exc.details else {"field": "spec", "message": exc.message}
            raise _point_error(i, values, detail["field"], detail["message"]) from None
        planned += point.plan_steps
        if planned > MAX_SWEEP_PLANNED_STEPS:
            raise _point_error(
                i,
                values,
                "steps",
                f"planning the sweep's distinct scenarios would take more than "
                f"{MAX_SWEEP_PLANNED_STEPS} steps one by one; sweep fewer dtypes or devices, "
                f"or a scenario whose repeats settle sooner",
            )
        accepted.append(point)
    return accepted


def create(
    session: Session,
    body: SweepIn,
    planned: list[AcceptedSpec],
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    submitted_by: str | None = None,
) -> SweepOut:
    """Queue a planned sweep (``plan``) in the caller's transaction, and answer the sweep
    as it now stands, built from what was inserted (reading a thousand rows back would
    cost more than writing them)."""
    experiments.check_quota(session, submitted_by, settings, adding=len(planned))
    sweep = Sweep(
        id=str(uuid.uuid4()),
        spec=body.spec,
        grid=body.grid,
        n_points=len(planned),
        submitted_by=submitted_by,
        created_at=now,
    )
    session.add(sweep)
    session.flush()  # the sweep row first: experiments refer to it
    # Two batched inserts, not a thousand ORM objects. One microsecond apart: the points
    # keep the grid's order in the queue (oldest first) and in the sweep's table, with no
    # column for a point's index.
    rows = [
        experiments.columns(
            point, now + timedelta(microseconds=i), submitted_by=submitted_by, sweep_id=sweep.id
        )
        for i, point in enumerate(planned)
    ]
    session.execute(insert(Experiment), rows)
    tags = [
        {"experiment_id": row["id"], "tag": tag, "created_at": row["created_at"]}
        for row, point in zip(rows, planned, strict=True)
        for tag in point.spec.tags
    ]
    if tags:
        session.execute(insert(ExperimentTag), tags)
    signal.after_commit(session, len(rows))
    keys = list(body.grid)
    return SweepOut(
        id=sweep.id,
        created_at=sweep.created_at,
        spec=sweep.spec,
        grid=sweep.grid,
        n_points=sweep.n_points,
        progress={**dict.fromkeys(Status, 0), Status.QUEUED: len(rows)},
        done=not rows,
        rows=[
            SweepRow(
                index=i,
                experiment_id=r["id"],
                status=Status.QUEUED,
                values={k: _read(SimpleNamespace(**r), k) for k in keys},
                predicted_delta=r["prediction"].get(Figure.DELTA_ALLOCATED),
            )
            for i, r in enumerate(rows)
        ],
    )


def get(session: Session, sweep_id: str) -> Sweep:
    """By its id or a unique prefix of it (``app.core.ids``)."""
    sweep: Sweep = ids.resolve(session, Sweep, sweep_id, noun="sweep", field="sweep_id")
    return sweep


def recent(session: Session, limit: int) -> list[Sweep]:
    return list(session.scalars(select(Sweep).order_by(Sweep.created_at.desc()).limit(limit)))


def members(
    session: Session, sweep: Sweep, offset: int = 0, limit: int = MAX_POINTS
) -> list[Experiment]:
    stmt = (
        select(Experiment)
        .where(Experiment.sweep_id == sweep.id)
        .order_by(Experiment.created_at, Experiment.id)
        .offset(offset)
        .limit(limit)
    )
    return list(session.scalars(stmt))


_COUNTS = [getattr(SweepCount, s) for s in Status]


def progress(session: Session, sweep: Sweep) -> dict[str, int]:
    """Its experiments by status: the one row the database keeps (``SweepCount``)."""
    row = session.execute(select(*_COUNTS).where(SweepCount.sweep_id == sweep.id)).one_or_none()
    return dict(zip(Status, row or (0,) * len(Status), strict=True))


def _done(counts: dict[str, int]) -> bool:
    return counts[Status.QUEUED] + counts[Status.RUNNING] == 0


def progress_of(session: Session, sweep_id: str) -> SweepProgress:
    """A sweep's progress: two reads by key, the same at 10 points or 10,000."""
    sweep = get(session, sweep_id)
    counts = progress(session, sweep)
    return SweepProgress(
        id=sweep.id,
        n_points=sweep.n_points,
        progress=counts,
        finished=sum(counts[s] for s in FINISHED),
        done=_done(counts),
        version="-".join(str(counts[s]) for s in Status),
    )


def row(index: int, exp: Experiment, keys: list[str]) -> SweepRow:
    measured, predicted = exp.measured, exp.predicted
    memory = measured.memory if measured is not None else None
    timing = measured.timing if isinstance(measured, Result) else None
    return SweepRow(
        index=index,
        experiment_id=exp.id,
        status=Status(exp.status),
        values={k: _read(exp, k) for k in keys},
        delta_allocated=memory.delta_allocated if memory is not None else None,
        allocated_peak=memory.allocated_peak if memory is not None else None,
        reserved_peak=memory.reserved_peak if memory is not None else None,
        predicted_delta=predicted.delta_allocated if predicted is not None else None,
        time_s=timing.median_s if timing is not None else None,
        error_type=ErrorType(exp.error_type) if exp.error_type is not None else None,
    )


def read(session: Session, sweep: Sweep, offset: int = 0, limit: int = MAX_POINTS) -> SweepOut:
    """The sweep with its rows from ``offset``, ``limit`` at most (every row by default)."""
    keys = list(sweep.grid)
    counts = progress(session, sweep)
    rows = members(session, sweep, offset, limit)
    end = offset + len(rows)
    return SweepOut(
        id=sweep.id,
        created_at=sweep.created_at,
        spec=sweep.spec,
        grid=sweep.grid,
        n_points=sweep.n_points,
        progress=counts,
        done=_done(counts),
        rows=[row(offset + i, e, keys) for i, e in enumerate(rows)],
        next_offset=end if rows and end < sweep.n_points else None,
    )


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return "" if value is None else value


def to_csv(out: SweepOut) -> str:
    keys = list(out.grid)
    figures = [name for name in SweepRow.model_fields if name not in SweepRow.IDENTITY]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["index", "experiment_id", "status", *keys, *figures])
    for r in out.rows:
        writer.writerow(
            [
                r.index,
                r.experiment_id,
                r.status,
                *(_cell(r.values.get(k)) for k in keys),
                *(_cell(getattr(r, f)) for f in figures),
            ]
        )
    return buf.getvalue()


def written(value: Any) -> str:
    """A grid value as people write it: ``[1024, 1024]``, ``float16``, ``0.5``."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def chart(out: SweepOut) -> Chart:
    """Peak and delta bytes against the swept value (a shape, a dtype, a parameter), its
    values on the axis as written, in the grid's order; one group of lines per setting of
    the other grid keys; the prediction dashed beside what was measured."""
    keys = list(out.grid)
    varied = [k for k in keys if len(out.grid[k]) > 1]
    x_key = "shape" if "shape" in varied else (varied[0] if varied else keys[0])
    values = list(out.grid[x_key])

    def x_of(r: SweepRow) -> float:
        value = r.values.get(x_key)
        return float(values.index(value)) if value in values else float(r.index)

    groups: dict[str, list[SweepRow]] = {}
    for r in out.rows:
        name = ", ".join(f"{k}={written(r.values.get(k))}" for k in keys if k != x_key) or "all"
        groups.setdefault(name, []).append(r)
    result = Chart(
        title=f"Sweep {out.id[:8]}: bytes against {x_key}",
        x_label=x_key,
        x_ticks=[(float(i), written(v)) for i, v in enumerate(values)],
    )
    for name, rows in groups.items():
        rows = sorted(rows, key=x_of)
        drawn: list[tuple[str, list[tuple[float, float]]]] = []
        for figure, suffix, dashed in (
            (lambda r: r.allocated_peak, "peak", False),
            (lambda r: r.delta_allocated, "delta", False),
            (lambda r: r.predicted_delta, "predicted delta", True),
        ):
            pts = [(x_of(r), float(v)) for r in rows if (v := figure(r)) is not None]
            if not pts:
                continue
            # A line on top of one already drawn would hide it (a prediction that equals
            # what was measured): rings around that line's points, named as its equal.
            same = next((other for other, seen in drawn if seen == pts), None)
            if same and suffix.startswith("predicted"):
                same = f"measured {same}"
            drawn.append((suffix, pts))
            result.lines.append(
                Line(
                    f"{name}: {suffix}" + (f" (= {same})" if same else ""),
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    dashed=dashed,
                    step=False,
                    markers=True,
                    rings_only=same is not None,
                )
            )
    return result
