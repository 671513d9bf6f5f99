"""Warm spares on a CUDA GPU: figures as exact as a cold child's.

A spare made its CUDA context before the spec arrived, with nothing allocated: the add
still counts exactly its prediction, the first matmul still shows cuBLAS's workspace,
allocated and reserved still start at zero, and allocator settings still apply.
"""

import gzip
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import needs_cuda
from tests.workers.conftest import CheckedRunner, SpecFactory
from workers.device import ONE_QUEUE_NOTE
from workers.endings import Outcome
from workers.runner import Runner

pytestmark = needs_cuda()
CUBLAS_WORKSPACE = 32 * 2**20


@pytest.fixture(scope="module")
def cold() -> Iterator[Runner]:
    r = CheckedRunner(warm=False)
    r.start()
    yield r
    r.close()


@pytest.fixture(scope="module")
def warm() -> Iterator[Runner]:
    r = CheckedRunner()
    r.start()
    r.capabilities()  # the first spare, on cuda:0, starts here
    yield r
    r.close()


def succeeded(outcome: Outcome, start: str) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    assert outcome.result["environment"]["child_start"] == start
    return outcome.result


def events_of(outcome: Outcome) -> list[dict[str, Any]]:
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        events = [json.loads(line) for line in lines]
    outcome.trace_path.unlink()
    return events


def test_a_gpu_runner_keeps_two_spares_by_default(warm: Runner) -> None:
    assert warm.spare_count == 2
    assert len(warm.spares("cuda:0")) == 2


def test_add_in_a_spare_is_exactly_the_prediction(warm: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("add", [1000, 1000], device="cuda:0")
    result = succeeded(warm.run(spec, work_dir=None), "warm_spare")
    memory = result["memory"]
    assert memory["delta_allocated"] == spec["prediction"]["delta_allocated"] == 4_000_256
    assert memory["allocated_before"] == 2 * 4_000_256
    setup = result["phases"][0]
    assert setup["name"] == "setup"
    assert setup["allocated_start"] == 0 and setup["reserved_start"] == 0
    assert any("Starting CUDA in this process" in note for note in result["notes"])


def test_first_matmul_in_a_spare_shows_the_cublas_workspace(
    warm: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("matmul", [1024, 1024], {"other_shape": [1024, 1024]}, device="cuda:0")
    warm_result = succeeded(warm.run(spec), "warm_spare")
    cold_result = succeeded(cold.run(spec), "forked")
    predicted = spec["prediction"]["delta_allocated"]
    for result in (warm_result, cold_result):
        assert result["memory"]["delta_allocated"] - predicted == CUBLAS_WORKSPACE
        assert any("cuBLAS" in note for note in result["notes"])
    assert warm_result["memory"] == {
        **cold_result["memory"],
        **{k: warm_result["memory"][k] for k in warm_result["memory"] if "used" in k or "rss" in k},
    }


def test_an_ops_spare_opens_one_hardware_queue_and_keeps_every_figure(
    warm: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    """A spare's context is made with one hardware queue (twice as fast to make): its
    result says so, and its figures are a cold child's (the driver's default queues)."""
    spec = make_spec("matmul", [512, 512], {"other_shape": [512, 512]}, device="cuda:0")
    warm_result = succeeded(warm.run(spec), "warm_spare")
    cold_result = succeeded(cold.run(spec), "forked")
    assert ONE_QUEUE_NOTE in warm_result["notes"]
    assert ONE_QUEUE_NOTE not in cold_result["notes"]
    for key in ("allocated_before", "allocated_peak", "reserved_peak", "delta_allocated"):
        assert warm_result["memory"][key] == cold_result["memory"][key], key


def test_expandable_segments_apply_in_a_spare(
    warm: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("empty", [2**30], dtype="uint8", device="cuda:0")
    spec["allocator"] = {"expandable_segments": True}
    outcomes = {"warm_spare": warm.run(spec), "forked": cold.run(spec)}
    reserved = set()
    for start, outcome in outcomes.items():
        result = succeeded(outcome, start)
        assert result["environment"]["allocator_conf"] == "expandable_segments:True"
        reserved.add(result["memory"]["reserved_after"])
        actions = {e["action"] for e in events_of(outcome)}
        assert "segment_map" in actions and "segment_alloc" not in actions
    assert len(reserved) == 1


def test_concurrent_experiments_on_one_gpu_stay_exact(make_spec: SpecFactory) -> None:
    runner = CheckedRunner(concurrency=2)
    runner.start()
    runner.capabilities()
    started, release = threading.Event(), threading.Event()
    cancelled: list[Outcome] = []

    def hold() -> bool:
        started.set()
        return release.is_set()

    spec = make_spec("sleep", [1024], {"seconds": 60}, device="cuda:0", warmup=0, repeat=1)
    thread = threading.Thread(target=lambda: cancelled.append(runner.run(spec, should_cancel=hold)))
    thread.start()
    try:
        assert started.wait(120)
        add = make_spec("add", [1000, 1000], device="cuda:0", trace="none")
        result = succeeded(runner.run(add), "warm_spare")
    finally:
        release.set()
        thread.join(120)
        runner.close()
    assert result["environment"]["concurrent"] == 2
    assert result["memory"]["delta_allocated"] == add["prediction"]["delta_allocated"]
    assert result["memory"]["allocated_before"] == 2 * 4_000_256
    assert [o.status for o in cancelled] == ["cancelled"]
