"""Scenarios through the Runner on the CPU: each step measured and marked in the trace."""

import gzip
import json
from typing import Any

from app.catalog.scenario.plan import plan_scenario
from workers.runner import Runner


def scenario_spec(steps: list[dict[str, Any]], device: str = "cpu", **extra: Any) -> dict[str, Any]:
    plan = plan_scenario(steps, "float32", device)
    spec: dict[str, Any] = {
        "op": "scenario",
        "shape": [],
        "params": {"on_error": "stop"},
        "dtype": "float32",
        "device": device,
        "warmup": 0,
        "repeat": 1,
        "timeout_s": 60.0,
        "allocator": {},
        "trace": "events",
        "prediction": plan.prediction,
        "steps": plan.steps,
    }
    spec.update(extra)
    return spec


STEPS = [
    {"do": "create", "name": "a", "fn": "ones", "shape": [128, 128]},
    {"do": "op", "name": "b", "fn": "matmul", "args": ["a", "a"]},
    {"do": "delete", "name": "a"},
    {
        "do": "repeat",
        "times": 5,
        "steps": [
            {"do": "create", "name": "t", "fn": "randn", "shape": [64]},
            {"do": "delete", "name": "t"},
        ],
    },
    {"do": "op", "name": "v", "fn": "narrow", "args": ["b"], "length": 1, "label": "slice"},
    {"do": "delete", "name": "b"},
]


def test_each_step_has_figures_a_prediction_and_a_mark(runner: Runner) -> None:
    outcome = runner.run(scenario_spec(STEPS))
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    steps = outcome.result["steps"]
    assert [s["do"] for s in steps] == [s["do"] for s in STEPS]
    assert steps[4]["name"] == "04 slice"
    full = 128 * 128 * 4
    ends = [s["allocated_end"] for s in steps]
    assert ends == [full, 2 * full, full, full, full, full]  # the view keeps b alive
    assert ends == [s["predicted_allocated_after"] for s in steps]
    assert outcome.result["memory"]["allocated_peak"] >= 2 * full
    assert outcome.result["placement"]["tensors"]["v"][0]["shape"] == [1, 128]
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        marks = [json.loads(x)["name"] for x in lines if '"mark"' in x]
    outcome.trace_path.unlink()
    assert marks == [s["name"] for s in steps]


def test_a_failing_step_stops_or_is_recorded(runner: Runner) -> None:
    steps = [
        {"do": "create", "name": "a", "fn": "ones", "shape": [8]},
        {"do": "create", "name": "bad", "fn": "randn", "shape": [8], "dtype": "float8_e4m3fn"},
        {"do": "op", "name": "c", "fn": "relu", "args": ["a"]},
    ]
    stopped = runner.run(scenario_spec(steps, trace="none"))
    assert stopped.status == "failed" and stopped.error is not None
    assert stopped.error["type"] == "unsupported_on_device"
    assert stopped.result is not None and len(stopped.result["steps"]) == 2
    going = runner.run(scenario_spec(steps, trace="none", params={"on_error": "continue"}))
    assert going.status == "succeeded" and going.result is not None
    assert [s["error"] is not None for s in going.result["steps"]] == [False, True, False]
