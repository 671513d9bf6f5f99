"""Experiments side by side: their figures, the differences, their environments."""

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.compare.schemas import CompareItem, CompareOut
from app.core.contract import Result, SnapshotResult
from app.core.errors import InvalidSpec
from app.experiments import service as experiments
from app.experiments import views as experiment_views
from app.figures.chart import human_bytes
from app.figures.service import label
from app.tables import Experiment
from vramlab.contract import MEMORY_KEYS, Figure, Status

MAX_IDS = 10


def parse_ids(ids: str) -> list[str]:
    out = [i.strip() for i in ids.split(",") if i.strip()]
    if not 1 <= len(out) <= MAX_IDS:
        raise InvalidSpec(
            "ids", f"give 1 to {MAX_IDS} experiment or snapshot ids, separated by commas"
        )
    return list(dict.fromkeys(out))


def load(session: Session, ids: list[str]) -> list[Experiment]:
    """Each by its id or a unique prefix of it; one that two of them name, once."""
    found = (experiments.get(session, i, field="ids") for i in ids)
    return list({e.id: e for e in found}.values())


def figures(exp: Experiment) -> dict[str, float | int | None]:
    measured, predicted = exp.measured, exp.predicted
    memory = measured.memory.model_dump() if measured is not None else {}
    timing = measured.timing if isinstance(measured, Result) else None
    out: dict[str, float | int | None] = {k: memory.get(k) for k in MEMORY_KEYS}
    # A model's prediction is its step's peak (``model``), not an op's delta.
    op_predicted = predicted is not None and exp.op != "model"
    out["predicted_delta"] = predicted.delta_allocated if op_predicted and predicted else None
    out["time_s"] = timing.median_s if timing is not None else None
    return out


def environment(exp: Experiment) -> dict[str, Any]:
    measured = exp.measured
    if isinstance(measured, SnapshotResult):
        # The device the snapshot was taken on is known even where nothing else was kept.
        return {"device": exp.device, **measured.environment}
    if measured is None or measured.environment is None:
        return {}
    return measured.environment.model_dump(exclude_unset=True)


def category_bytes(exp: Experiment) -> dict[str, int] | None:
    """Bytes alive at the peak by category: a snapshot's, or a model experiment's
    measured step; None for an op's experiment (its trace is not categorised)."""
    measured = exp.measured
    if isinstance(measured, Result):  # a model's: the categories that held any bytes
        held = measured.categories.model_dump() if measured.categories is not None else {}
        return {k: v for k, v in held.items() if v} or None
    if not isinstance(measured, SnapshotResult):
        return None
    rows = measured.snapshot.get("categories")
    if not rows:
        return None
    return {r["category"]: int(r["bytes"]) for r in rows}


def recorded(exps: list[Experiment]) -> set[str]:
    """The categories every one of ``exps`` recorded from inside its program (vramlab
    record's parameters, gradients and optimizer state), not inferred."""
    found: set[str] | None = None
    for exp in exps:
        measured = exp.measured
        rows = measured.snapshot.get("categories") if isinstance(measured, SnapshotResult) else None
        names = {r["category"] for r in rows or () if r.get("inference") is False}
        found = names if found is None else found & names
    return found or set()


def predicted_category_bytes(exp: Experiment) -> dict[str, int] | None:
    """A model experiment's predicted bytes at its step's peak, by category."""
    predicted = exp.predicted
    if predicted is None or predicted.categories is None:
        return None
    return {k: v for k, v in predicted.categories.model_dump().items() if v} or None


def model_of(exp: Experiment) -> dict[str, Any] | None:
    """A model experiment's knobs that set its size, side by side with another's."""
    if exp.op != "model":
        return None
    p = exp.params or {}
    keys = ("model", "task", "batch_size", "seq_len", "image_size", "precision", "optimizer")
    out = {k: p.get(k) for k in keys}
    out["checkpointing"] = p.get("checkpointing")
    out["micro_batches"] = p.get("micro_batches")
    predicted = exp.predicted
    out["predicted_for"] = predicted.predicted_for if predicted is not None else None
    out["predicted_peak"] = predicted.peak_allocated if predicted is not None else None
    return out


def categories(
    exps: list[Experiment], of: Callable[[Experiment], dict[str, int] | None] = category_bytes
) -> dict[str, list[int | None]]:
    found = [of(e) for e in exps]
    if all(f is None for f in found):
        return {}
    names = list(dict.fromkeys(k for f in found if f for k in f))
    return {k: [f.get(k, 0) if f is not None else None for f in found] for k in names}


def sentences(
    items: list[CompareItem],
    by_category: dict[str, list[int | None]],
    exact: set[str] | frozenset[str] = frozenset(),
    measured: bool = False,
) -> list[str]:
    """ "B peaks 2.1 GiB higher than A, 1.8 GiB of it optimizer state (inferred)";
    "(recorded)" for a category in ``exact`` (recorded by every program compared)."""
    out = []
    base = items[0]
    for n, item in enumerate(items[1:], start=1):
        peak = Figure.ALLOCATED_PEAK
        a, b = base.figures.get(peak), item.figures.get(peak)
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        diff = b - a
        if diff == 0:
            out.append(f"{item.label} peaks at the same {human_bytes(b)} as {base.label}")
            continue
        word = "higher" if diff > 0 else "lower"
        text = f"{item.label} peaks {human_bytes(abs(diff))} {word} than {base.label}"
        moves = [
            ((v[n] or 0) - (v[0] or 0), k)
            for k, v in by_category.items()
            if v[0] is not None and v[n] is not None
        ]
        same_way = [(d, k) for d, k in moves if d * diff > 0]
        if same_way:
            d, k = max(same_way, key=lambda m: abs(m[0]))
            how = "measured" if measured else "recorded" if k in exact else "inferred"
            text += f", {human_bytes(abs(d))} of it {k.replace('_', ' ')} ({how})"
        out.append(text)
    return out


def compare(exps: list[Experiment]) -> CompareOut:
    items = [
        CompareItem(
            id=e.id,
            kind=e.kind,
            status=Status(e.status),
            label=label(e),
            spec=experiment_views.to_out(e).spec.model_dump(),
            model=model_of(e),
            figures=figures(e),
            shared_process_figures=list(
                e.measured.shared_process_figures() if isinstance(e.measured, Result) else ()
            ),
        )
        for e in exps
    ]
    differences: dict[str, list[float | int | None]] = {}
    for key in items[0].figures:
        base = items[0].figures[key]
        differences[key] = [
            (v - base) if isinstance(v, int | float) and isinstance(base, int | float) else None
            for v in (i.figures[key] for i in items)
        ]
    envs = [environment(e) for e in exps]
    keys = sorted({k for env in envs for k in env})
    differ = {k: [env.get(k) for env in envs] for k in keys}
    by_category = categories(exps)
    return CompareOut(
        items=items,
        differences=differences,
        categories=by_category,
        predicted_categories=categories(exps, predicted_category_bytes),
        summary=sentences(
            items,
            by_category,
            recorded(exps),
            measured=all(isinstance(e.measured, Result) for e in exps),
        ),
        environment={k: v for k, v in differ.items() if any(x != v[0] for x in v)},
        environment_same={k: v[0] for k, v in differ.items() if all(x == v[0] for x in v)},
    )
