"""Turning a submitted spec into an accepted one: catalog checks, limits, requirements.

This is the CPU-bound part of a submit (a scenario is planned step by step), so callers
do it before they open the write transaction that queues the result.
"""

import json
import shlex
from dataclasses import dataclass
from typing import Any

from app.catalog import CatalogError, get_op, parse_device, plan_spec
from app.catalog.families.scenario import SCENARIO
from app.catalog.scenario.plan import ScenarioPlan, plan_scenario
from app.core.config import Settings
from app.core.errors import InvalidSpec
from app.experiments import predictor as predictor_service
from app.experiments.spec_schemas import ExperimentSpec
from vramlab.catalog.dtypes import DTYPES
from vramlab.contract import Isolation
from vramlab.units import human_bytes

MODEL_OP = "model"
DISABLED = "not predicted: model predictions are off on this service (VRAMLAB_MODEL_PREDICTIONS)"


@dataclass(frozen=True)
class AcceptedSpec:
    spec: ExperimentSpec  # params filled, device canonical, tags each once
    device_type: str
    gpus_needed: int  # how many GPUs a worker needs: the highest cuda index named, plus one
    prediction: dict[str, Any]
    plan_steps: int = 0  # steps a scenario's planning ran one by one (0: one op, or cached)

    @property
    def gpu_name(self) -> str | None:
        return self.spec.requirements.gpu_name

    @property
    def min_memory_bytes(self) -> int | None:
        return self.spec.requirements.min_memory_bytes


# Scenario plans by (steps as JSON, dtype, device): a sweep whose points share their steps
# plans them once.
PlanCache = dict[tuple[str, str, str], ScenarioPlan]


@dataclass(frozen=True)
class _Planned:
    params: dict[str, Any]
    total_bytes: int
    devices: tuple[str, ...]
    prediction: dict[str, Any]
    planned: int = 0


def _plan(spec: ExperimentSpec, device: str, cache: PlanCache | None) -> _Planned:
    """One op's plan, or a scenario's from its steps (``op: "scenario"``)."""
    if spec.op == SCENARIO.name:
        if spec.steps is None:
            raise CatalogError("steps", "a scenario needs steps")
        params = SCENARIO.check_params(spec.params)
        key = (json.dumps(spec.steps, sort_keys=True), spec.dtype, device)
        cached = cache.get(key) if cache is not None else None
        scenario = cached or plan_scenario(spec.steps, spec.dtype, device)
        if cache is not None:
            cache[key] = scenario
        planned = 0 if cached else scenario.planned
        return _Planned(
            params, scenario.total_bytes, scenario.devices, scenario.prediction, planned
        )
    if spec.steps is not None:
        raise CatalogError("steps", f"only op 'scenario' takes steps, not {spec.op!r}")
    params, plan = plan_spec(spec.op, tuple(spec.shape), spec.params, spec.dtype, device)
    return _Planned(params, plan.total_bytes, plan.devices, plan.prediction(device))


@dataclass(frozen=True)
class ModelQuestion:
    """What the model predictor is asked for a spec (``Predictor.predict``'s arguments)."""

    params: dict[str, Any]
    device_type: str
    allocator: dict[str, Any]


def model_question(accepted: AcceptedSpec, predict_for: str | None = None) -> ModelQuestion | None:
    """The question a model spec accepted without its prediction asks (None: not a model
    spec); see ``accept(..., predict_models=False)``. ``predict_for``: as ``accept``'s."""
    spec = accepted.spec
    if spec.op != MODEL_OP or spec.device is None:
        return None
    device_type = predict_for or ("cpu" if spec.device == "cpu" else "cuda")
    return ModelQuestion(
        dict(spec.params), device_type, spec.allocator.model_dump(exclude_none=True)
    )


def predicted_for(device_type: str) -> str:
    """Which device a model's predicted figures are for, in the words every view shows."""
    return "cuda (H100-class)" if device_type == "cuda" else "cpu"


def plan_command(params: dict[str, Any]) -> str:
    """The ``vramlab plan`` line that asks the same question of a GPU, running nothing."""
    words = ["vramlab", "plan", str(params.get("model")), "--batch", str(params.get("batch_size"))]
    if params.get("seq_len"):
        words += ["--seq", str(params["seq_len"])]
    return " ".join(shlex.quote(w) for w in [*words, "--gpu", "H100 80GB"])


def _held(categories: dict[str, int]) -> str:
    top = sorted(((v, k) for k, v in categories.items() if v), reverse=True)
    return ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for v, k in top)


class OverTheCap(InvalidSpec):
    """A model spec predicted to peak past the experiment cap: 422 whose detail carries
    the prediction (peak, categories, the device it is for) and the plan to ask instead."""

    def __init__(self, prediction: dict[str, Any], params: dict[str, Any], cap: int) -> None:
        command = plan_command(params)
        peak = prediction["peak_allocated"]
        held = _held(prediction.get("categories") or {})
        super().__init__(
            "params",
            f"predicted for {prediction['predicted_for']}, the step peaks at "
            f"{human_bytes(peak)} allocated ({peak} bytes{': ' + held if held else ''}); this "
            f"service runs at most {human_bytes(cap)} (VRAMLAB_MAX_EXPERIMENT_BYTES). To ask "
            f"whether it fits a GPU without running it, make a plan: `{command}` "
            f"(POST /v1/plans, any GPU, no cap). To run it here, make it smaller (batch_size, "
            f"seq_len, checkpointing, precision) or set capacity_bytes to bound the run",
        )
        self.details[0]["prediction"] = {
            **prediction,
            "plan": {"command": command, "route": "POST /v1/plans"},
        }


def _predict_model(
    spec: ExperimentSpec,
    params: dict[str, Any],
    device: str,
    settings: Settings,
    predicted: predictor_service.ModelPrediction | None,
    submitter: str,
    predict_for: str | None = None,
) -> dict[str, Any]:
    """A model spec's predicted peak, categories and caveats (prediction fields), or a
    caveat saying why there is none; 422 when its predicted peak passes the service's cap
    (unless ``capacity_bytes`` already bounds the run below the cap). ``predicted``: the
    answer already asked for (an async submit waits for it without a thread).
    ``predict_for``: a device type to predict for other than the one it runs on (a spec
    that named none, on a service whose workers offer only the CPU, is predicted for
    CUDA)."""
    device_type = predict_for or ("cpu" if device == "cpu" else "cuda")
    predictor = predictor_service.shared(settings)
    if predicted is None and predictor is None:
        why = predictor_service.UNAVAILABLE if settings.model_predictions else DISABLED
        return {"caveats": [why]}
    try:
        answer = predicted or predictor.predict(  # type: ignore[union-attr]
            params, device_type, spec.allocator.model_dump(exclude_none=True), submitter
        )
    except CatalogError as exc:
        raise InvalidSpec(exc.field, exc.message) from None
    capacity = params.get("capacity_bytes")
    bounded = capacity is not None and capacity <= settings.max_experiment_bytes
    if answer.peak_allocated is None:
        return {"caveats": list(answer.caveats)}
    caveats = list(answer.caveats)
    runs_on = "cpu" if device == "cpu" else "cuda"
    if device_type != runs_on:
        caveats.insert(
            0,
            f"predicted for {predicted_for(device_type)}, the card a model question is "
            f"about: no device was named and the workers here offer only the {runs_on}, "
            f"where it runs (its measured peak differs); name a device to predict for it",
        )
    out = {
        "peak_allocated": answer.peak_allocated,
        "peak_reserved": answer.peak_reserved,
        "categories": answer.categories,
        "predicted_for": predicted_for(device_type),
        "caveats": caveats,
    }
    plan = params.get("distributed")
    if plan:  # ranks on equal batches hold alike: rank 0 traced, each rank its figures
        peaks = {k: out[k] for k in ("peak_allocated", "peak_reserved", "categories")}
        out["ranks"] = [{"rank": r, **peaks} for r in range(int(plan["gpus"]))]
        caveats.append(
            f"per rank, each of {plan['gpus']}: rank 0's step traced under PyTorch's fake "
            f"process group (collectives move no bytes; {plan['strategy']}'s ranks on equal "
            f"batches hold alike)"
        )
    if answer.peak_allocated > settings.max_experiment_bytes and not bounded:
        raise OverTheCap(out, params, settings.max_experiment_bytes)
    return out


def accept(
    spec: ExperimentSpec,
    settings: Settings,
    cache: PlanCache | None = None,
    predict_models: bool = True,
    predicted: predictor_service.ModelPrediction | None = None,
    submitter: str = predictor_service.INTERNAL,
    predict_for: str | None = None,
) -> AcceptedSpec:
    """Check a spec against the catalog and the limits; raise InvalidSpec naming every
    field that is wrong (all at once, so a client fixes them in one go).

    A model spec is predicted (its thread waits) for ``submitter``, unless ``predicted``
    holds the answer already (``model_question`` says what to ask) or ``predict_models``
    is off (a sweep's points).

    ``cache`` lets a sweep plan each distinct scenario once (``plan_steps`` is then 0 for
    the points that reuse a plan). ``predict_for``: the device type a model spec is
    predicted for, when not the one it runs on (``predict_device``).
    """
    problems: list[tuple[str, str]] = []
    try:
        entry = get_op(spec.op)
        if "diagnostic" in entry.tags and not settings.diagnostic_ops:
            problems.append(("op", f"op {spec.op!r} is a diagnostic op, off on this service"))
    except CatalogError as exc:
        problems.append((exc.field, exc.message))
    if spec.dtype not in DTYPES:
        problems.append(("dtype", f"unknown dtype {spec.dtype!r}; allowed: {', '.join(DTYPES)}"))
    device = "cpu"
    if spec.device is None:
        problems.append(("device", "no device chosen"))  # callers resolve it first
    else:
        try:
            kind, index = parse_device(spec.device)
            device = "cpu" if kind == "cpu" else f"cuda:{index}"
        except ValueError as exc:
            problems.append(("device", str(exc)))
    if spec.repeat > settings.max_repeat:
        problems.append(("repeat", f"must be <= {settings.max_repeat}"))
    if spec.timeout_s > settings.max_timeout_s:
        problems.append(("timeout_s", f"must be <= {settings.max_timeout_s:g}"))
    allocator_set = sorted(spec.allocator.model_dump(exclude_none=True))
    if spec.isolation == Isolation.SHARED and allocator_set:
        named = ", ".join(f"allocator.{k}" for k in allocator_set)
        problems.append(
            (
                "isolation",
                f"'shared' runs in a process whose caching allocator has already started, and "
                f"its settings are fixed when it starts; this spec sets {named}: leave them "
                f"out, or use isolation 'clean'",
            )
        )
    if problems:
        raise InvalidSpec(*problems[0], *problems[1:])
    try:
        plan = _plan(spec, device, cache)
    except CatalogError as exc:
        raise InvalidSpec(exc.field, exc.message) from None

    if plan.total_bytes > settings.max_experiment_bytes:
        raise InvalidSpec(
            "steps" if spec.steps is not None else "shape",
            f"the tensors would take {human_bytes(plan.total_bytes)}; this service allows at most "
            f"{human_bytes(settings.max_experiment_bytes)} (VRAMLAB_MAX_EXPERIMENT_BYTES)",
        )
    prediction = plan.prediction
    if spec.op == MODEL_OP:
        if (plan.params.get("capacity_bytes") or 0) > settings.max_experiment_bytes:
            raise InvalidSpec(
                "params.capacity_bytes",
                f"the emulated card ({human_bytes(plan.params['capacity_bytes'])}) is larger "
                f"than this service's cap on an experiment, "
                f"{human_bytes(settings.max_experiment_bytes)} (VRAMLAB_MAX_EXPERIMENT_BYTES), "
                f"which would stop the run first; raise the cap or use a smaller capacity",
            )
        extra = (
            _predict_model(spec, plan.params, device, settings, predicted, submitter, predict_for)
            if predict_models
            else {"caveats": ["not predicted: a sweep's model points are measured only"]}
        )
        caveats = [*prediction.get("caveats", []), *extra.pop("caveats")]
        prediction = {**prediction, **extra, "caveats": caveats}
    # The spec's own device counts with the plan's: a model's plan names no tensors, and
    # its step runs on the device the spec names (a CPU worker must never take it).
    on_devices = {*plan.devices, device}
    cuda_indexes = [parse_device(d)[1] for d in on_devices if d.startswith("cuda")]
    ranks = (plan.params.get("distributed") or {}).get("gpus") if spec.op == MODEL_OP else None
    if ranks and cuda_indexes:  # one rank a GPU: cuda:0 to cuda:N-1 of one worker's host
        cuda_indexes.append(int(ranks) - 1)
    # Tags as stored: each once, in the order given.
    tags = list(dict.fromkeys(spec.tags))
    accepted = spec.model_copy(update={"params": plan.params, "device": device, "tags": tags})
    return AcceptedSpec(
        spec=accepted,
        device_type="cuda" if cuda_indexes else "cpu",
        gpus_needed=max(cuda_indexes) + 1 if cuda_indexes else 0,
        prediction=prediction,
        plan_steps=plan.planned,
    )


def predict_device(given: ExperimentSpec, resolved: ExperimentSpec) -> str | None:
    """The device type to predict a model spec for, when not the one it will run on: a
    model question that named no device, on a service whose workers offer only the CPU,
    is about a GPU (CUDA), and its prediction says so."""
    if given.op == MODEL_OP and given.device is None and resolved.device == "cpu":
        return "cuda"
    return None
