"""Plans: will a model's step fit these GPUs, and what is the largest batch (or sequence)
that does, predicted by the model predictor and nothing run.

A plan needs no worker and is not bounded by the experiment cap (which bounds what runs):
its own bounds are its size (``schemas.MAX_ANSWERS``) and its time (``PLAN_SECONDS``).

Each variant's step is traced at the asked value and at one or two more (under no
capacity: the figures every GPU shares), and a curve through them (a straight line in
the batch size, a parabola in the sequence length: a step's tensors grow so) gives each
GPU's edge estimate; ``verify`` (the default) then walks each edge from there with traces
under the card's capacity, the walk a fit's trials take (``fit_search.decide``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from app.catalog import CatalogError, hub, plan_spec
from app.core.config import Settings
from app.core.db import Busy
from app.core.errors import InvalidSpec
from app.experiments import predictor as predictor_service
from app.experiments.predictor import ModelPrediction
from app.experiments.spec_schemas import ExperimentSpec
from app.fits import search as fit_search
from app.fits.search import Outcome
from app.gpus import service as gpus
from app.gpus.cards import Card
from app.plans import suggestions as suggest
from app.plans import ways as fine_tune_ways
from app.plans.schemas import (
    MAX_ANSWERS,
    CardWays,
    PlanAnswer,
    PlanGpu,
    PlanIn,
    PlanOut,
    PlanPrediction,
    PlanVariant,
)
from vramlab.contract import ErrorType, Status
from vramlab.units import human_bytes

PLAN_SECONDS = 90.0  # a plan's predictions, all told; asked again, it goes on from the cache
SECANT_STEPS = 4  # before the walk: a near-straight curve needs two or three
PARALLEL = 2  # predictions asked at once (the predictor serves them as it can)
SMALLEST = 2  # the smallest value whose log another's is synthesized from
DEFAULT_VALUE = {"batch_size": 1, "seq_len": 128}  # the model's own defaults
DEVICE = "cuda"
CAVEAT = (
    "predicted for CUDA: nothing ran. usable bytes are a card's total less the CUDA context, "
    "what the driver keeps and cuBLAS's handles (GET /v1/gpus says which are measured)"
)

Predict = Callable[[dict[str, Any]], ModelPrediction]


@dataclass(frozen=True)
class Target:
    """A card to fit: a catalog or worker GPU, or an emulated one (capacity_bytes)."""

    name: str
    total_bytes: int
    usable_bytes: int
    usable_source: str
    bf16: bool | None

    @classmethod
    def of(cls, card: Card) -> Target:
        return cls(card.name, card.total_bytes, card.usable_bytes, card.usable_source, card.bf16)

    def out(self) -> PlanGpu:
        return PlanGpu(
            name=self.name,
            total_bytes=self.total_bytes,
            usable_bytes=self.usable_bytes,
            usable_source=self.usable_source,
            bf16=self.bf16,
        )


class Tracer:
    """The plan's predictions: each distinct params once, a few at a time, within the
    plan's time."""

    def __init__(self, predict: Predict, deadline: float) -> None:
        self._predict = predict
        self._deadline = deadline
        self._done: dict[str, ModelPrediction] = {}
        self.asked = 0

    def many(self, batch: list[dict[str, Any]], soft: bool = False) -> list[ModelPrediction]:
        """Each params' prediction (a refusal: InvalidSpec; with ``soft``, a prediction
        with no figures whose caveat says why, for what a plan only offers)."""
        keys = [json.dumps(p, sort_keys=True) for p in batch]
        todo = {k: p for k, p in zip(keys, batch, strict=True) if k not in self._done}
        if todo:
            if time.monotonic() > self._deadline:
                raise Busy(
                    f"the plan ran past its {PLAN_SECONDS:g} s; ask again: what it predicted "
                    "is cached",
                    retry_after=5,
                )
            with ThreadPoolExecutor(max_workers=min(PARALLEL, len(todo))) as pool:
                answers = list(pool.map(self._soft if soft else self._one, todo.values()))
            self._done.update(zip(todo, answers, strict=True))
            self.asked += sum(1 for p in todo.values() if "__edges" not in p)  # traces
        return [self._done[k] for k in keys]

    def one(self, params: dict[str, Any]) -> ModelPrediction:
        return self.many([params])[0]

    def soft(self, batch: list[dict[str, Any]]) -> list[ModelPrediction]:
        return self.many(batch, soft=True)

    def _soft(self, params: dict[str, Any]) -> ModelPrediction:
        try:
            return self._predict(params)
        except CatalogError as exc:
            return ModelPrediction(None, None, None, (exc.message,))

    def _one(self, params: dict[str, Any]) -> ModelPrediction:
        try:
            return self._predict(params)
        except CatalogError as exc:
            raise InvalidSpec(exc.field, exc.message) from None


def targets(body: PlanIn, live: tuple[Card, ...]) -> list[Target]:
    out = []
    for i, name in enumerate(body.gpus):
        card = gpus.resolve(name, live)
        if card is None:
            raise InvalidSpec(
                f"gpus[{i}]",
                f"no GPU called {name!r} in the catalog or among live workers; GET /v1/gpus "
                "lists them (e.g. 'H100', 'A100 40GB', 'RTX 4090'), or give capacity_bytes",
            )
        out.append(Target.of(card))
    if body.capacity_bytes is not None:
        size = human_bytes(body.capacity_bytes)
        out.append(
            Target(
                f"{size} (capacity_bytes)", body.capacity_bytes, body.capacity_bytes, "given", None
            )
        )
    if not out:
        raise InvalidSpec("gpus", "name at least one GPU (GET /v1/gpus), or give capacity_bytes")
    return out


def checked(params: Mapping[str, Any], field: str) -> dict[str, Any]:
    """A model spec's params as the catalog fills and checks them (InvalidSpec naming
    ``field`` if it refuses)."""
    try:
        full, _ = plan_spec("model", (), params, "float32", "cuda:0")
    except CatalogError as exc:
        raise InvalidSpec(f"{field}.{exc.field.removeprefix('params.')}", exc.message) from None
    return full


def normalized(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The params as the catalog fills them in, or None where it refuses them."""
    try:
        full, _ = plan_spec("model", (), params, "float32", "cuda:0")
    except CatalogError:
        return None
    return full


def allowed(params: Mapping[str, Any], vary: str, value: int) -> bool:
    try:
        plan_spec("model", (), {**params, vary: value}, "float32", "cuda:0")
    except CatalogError:
        return False
    return True


def with_hub_configs(body: PlanIn, settings: Settings) -> PlanIn:
    """``body`` with the hub id its spec names fetched as the spec's ``config_json``
    (app/catalog/hub.py)."""
    changes = [(f"variants[{i}].model", v.keys()) for i, v in enumerate(body.variants)]
    spec = hub.resolve_spec(body.spec, settings, "spec.params", changes)
    return body if spec is body.spec else body.model_copy(update={"spec": spec})


def base_spec(body: PlanIn) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec's params and its allocator settings, every input checked."""
    raw = dict(body.spec)
    if raw.setdefault("op", "model") != "model":
        raise InvalidSpec("spec.op", 'a plan predicts a model experiment: op must be "model"')
    device = raw.get("device")
    if device is not None and not str(device).startswith("cuda"):
        raise InvalidSpec("spec.device", "a plan is for CUDA GPUs: leave device out")
    raw["device"] = DEVICE
    raw.setdefault("shape", [])
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        raise InvalidSpec(f"spec.{where}", first["msg"]) from None
    if "capacity_bytes" in spec.params:
        raise InvalidSpec(
            "spec.params.capacity_bytes", "give the capacity as the plan's capacity_bytes"
        )
    return dict(spec.params), spec.allocator.model_dump(exclude_none=True)


@dataclass
class Variant:
    index: int
    overrides: dict[str, Any]
    params: dict[str, Any]  # checked, with the varied param set
    value: int
    step: int
    top: int  # the largest value the catalog allows (and max_value)
    points: list[int]  # traced uncapped: the curve's, and the logs the edges come from
    logged: list[int]  # of those, the logs each edge is synthesized from (none below 2)


def _top(params: dict[str, Any], vary: str, step: int, upper: int) -> int:
    """The largest multiple of step up to ``upper`` that the catalog allows (a model's
    positions bound seq_len)."""
    lo, hi = 0, upper // step
    if allowed(params, vary, hi * step):
        return hi * step
    while hi - lo > 1:  # allowed(lo) (or lo = 0), not allowed(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if allowed(params, vary, mid * step) else (lo, mid)
    return lo * step


def variants(body: PlanIn, base: dict[str, Any]) -> list[Variant]:
    upper = min(
        body.max_value or fit_search.PARAM_MAXIMUM[body.vary],
        fit_search.PARAM_MAXIMUM[body.vary],
    )
    out = []
    for i, overrides in enumerate(body.variants):
        if "capacity_bytes" in overrides:
            raise InvalidSpec(f"variants[{i}].capacity_bytes", "give it as the plan's")
        merged = {**base, **overrides}
        if merged.get(body.vary) is None:
            merged[body.vary] = DEFAULT_VALUE[body.vary]
        params = checked(merged, f"variants[{i}]" if overrides else "spec.params")
        value = int(params[body.vary])
        step = fit_search.step_of(body.vary, params)
        top = _top(params, body.vary, step, max(upper, value))
        k = value // step
        if body.vary == "batch_size":
            ks = [k, k // 2 if k >= 2 else k + 1]
        else:
            ks = sorted({k, max(1, k // 2), max(1, k // 4)}, reverse=True)
            ks += [k + 1, k + 2][: 3 - len(ks)]
        points = [n * step for n in ks if n * step <= top or n == k]
        logged = _logged(points, body.vary, step, top)
        points += [x for x in logged if x not in points]
        out.append(Variant(i, overrides, params, value, step, top, points, logged))
    return out


def _logged(points: list[int], vary: str, step: int, top: int) -> list[int]:
    """The values whose logs give every other value's (workers/models/edges.py): as many
    as the size's degree needs (two for the batch, three for the sequence), none below
    2 (a step at batch 1 makes a few allocations fewer); the traced points first, then
    the next multiples of step; none (the edges are traced) where too few fit under top."""
    need = 2 if vary == "batch_size" else 3
    out = [x for x in points if x >= SMALLEST][:need]
    x = max([step, *points])
    while len(out) < need and x + step <= top:
        x += step
        if x >= SMALLEST and x not in out:
            out.append(x)
    return out if len(out) == need else []


def curve(xs: list[int], ys: list[int]) -> Callable[[int], float] | None:
    """Through two points a line, through three a parabola (Lagrange); None if fewer."""
    pts = list(dict(zip(xs, ys, strict=True)).items())
    if len(pts) < 2:
        return None

    def at(x: int) -> float:
        total = 0.0
        for i, (xi, yi) in enumerate(pts):
            term = float(yi)
            for j, (xj, _) in enumerate(pts):
                if j != i:
                    term *= (x - xj) / (xi - xj)
            total += term
        return total

    return at


def estimated_edge(fn: Callable[[int], float], usable: int, step: int, top: int) -> int:
    """The largest multiple of step up to top whose curve value fits (0: none)."""
    if fn(step) > usable:
        return 0
    lo, hi = 1, top // step + 1  # fits at lo; hi is past the end or does not fit
    if fn(top // step * step) <= usable:
        return top // step * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fn(mid * step) <= usable else (lo, mid)
    return lo * step


def traced_edge(
    tracer: Tracer,
    v: Variant,
    vary: str,
    usable: int,
    start: int,
    seeds: list[tuple[int, int]],
) -> int | None:
    """The edge found with traces under the capacity (None: a value could not be
    predicted). From ``start`` a few secant steps (each through the newest trace and the
    nearest other one: ``seeds`` are the uncapped traces, the same under a capacity they
    fit), then the walk a fit's trials take (``fit_search.decide``) over every trace."""
    seen: dict[int, int] = {}

    def reserved(x: int) -> int | None:
        if x not in seen:
            answer = tracer.one({**v.params, vary: x, "capacity_bytes": usable})
            if answer.peak_reserved is None:
                return None
            seen[x] = answer.peak_reserved
        return seen[x]

    known = [(x, y) for x, y in seeds if y <= usable]
    guess = max(v.step, min(start, v.top))
    for _ in range(SECANT_STEPS):
        y = reserved(guess)
        if y is None:
            return None
        up, down = seen.get(guess + v.step), seen.get(guess - v.step)
        if y <= usable and (guess >= v.top or (up is not None and up > usable)):
            return guess
        if y > usable and (guess == v.step or (down is not None and down <= usable)):
            return guess - v.step
        others = [(x, yy) for x, yy in [*known, *seen.items()] if x != guess and yy != y]
        if not others:
            break
        x2, y2 = min(others, key=lambda p: abs(p[0] - guess))
        at = guess + (usable - y) * (guess - x2) / (y - y2)
        nxt = max(v.step, min(int(at) // v.step * v.step, v.top))
        if nxt == guess:
            nxt = guess + v.step if y <= usable else guess - v.step
        guess = max(v.step, min(nxt, v.top))
    outcomes = [
        Outcome(x, Status.SUCCEEDED, None, None)
        if y <= usable
        else Outcome(x, Status.FAILED, ErrorType.OOM, None)
        for x, y in sorted(seen.items())
    ]
    for _ in range(fit_search.MAX_TRIALS):
        decision = fit_search.decide({}, outcomes, vary, v.step, v.top, guess)
        if decision.fields is not None:
            best = decision.fields.get("max_fitting")
            return 0 if best is None and decision.fields.get("state") == "done" else best
        assert decision.value is not None
        y = reserved(decision.value)
        if y is None:
            return None
        ok = y <= usable
        status, error = (Status.SUCCEEDED, None) if ok else (Status.FAILED, ErrorType.OOM)
        outcomes.append(Outcome(decision.value, status, error, None))
    return None


def _label(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "as given"


def _variant(v: Variant) -> PlanVariant:
    dist = v.params.get("distributed") or {}
    return PlanVariant(
        index=v.index,
        overrides=v.overrides,
        label=_label(v.overrides),
        value=v.value,
        gpus=int(dist.get("gpus") or 1),
    )


def plan(
    body: PlanIn, live: tuple[Card, ...], predict: Predict | None, clock: Callable[[], float]
) -> PlanOut:
    """Answer a plan (``predict``: the predictor, None where this service has none)."""
    started = clock()
    base, allocator = base_spec(body)
    cards = targets(body, live)
    if len(cards) * len(body.variants) > MAX_ANSWERS:
        raise InvalidSpec(
            "variants",
            f"{len(cards)} GPUs x {len(body.variants)} variants is more than a plan answers "
            f"({MAX_ANSWERS}); ask fewer",
        )
    vs = variants(body, base)
    caveats = [CAVEAT]
    model = str(base.get("model"))
    if predict is None:
        caveats.append(predictor_service.UNAVAILABLE)
        blank = [
            PlanAnswer(
                gpu=c.out(),
                variant=_variant(v),
                prediction=None,
                fits=None,
                headroom_bytes=None,
                predicted_max_fitting=None,
            )
            for v in vs
            for c in cards
        ]
        return PlanOut(
            model=model,
            vary=body.vary,
            device=DEVICE,
            params=vs[0].params,
            answers=blank,
            suggestions=[],
            caveats=caveats,
            predictions=0,
            seconds=round(clock() - started, 3),
        )

    def with_allocator(params: dict[str, Any]) -> ModelPrediction:
        return predict(params) if not allocator else predict({**params, "__allocator": allocator})

    tracer = Tracer(with_allocator, time.monotonic() + PLAN_SECONDS)
    traced = tracer.many(
        [{**v.params, body.vary: x, "__log": bool(v.logged)} for v in vs for x in v.points]
    )
    groups = []
    at = 0
    for v in vs:
        groups.append(traced[at : at + len(v.points)])
        at += len(v.points)
    synthesized = _edges(body, tracer, vs, groups, cards) if body.verify else {}
    answers: list[PlanAnswer] = []
    for v, got in zip(vs, groups, strict=True):
        first = got[0]
        for caveat in first.caveats:
            if caveat not in caveats:
                caveats.append(caveat)
        reserved = [g.peak_reserved for g in got]
        fn = (
            curve(v.points, [r for r in reserved if r is not None])
            if all(r is not None for r in reserved)
            else None
        )
        seeds = [(x, r) for x, r in zip(v.points, reserved, strict=True) if r is not None]
        for i, c in enumerate(cards):
            found = synthesized.get((v.index, i))
            answers.append(_answer(body, tracer, v, c, first, fn, seeds, found))
    suggestions = []
    ways: list[CardWays] = []
    if body.suggest:
        short = [a.gpu.name for a in answers if a.variant.index == 0 and a.fits is False]
        if short:
            suggestions = suggest.ranked(
                tracer.soft,
                allowed,
                vs[0].params,
                body.vary,
                vs[0].value,
                answers[0].prediction,
                cards,
                short,
            )
        ways, unranked = fine_tune_ways.ranked(
            tracer.soft,
            normalized,
            vs[0].params,
            groups[0][0],
            [a for a in answers if a.variant.index == 0],
            cards,
        )
        caveats += unranked
    return PlanOut(
        model=model,
        vary=body.vary,
        device=DEVICE,
        params=vs[0].params,
        answers=answers,
        suggestions=suggestions,
        ways=ways,
        caveats=caveats,
        predictions=tracer.asked,
        seconds=round(clock() - started, 3),
    )


def _edges(
    body: PlanIn,
    tracer: Tracer,
    vs: list[Variant],
    groups: list[list[ModelPrediction]],
    cards: list[Target],
) -> dict[tuple[int, int], dict[str, int | None]]:
    """Each (variant, card)'s edge from the variant's traced logs, replayed under the
    card's capacity by the predictor (workers/models/edges.py), all asked at once."""
    asks: list[tuple[int, dict[str, Any]]] = []
    for v, got in zip(vs, groups, strict=True):
        logs = {x: g.log_ints() for x, g in zip(v.points, got, strict=True)}
        if not v.logged or any(logs.get(x) is None for x in v.logged):
            continue
        edges = {
            "points": [[x, logs[x]] for x in v.logged],
            "capacities": [c.usable_bytes for c in cards],
            "step": v.step,
            "top": v.top,
            "value": v.value,
        }
        asks.append((v.index, {**v.params, "__edges": edges}))
    if not asks:
        return {}
    found = tracer.many([params for _, params in asks])
    return {
        (index, i): edge
        for (index, _), a in zip(asks, found, strict=True)
        for i, edge in enumerate(a.edges or ())
    }


def _answer(
    body: PlanIn,
    tracer: Tracer,
    v: Variant,
    c: Target,
    first: ModelPrediction,
    fn: Callable[[int], float] | None,
    seeds: list[tuple[int, int]],
    found: dict[str, int | None] | None = None,
) -> PlanAnswer:
    variant = _variant(v)
    if first.peak_allocated is None or first.peak_reserved is None:
        return PlanAnswer(
            gpu=c.out(),
            variant=variant,
            prediction=None,
            fits=None,
            headroom_bytes=None,
            predicted_max_fitting=None,
            note="; ".join(first.caveats) or None,
        )
    prediction = PlanPrediction(
        peak_allocated=first.peak_allocated,
        peak_reserved=first.peak_reserved,
        categories=dict(first.categories or {}),
        parameters=first.parameter_count,
        trainable_parameters=first.trainable_parameter_count,
    )
    usable = c.usable_bytes
    fits = first.peak_reserved <= usable
    note = None
    how: Literal["estimated", "traced"] | None = None
    edge: int | None = None
    if body.verify:
        capped_at_value = None if found is None else found.get("reserved_at_value")
        if not fits and capped_at_value is not None:
            fits = capped_at_value <= usable
        elif not fits:  # the capped allocator may still fit it by releasing its cache
            capped = tracer.one({**v.params, "capacity_bytes": usable})
            fits = capped.peak_reserved is not None and capped.peak_reserved <= usable
        if found is not None and found.get("edge") is not None:
            edge, how = found["edge"], "traced"
        else:
            start = v.value if fn is None else _guess(fn, usable, v)
            edge, how = traced_edge(tracer, v, body.vary, usable, start, seeds), "traced"
    elif fn is not None:
        edge, how = estimated_edge(fn, usable, v.step, v.top), "estimated"
        shape = "a line" if len(v.points) == 2 else "a parabola"
        note = f"edge read off {shape} through {body.vary} " + ", ".join(
            str(x) for x in sorted(v.points)
        )
    if edge is not None and edge >= v.top and v.top < fit_search.PARAM_MAXIMUM[body.vary]:
        note = f"{v.top} is the most this model or max_value allows"
    return PlanAnswer(
        gpu=c.out(),
        variant=variant,
        prediction=prediction,
        fits=fits,
        headroom_bytes=usable - first.peak_reserved,
        predicted_max_fitting=edge,
        edge=how,
        note=note,
    )


def _guess(fn: Callable[[int], float], usable: int, v: Variant) -> int:
    return max(estimated_edge(fn, usable, v.step, v.top), v.step)


def predictor_of(settings: Settings, submitter: str) -> Predict | None:
    """The service's model predictor as a plan calls it (CUDA; the spec's allocator
    settings ride in the params as ``__allocator``; ``submitter``: whose turn it takes in
    the predictor's fair queue), or None where there is none."""
    shared = predictor_service.shared(settings)
    if shared is None:
        return None

    def predict(params: dict[str, Any]) -> ModelPrediction:
        params = dict(params)
        allocator = params.pop("__allocator", None)
        extra = {"log": params.pop("__log", False), "edges": params.pop("__edges", None)}
        extra = {k: v for k, v in extra.items() if v}
        return shared.predict(params, DEVICE, allocator, submitter, extra)

    return predict
