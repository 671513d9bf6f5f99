"""The service's byte cap holds on what the run really allocates, on the CPU: an OS limit
on the child. (The CUDA side is in tests/workers/test_cuda.py.)"""

import resource
from typing import Any

import pytest
import torch

from tests.workers.conftest import SpecFactory
from tests.workers.test_scenario import scenario_spec
from vramlab.runspec import RunSpec
from workers import limits
from workers.runner import Runner

MiB = 2**20
# The case: predicted at 2.6 MB, it peaks near 1 GB (float64 im2col on the CPU).
CONV = (
    "conv2d",
    [1, 8, 128, 128],
    {"out_channels": 8, "kernel_size": 31, "padding": 15},
)


def test_a_run_past_the_cap_ends_memory_limit_and_the_next_one_runs(
    runner: Runner, make_spec: SpecFactory
) -> None:
    op, shape, params = CONV
    spec = make_spec(op, shape, params, dtype="float64", memory_limit_bytes=64 * MiB)
    assert spec["prediction"]["delta_allocated"] < 64 * MiB  # the API would accept it
    outcome = runner.run(spec)
    assert outcome.status == "failed", outcome.result
    assert outcome.error is not None and outcome.error["type"] == "memory_limit", outcome.error
    details = outcome.error["details"]
    assert details["limit_bytes"] == 64 * MiB
    assert details["requested_bytes"] > 64 * MiB  # what was asked, from PyTorch's message
    assert details["mechanism"] == "rlimit_data"
    assert "64.0 MiB" in outcome.error["message"]
    assert "VRAMLAB_MAX_EXPERIMENT_BYTES" in outcome.error["message"]
    # The figures up to the failure are kept, as for an out-of-memory.
    assert outcome.result is not None
    assert outcome.result["memory"]["allocated_before"] >= 8 * 128 * 128 * 8  # the input
    assert [p["name"] for p in outcome.result["phases"]][-1] == "op"
    assert any("memory_limit" in n for n in outcome.result["notes"])
    # The worker is fine: the next experiment runs in a fresh child, unlimited by this one.
    after = runner.run(make_spec("add", [1000, 1000], memory_limit_bytes=64 * MiB))
    assert after.status == "succeeded", after.error


def test_a_run_within_the_cap_is_not_disturbed(runner: Runner, make_spec: SpecFactory) -> None:
    op, shape, params = CONV
    small: dict[str, Any] = {**params, "kernel_size": 3, "padding": 1}
    outcome = runner.run(make_spec(op, shape, small, dtype="float64", memory_limit_bytes=64 * MiB))
    assert outcome.status == "succeeded", outcome.error


def test_a_scenario_past_the_cap_keeps_its_steps_so_far(runner: Runner) -> None:
    steps = [
        {"do": "create", "name": "a", "fn": "ones", "shape": [1024, 1024]},
        {"do": "create", "name": "big", "fn": "ones", "shape": [96, 1024, 1024]},
    ]
    outcome = runner.run(scenario_spec(steps, memory_limit_bytes=32 * MiB))
    assert outcome.error is not None and outcome.error["type"] == "memory_limit", outcome.error
    assert outcome.error["details"]["requested_bytes"] == 96 * 1024 * 1024 * 4
    assert outcome.result is not None
    steps_out = outcome.result["steps"]
    assert steps_out[0]["error"] is None
    assert steps_out[1]["error"]["type"] == "memory_limit"


def test_x_equals_exp_x_peaks_at_two_tensors_as_predicted(runner: Runner) -> None:
    # The planner counted old and new x after the step (1 MiB) while the run held both
    # during it (2 MiB); the prediction now counts the step's inside.
    steps = [
        {"do": "create", "name": "x", "fn": "randn", "shape": [512, 512]},
        {"do": "op", "name": "x", "fn": "exp", "args": ["x"]},
    ]
    spec = scenario_spec(steps)
    outcome = runner.run(spec)
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    measured = outcome.result["memory"]["allocated_peak"]
    assert measured == spec["prediction"]["peak_named_bytes"] == 2 * 512 * 512 * 4


def test_a_limit_is_released_before_the_next_spec_in_the_same_process() -> None:
    # Children may one day run more than one spec: each starts from no limit of ours.
    before = resource.getrlimit(resource.RLIMIT_DATA)
    cpu = torch.device("cpu")
    try:
        limit = limits.apply(RunSpec(op="add", memory_limit_bytes=64 * MiB), cpu)
        assert limit is not None and limit.cpu_ceiling is not None
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] == limit.cpu_ceiling
        assert limits.apply(RunSpec(op="add"), cpu) is None
        assert limits.active() is None
        assert resource.getrlimit(resource.RLIMIT_DATA) == before
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, before)


def test_a_cap_larger_than_the_host_is_bounded_by_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 16 GiB cap on a host with less free memory must not let a run take the host down:
    # the limit is 90% of what the host has available, and passing it says so.
    class Memory:
        available = 256 * MiB

    monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: Memory())
    before = resource.getrlimit(resource.RLIMIT_DATA)
    spec = RunSpec(op="add", memory_limit_bytes=16 * 2**30)
    try:
        limit = limits.apply(spec, torch.device("cpu"))
        assert limit is not None and limit.host_available == 256 * MiB
        with pytest.raises(RuntimeError) as caught:
            torch.empty(512 * MiB, dtype=torch.uint8)
        error = limits.explain(caught.value, spec)
    finally:
        limits.apply(RunSpec(op="add"), torch.device("cpu"))
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert error is not None and error["type"] == "oom"
    assert error["details"]["host_available_bytes"] == 256 * MiB
    assert error["details"]["requested_bytes"] == 512 * MiB
    assert "256.0 MiB available" in error["message"]
