"""A plan as the page draws it: per answer, the predicted categories stacked against the
card's usable memory, and the form's inputs read as a plan request."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidSpec
from app.figures.layout import PALETTE
from app.plans.schemas import PlanAnswer, PlanOut

ORDER = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
COLOURS = dict(zip(ORDER, PALETTE, strict=False))
CACHE_COLOUR = "#bab0ac"  # reserved but not allocated: the allocator's free holes
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


@dataclass(frozen=True)
class Segment:
    name: str
    bytes: int
    start: float  # percent of the bar
    width: float
    colour: str


@dataclass(frozen=True)
class Bar:
    answer: PlanAnswer
    segments: list[Segment]
    usable_at: float  # percent of the bar where the card's usable memory ends


def bars(plan: PlanOut) -> list[Bar]:
    """Each answer's bar, scaled to the larger of its usable bytes and its peak (so the
    usable line and the peak both show)."""
    out = []
    for a in plan.answers:
        p = a.prediction
        usable = a.gpu.usable_bytes
        if p is None:
            out.append(Bar(a, [], 100.0))
            continue
        scale = max(usable, p.peak_reserved) * 1.04 or 1
        segments, at = [], 0.0
        names = [*ORDER, *sorted(set(p.categories) - set(ORDER))]
        for name in names:
            n = p.categories.get(name, 0)
            if n > 0:
                width = 100.0 * n / scale
                segments.append(Segment(name, n, at, width, COLOURS.get(name, "#9c755f")))
                at += width
        cache = p.peak_reserved - p.peak_allocated
        if cache > 0:
            segments.append(Segment("allocator cache", cache, at, 100.0 * cache / scale,
                                    CACHE_COLOUR))  # fmt: skip
        out.append(Bar(a, segments, 100.0 * usable / scale))
    return out


def legend() -> list[tuple[str, str]]:
    return [*((k.replace("_", " "), v) for k, v in COLOURS.items()),
            ("allocator cache", CACHE_COLOUR)]  # fmt: skip


def size(text: str, field: str) -> int:
    """``24GiB``, ``80GB``, ``1.5 GiB`` or bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InvalidSpec(field, f"{text!r} is not a size: write e.g. 24GiB, 80GB or bytes")
    return int(float(match.group(1)) * _UNITS[unit])


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def overrides(text: str, field: str) -> dict[str, Any]:
    """``checkpointing=true,micro_batches=2``."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, given = item.partition("=")
        if not eq or not key.strip():
            raise InvalidSpec(field, f"{text!r}: write KEY=VALUE[,KEY=VALUE...]")
        out[key.strip()] = _value(given.strip())
    return out


def request(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a POST /v1/plans body."""
    params: dict[str, Any] = {"model": form["model"].strip(), "task": form.get("task") or "train"}
    for key, name in (("batch", "batch_size"), ("seq", "seq_len")):
        if form.get(key, "").strip():
            params[name] = _value(form[key].strip())
    for key in ("precision", "optimizer"):
        if form.get(key):
            params[key] = form[key]
    body: dict[str, Any] = {
        "spec": {"op": "model", "params": params},
        "gpus": [g.strip() for g in form.get("gpus", "").split(",") if g.strip()],
        "vary": form.get("vary") or "batch_size",
        "variants": [{}]
        + [
            overrides(line, "variants")
            for line in form.get("variants", "").splitlines()
            if line.strip()
        ],
    }
    body["verify"] = form.get("quick") != "on"
    if form.get("capacity", "").strip():
        body["capacity_bytes"] = size(form["capacity"], "capacity")
    return body
