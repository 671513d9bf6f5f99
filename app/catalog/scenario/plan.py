"""A scenario's plan: its steps validated in order, repeat blocks planned until they
cycle, and the named tensors' bytes predicted after each top-level step.

The plan predicts the bytes the named tensors hold after each top-level step, and the
most they hold at once, inside a step included (``x = exp(x)`` holds the old and the new
``x`` for a moment). Planning is linear in what the steps touch, and that is bounded
(MAX_TENSOR_STEPS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.catalog.model import CatalogError
from app.catalog.scenario.bounds import (
    MAX_EXECUTED_STEPS,
    MAX_PLANNED_STEPS,
    MAX_REPEAT_DEPTH,
    MAX_TOP_STEPS,
    MAX_WRITTEN_STEPS,
)
from app.catalog.scenario.ledger import Ledger
from app.catalog.scenario.steps import HANDLERS, get
from app.catalog.scenario.vocabulary import ALLOWED, FIELDS, STEP_KINDS, step_title
from app.core.contract import Prediction, StepPrediction
from vramlab.catalog.devices import canonical_device


def _run(state: Ledger, steps: Any, where: str, depth: int) -> list[StepPrediction]:
    if not isinstance(steps, list) or not steps:
        raise CatalogError(where, "must be a non-empty list of steps")
    if depth == 0 and len(steps) > MAX_TOP_STEPS:
        raise CatalogError(where, f"at most {MAX_TOP_STEPS} top-level steps")
    out: list[StepPrediction] = []
    for i, step in enumerate(steps):
        at = f"{where}[{i}]"
        if not isinstance(step, dict):
            raise CatalogError(at, "must be an object with a 'do' field")
        kind = step.get("do")
        if kind not in STEP_KINDS:
            raise CatalogError(f"{at}.do", f"must be one of {', '.join(STEP_KINDS)}")
        unknown = step.keys() - ALLOWED[kind]
        if unknown:
            raise CatalogError(
                f"{at}.{min(unknown)}",
                f"unknown field for {kind}; allowed: "
                f"{', '.join(sorted(FIELDS[kind] | {'label'})) or 'label'}",
            )
        label = step.get("label")
        if label is not None and (not isinstance(label, str) or not 0 < len(label) <= 64):
            raise CatalogError(f"{at}.label", "must be a string of 1 to 64 characters")
        state.executed += 1
        state.planned += 1
        if state.planned > MAX_PLANNED_STEPS:
            raise CatalogError(
                "steps",
                f"planning would take more than {MAX_PLANNED_STEPS} steps one by one: a "
                f"repeat block is planned until its iterations cycle, and this one changes "
                f"its tensors for too long (delete fewer elements per iteration, or write "
                f"a shorter block)",
            )
        if state.executed > MAX_EXECUTED_STEPS:
            raise CatalogError(where, f"runs more than {MAX_EXECUTED_STEPS} steps in all")
        state.charge(1, at)
        if kind == "repeat":
            if depth + 1 > MAX_REPEAT_DEPTH:
                raise CatalogError(at, f"repeat blocks nest at most {MAX_REPEAT_DEPTH} deep")
            times = get(step, "times", at, int)
            if not 1 <= times <= MAX_EXECUTED_STEPS:
                raise CatalogError(f"{at}.times", f"must be between 1 and {MAX_EXECUTED_STEPS}")
            _repeat(state, step.get("steps"), times, at, depth + 1)
        elif kind in HANDLERS:
            HANDLERS[kind](state, step, at)
        state.mark()
        if depth == 0:
            live = state.live(state.device)
            out.append(
                StepPrediction(
                    label=label or step_title(step),
                    allocated_after=live,
                    host_tensor_bytes=state.live("cpu") if state.device != "cpu" else None,
                )
            )
    return out


def _repeat(state: Ledger, steps: Any, times: int, at: str, depth: int) -> None:
    """Run a repeat block's steps ``times`` times, but stop once the state after an
    iteration matches the state after an earlier one: from there the iterations cycle
    (same tensors, same bytes, same peaks), so the rest are counted, not planned."""
    where = f"{at}.steps"
    _run(state, steps, where, depth)  # the first iteration validates the steps
    bound = _bound_names(steps)
    seen: dict[tuple[Any, ...], tuple[int, int, int]] = {}
    done = 1
    while done < times:
        sig = state.signature(bound)
        if sig in seen:
            first, executed, work = seen[sig]
            period = done - first
            cycles = (times - done) // period
            per_executed, per_work = state.executed - executed, state.work - work
            state.executed += cycles * per_executed
            if state.executed > MAX_EXECUTED_STEPS:
                raise CatalogError(where, f"runs more than {MAX_EXECUTED_STEPS} steps in all")
            state.charge(cycles * per_work, at)
            done += cycles * period
            seen.clear()  # what is left (less than a period) runs step by step
            if done >= times:
                break
        else:
            seen[sig] = (done, state.executed, state.work)
        _run(state, steps, where, depth)
        done += 1


def _written(steps: Any, depth: int) -> int:
    """How many step objects a spec writes, repeat bodies included (not yet validated:
    anything that is not a list of steps counts as what it is, and _run refuses it)."""
    if not isinstance(steps, list) or depth > MAX_REPEAT_DEPTH:
        return 0
    inner = (s.get("steps") for s in steps if isinstance(s, dict) and s.get("do") == "repeat")
    return len(steps) + sum(_written(body, depth + 1) for body in inner)


def _bound_names(steps: list[dict[str, Any]]) -> frozenset[str]:
    """The names a (validated) block of steps binds or drops, nested blocks included."""
    found: set[str] = set()
    for step in steps:
        if step["do"] == "repeat":
            found |= _bound_names(step["steps"])
        elif step["do"] in ("create", "move", "pin", "delete"):
            found.add(step["name"])
        elif step["do"] == "op":
            found.add(step.get("name") or step["args"][0])
    return frozenset(found)


@dataclass(frozen=True)
class ScenarioPlan:
    steps: list[dict[str, Any]]  # the validated steps, as stored and sent to the worker
    devices: tuple[str, ...]
    peak_bytes: int  # the most the named tensors hold at once, on the scenario's device
    total_bytes: int  # the most held on every device at once, for the service's cap
    prediction: dict[str, Any]
    work: int  # tensor-steps: steps run plus tensors made, bound or freed
    planned: int  # steps the planner ran one by one (its own cost)


def plan_scenario(steps: Any, dtype: str, device: str) -> ScenarioPlan:
    """Validate a scenario's steps and predict the named tensors' bytes after each step."""
    device = canonical_device(device)
    if _written(steps, 0) > MAX_WRITTEN_STEPS:
        raise CatalogError("steps", f"at most {MAX_WRITTEN_STEPS} steps written in all")
    state = Ledger(dtype, device)
    per_step = _run(state, steps, "steps", 0)
    devices = {device} | _walk_creates(steps)
    finals = state.live(device)
    # The scenario's device at its peak beside the others at the end, or all devices'
    # most at once, whichever is more: the figure the service's byte cap is checked on.
    total = max(state.peak + sum(state.live(d) for d in devices if d != device), state.peak_all)
    caveats = [
        "temporaries inside a step, library workspaces and the allocator's segments "
        "are measured, not predicted",
    ]
    prediction = Prediction(
        label="prediction",
        device=device,
        allocated_before=0,
        delta_allocated=finals,
        allocated_after=finals,
        peak_named_bytes=state.peak,
        host_tensor_bytes=state.live("cpu"),
        inputs=[],
        outputs=[],
        steps=per_step,
        rounding="CUDA blocks rounded up to 512 bytes" if device != "cpu" else "none",
        devices=sorted(devices),
        exact=False,
        caveats=caveats,
    )
    return ScenarioPlan(
        steps,
        tuple(sorted(devices)),
        state.peak,
        total,
        prediction.model_dump(exclude_unset=True),
        state.work,
        state.planned,
    )


def _walk_creates(steps: list[Any]) -> set[str]:
    """Devices the steps name beyond the scenario's own (pinned memory needs CUDA)."""
    found: set[str] = set()
    for step in steps:
        if step.get("do") == "repeat":
            found |= _walk_creates(step["steps"])
            continue
        if step.get("do") in ("create", "move") and step.get("device"):
            found.add(canonical_device(step["device"]))
        if step.get("do") == "pin" or step.get("pin_memory"):
            found.add("cuda:0")  # pinned host memory needs a CUDA driver
    return found
