"""Experiments side by side: their figures, the differences, their environments."""

from typing import Any

from sqlalchemy.orm import Session

from app.errors import InvalidSpec
from app.models import Experiment
from app.schemas.results import CompareItem, CompareOut
from app.services import experiments
from app.services.figures import label

MAX_IDS = 10
MEMORY_KEYS = (
    "allocated_before",
    "allocated_after",
    "allocated_peak",
    "delta_allocated",
    "reserved_before",
    "reserved_after",
    "reserved_peak",
    "host_rss_before",
    "host_rss_after",
)


def parse_ids(ids: str) -> list[str]:
    out = [i.strip() for i in ids.split(",") if i.strip()]
    if not 1 <= len(out) <= MAX_IDS:
        raise InvalidSpec("ids", f"give 1 to {MAX_IDS} experiment ids, separated by commas")
    return list(dict.fromkeys(out))


def load(session: Session, ids: list[str]) -> list[Experiment]:
    return [experiments.get(session, i) for i in ids]


def figures(exp: Experiment) -> dict[str, float | int | None]:
    data = exp.result.data if exp.result is not None else {}
    memory = data.get("memory") or {}
    timing = data.get("timing") or {}
    out: dict[str, float | int | None] = {k: memory.get(k) for k in MEMORY_KEYS}
    out["predicted_delta"] = exp.prediction.get("delta_allocated")
    out["time_s"] = timing.get("median_s")
    return out


def environment(exp: Experiment) -> dict[str, Any]:
    env = (exp.result.data.get("environment") or {}) if exp.result is not None else {}
    return env if isinstance(env, dict) else {}


def compare(exps: list[Experiment]) -> CompareOut:
    items = [
        CompareItem(
            id=e.id,
            status=e.status,  # type: ignore[arg-type]
            label=label(e),
            spec=experiments.to_out(e).spec.model_dump(),
            figures=figures(e),
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
    return CompareOut(
        items=items,
        differences=differences,
        environment={k: v for k, v in differ.items() if any(x != v[0] for x in v)},
        environment_same={k: v[0] for k, v in differ.items() if all(x == v[0] for x in v)},
    )
