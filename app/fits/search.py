"""The fit search itself: predict the largest fitting value, then measure around it.

Each variant of a fit is searched on its own, in index space (a value is ``k * step``:
the step is ``micro_batches`` when the batch size is varied, else 1). First the
predictor's peak is bisected against the capacity (``predict``), then trials are
queued one at a time (``next_trial``): the first at the prediction, then a gallop away
from it (+1, +2, +4, ... above a success; -1, -2, -4, ... below an OOM) until a value
that fits and one that runs out of memory bracket the answer, then bisection until
they are neighbours. A trial that fails for any other reason stops its variant.

A distributed spec (``params.distributed``) is searched the same way, over the batch per
GPU: the capacity is every rank's card, a trial fits when every rank's peak does (on the
CPU each rank's measured peak is judged; on CUDA each rank's allocator is capped), and the
prediction is judged by its highest rank (``highest_rank``).

Everything here is a pure function of a variant's stored state and its trials'
outcomes, so a step that is lost (a crash, a compare-and-set that lost) is simply
taken again (``app.fits.engine``).
"""

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.core.config import Settings
from app.core.errors import InvalidSpec
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import AcceptedSpec, accept
from vramlab.contract import FIT_VARIES, ErrorType, Status
from vramlab.runspec import model_maximum
from vramlab.units import human_bytes

# Where the catalog bounds a varied param (ModelParams declares it): a fit searches no higher.
PARAM_MAXIMUM = {vary: model_maximum(vary) or 0 for vary in FIT_VARIES}
MAX_TRIALS = 64  # per variant: a bisection of the widest range takes about 40


@dataclass(frozen=True)
class Outcome:
    """What a variant needs to know of one finished (or pending) trial."""

    value: int
    status: Status
    error_type: str | None
    error_message: str | None


def tag(fit_id: str) -> str:
    return f"fit:{fit_id[:8]}"


def merged_params(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**(spec.get("params") or {}), **overrides}


def step_of(vary: str, params: Mapping[str, Any]) -> int:
    """Values of ``vary`` a variant may take are multiples of this."""
    if vary == "batch_size":
        micro = params.get("micro_batches") or 1
        return micro if isinstance(micro, int) and micro > 0 else 1
    return 1


def trial_spec(
    spec: Mapping[str, Any],
    overrides: Mapping[str, Any],
    vary: str,
    value: int,
    capacity: int,
    gpu_name: str | None,
    fit_id: str,
) -> dict[str, Any]:
    """A trial's raw spec: the fit's spec with the variant's overrides, the value tried
    and the capacity (the run's emulated card), tagged with its fit."""
    raw = copy.deepcopy(dict(spec))
    raw["params"] = {**merged_params(spec, overrides), vary: value, "capacity_bytes": capacity}
    if gpu_name is not None:
        raw["requirements"] = {**(raw.get("requirements") or {}), "gpu_name": gpu_name}
    raw["tags"] = list(dict.fromkeys([*(raw.get("tags") or []), tag(fit_id)]))
    return raw


def check(raw: dict[str, Any], settings: Settings, predict: bool = True) -> AcceptedSpec:
    """A raw spec accepted as POST /v1/experiments accepts one (InvalidSpec if not)."""
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "spec"
        raise InvalidSpec(field, first["msg"]) from None
    return accept(spec, settings, predict_models=predict)


Try = Callable[[int], AcceptedSpec]


def predict(attempt: Try, step: int, upper: int) -> dict[str, Any]:
    """The largest value whose predicted peak fits, found by galloping then bisecting on
    ``attempt(value)`` (an accepted trial spec; its prediction says whether it fits).
    Returns the variant fields it settles: ``predicted_max_fitting`` (0: not even one
    step fits; None: nothing is predicted), and ``limit``/``note`` where the catalog
    refuses a value below ``upper``."""
    out: dict[str, Any] = {"predicted_max_fitting": None}
    # Each value predicted on the way (value, peak allocated, peak reserved): the fit's
    # plot draws them as the variant's predicted curve before any trial has run.
    points: dict[int, list[int | None]] = {}
    top = upper // step

    def fits(k: int) -> bool | None:
        nonlocal top
        try:
            accepted = attempt(k * step)
        except InvalidSpec as exc:
            top = min(top, k - 1)
            out["limit"], out["note"] = k * step, refusal(exc)
            return False
        # What the capped allocator reserves (fragmentation included) decides; a
        # prediction without it falls back on what the step allocates.
        predicted = highest_rank(accepted.prediction)
        peak = predicted.get("peak_reserved") or predicted.get("peak_allocated")
        if peak is None:
            return None
        points[k * step] = [predicted.get("peak_allocated"), predicted.get("peak_reserved")]
        out["predicted_points"] = [[v, *points[v]] for v in sorted(points)]
        capacity = accepted.spec.params["capacity_bytes"]
        return bool(peak <= capacity)

    first = fits(1)
    if first is None:
        return out
    if not first:
        out["predicted_max_fitting"] = 0
        return out
    lo, k = 1, 2
    while k <= top:
        answer = fits(k)
        if answer is None:
            return out
        if not answer:
            break
        lo, k = k, k * 2
    hi = min(k, top + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        answer = fits(mid)
        if answer is None:
            return out
        lo, hi = (mid, hi) if answer else (lo, mid)
    out["predicted_max_fitting"] = lo * step
    return out


def highest_rank(prediction: Mapping[str, Any]) -> Mapping[str, Any]:
    """The figures a value fits by: a distributed spec's highest rank (every rank must
    fit its card), else the prediction's own."""
    ranks = prediction.get("ranks") or []
    if not ranks:
        return prediction
    return max(ranks, key=lambda r: r.get("peak_reserved") or r.get("peak_allocated") or 0)


def none_fits(variant: Mapping[str, Any], vary: str, step: int) -> str:
    """Why a variant has no answer: even its smallest value ran out of memory, and what
    that value is predicted to need."""
    for value, allocated, reserved in variant.get("predicted_points") or []:
        needs = reserved or allocated
        if value == step and needs:
            return (
                f"none fits: even {step} needs {human_bytes(needs)} (predicted; "
                f"{vary}={step} ran out of memory)"
            )
    return f"none fits: even {vary}={step} ran out of memory"


def refusal(exc: InvalidSpec) -> str:
    detail = exc.details[0] if exc.details else {"field": "spec", "message": exc.message}
    return f"{detail['field']}: {detail['message']}"


def upper_bound(variant: Mapping[str, Any], vary: str, max_value: int) -> int:
    upper = min(max_value, PARAM_MAXIMUM[vary])
    if variant.get("limit") is not None:
        upper = min(upper, variant["limit"] - 1)
    return upper


@dataclass(frozen=True)
class Decision:
    """A variant's next move: a value to try, or its end (``fields`` to store)."""

    value: int | None = None
    fields: dict[str, Any] | None = None


def decide(
    variant: Mapping[str, Any],
    outcomes: list[Outcome],
    vary: str,
    step: int,
    upper: int,
    start: int,
) -> Decision:
    """What to do next, from the trials that finished (none may be pending)."""
    ok: list[int] = []
    oom: list[int] = []
    for o in outcomes:
        k = o.value // step
        if o.status == Status.SUCCEEDED:
            ok.append(k)
        elif o.status == Status.FAILED and o.error_type == ErrorType.OOM:
            oom.append(k)
        else:
            why = o.error_type or str(o.status)
            said = f": {o.error_message}" if o.error_message else ""
            return Decision(
                fields={"state": "failed", "error": f"the trial at {vary}={o.value} {why}{said}"}
            )
    hi = min(oom) if oom else None
    below = [k for k in ok if hi is None or k < hi]
    lo = max(below) if below else None
    top = upper // step
    if hi is not None and hi <= 1:
        return Decision(
            fields={
                "state": "done",
                "max_fitting": None,
                "first_failing": step,
                "note": none_fits(variant, vary, step),
            }
        )
    if lo is not None and hi is not None and hi == lo + 1:
        return Decision(
            fields={"state": "done", "max_fitting": lo * step, "first_failing": hi * step}
        )
    if lo is not None and lo >= top:
        note = variant.get("note") or f"{lo * step} is the search's upper bound"
        return Decision(
            fields={"state": "done", "max_fitting": lo * step, "first_failing": None, "note": note}
        )
    if top < 1:
        why = variant.get("note") or f"no value of {vary} is allowed"
        return Decision(fields={"state": "failed", "error": why})
    if len(outcomes) >= MAX_TRIALS:
        return Decision(fields={"state": "failed", "error": f"no answer after {MAX_TRIALS} trials"})
    if lo is None and hi is None:
        k = start // step
    elif hi is None:
        assert lo is not None
        k = lo + 2 ** (len(ok) - 1)
    elif lo is None:
        k = hi - 2 ** (len(oom) - 1)
    else:
        k = (lo + hi) // 2
    return Decision(value=max(1, min(k, top)) * step)
