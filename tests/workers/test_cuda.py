"""The runner on a CUDA GPU: exact allocator figures, cuBLAS's workspace, transfers.

Run on a GPU host with ``pytest -m cuda tests/workers``; skipped cleanly without one.
"""

import gzip
import json
from typing import Any

import pytest

from tests.helpers import needs_cuda
from tests.workers.conftest import SpecFactory, build_spec
from tests.workers.test_scenario import scenario_spec
from workers.endings import Outcome
from workers.runner import Runner

pytestmark = needs_cuda()


def succeeded(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def events_of(outcome: Outcome) -> list[dict[str, Any]]:
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        events = [json.loads(line) for line in lines]
    outcome.trace_path.unlink()
    return events


def test_add_matches_the_prediction_exactly(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("add", [1000, 1000], device="cuda:0")
    outcome = runner.run(spec)
    result = succeeded(outcome)
    memory = result["memory"]
    assert memory["delta_allocated"] == spec["prediction"]["delta_allocated"] == 4_000_256
    assert memory["allocated_before"] == 2 * 4_000_256
    assert memory["reserved_after"] >= memory["allocated_after"]
    assert memory["device_used_after"] > memory["reserved_after"]  # the CUDA context
    assert result["timing"]["method"] == "cuda_events"
    assert result["environment"]["gpu_name"]
    events = events_of(outcome)
    assert result["trace"]["source"] == "cuda_memory_history"
    # The history gives the bytes asked for; the allocator's figures count 512-byte blocks.
    sizes = [e["size"] for e in events if e["action"] == "alloc"]
    assert sizes.count(4_000_000) >= 3  # a, b and the output
    assert any(e["action"] == "segment_alloc" for e in events)


def test_first_matmul_keeps_the_cublas_workspace(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("matmul", [1024, 1024], {"other_shape": [1024, 1024]}, device="cuda:0")
    result = succeeded(runner.run(spec, work_dir=None))
    memory = result["memory"]
    assert memory["delta_allocated"] > spec["prediction"]["delta_allocated"]
    assert any("cuBLAS" in note for note in result["notes"]), result["notes"]


@pytest.mark.parametrize("pinned", [False, True])
def test_to_cuda_reports_host_memory_and_bandwidth(
    runner: Runner, make_spec: SpecFactory, pinned: bool
) -> None:
    spec = make_spec("to", [4096, 4096], {"pin_memory": pinned}, device="cuda:0", trace="none")
    result = succeeded(runner.run(spec))
    assert result["memory"]["delta_allocated"] == spec["prediction"]["delta_allocated"]
    assert result["memory"]["host_rss_after"] > 0
    assert result["timing"]["bytes_per_s"] > 0
    assert any("page-locked (pinned)" in note for note in result["notes"]) is pinned
    # Checking whether the source is pinned is no work left on the CPU.
    assert not any("Work ran on the CPU" in note for note in result["notes"]), result["notes"]


def test_allocator_settings_reach_the_child(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("add", [1000, 1000], device="cuda:0", allocator={"expandable_segments": True})
    outcome = runner.run(spec)
    result = succeeded(outcome)
    assert result["environment"]["allocator_conf"] == "expandable_segments:True"
    assert any(e["action"] == "segment_map" for e in events_of(outcome))


def test_out_of_memory_keeps_the_figures(runner: Runner, make_spec: SpecFactory) -> None:
    total = runner.capabilities()["gpus"][0]["total_memory"]
    outcome = runner.run(make_spec("empty", [2 * total], dtype="uint8", device="cuda:0"))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "oom"
    assert outcome.error["details"]["requested_bytes"] > total
    assert outcome.result is not None and outcome.result["memory"]["allocated_before"] == 0


def test_out_of_memory_keeps_the_allocators_snapshot(runner: Runner) -> None:
    """A scenario holds 1 GiB, then asks for more than the card: the snapshot at that
    moment shows the segment it held; the next experiment still runs."""
    total = runner.capabilities()["gpus"][0]["total_memory"]
    steps = [
        {"do": "create", "name": "held", "fn": "empty", "shape": [2**28]},
        # float32: 4 * 2**20 * (total / 2**22 + 16) bytes, past the card's total.
        {"do": "create", "name": "huge", "fn": "empty", "shape": [2**20, total // 2**22 + 16]},
    ]
    outcome = runner.run(scenario_spec(steps, device="cuda:0"))
    assert outcome.error is not None and outcome.error["type"] == "oom", outcome.error
    snapshot = outcome.error["details"]["allocator"]
    assert snapshot["n_segments"] >= 1
    assert snapshot["allocated_bytes"] >= 2**30
    assert snapshot["device_total_bytes"] == total
    after = runner.run(build_spec("add", [1000, 1000], device="cuda:0"))
    assert after.status == "succeeded"


def test_unsupported_dtype_on_cuda(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(
        make_spec("matmul", [8, 8], {"other_shape": [8, 8]}, dtype="int64", device="cuda:0")
    )
    assert outcome.error is not None and outcome.error["type"] == "unsupported_on_device"
    assert "not implemented" in outcome.error["message"]


def test_another_backend_runs_in_a_fresh_interpreter(
    runner: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec(
        "add", [1000, 1000], device="cuda:0", trace="none", allocator={"backend": "cudaMallocAsync"}
    )
    result = succeeded(runner.run(spec))
    assert result["environment"]["allocator_conf"] == "backend:cudaMallocAsync"
    assert result["memory"]["delta_allocated"] >= 4_000_000
    assert any("fresh interpreter" in note for note in result["notes"])


def test_the_byte_cap_holds_on_the_caching_allocator(runner: Runner) -> None:
    # The API would refuse this at a 64 MiB cap (two 64 MiB inputs); a worker given it
    # anyway stops it at the allocator, with the figures so far, and runs the next one.
    cap = 64 * 2**20
    outcome = runner.run(build_spec("add", [4096, 4096], device="cuda:0", memory_limit_bytes=cap))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "memory_limit", outcome.error
    details = outcome.error["details"]
    assert details["mechanism"] == "cuda_memory_fraction"
    assert details["limit_bytes"] == cap
    assert details["requested_bytes"] == 4096 * 4096 * 4
    assert details["reserved_bytes"] <= cap
    assert outcome.result is not None
    assert outcome.result["memory"]["reserved_peak"] <= cap
    after = runner.run(build_spec("add", [1024, 1024], device="cuda:0", memory_limit_bytes=cap))
    assert succeeded(after)["memory"]["delta_allocated"] == 1024 * 1024 * 4
