"""Shared processes on a CUDA GPU: in the second and third experiment of one process the
figures are a clean child's.

Between experiments a shared process empties itself (workers/shared.py): in a reused
process the add still counts exactly its prediction with allocated and reserved starting
at zero, every run's first matmul still shows cuBLAS's workspace as a clean child's does,
the allocation history starts empty, a byte cap ends with its experiment, pinned
transfers measure what a clean child measures, and allocator settings (which the API
refuses with shared) take a clean process. An out-of-memory retires the process.

    VRAMLAB_TEST_ENGINES=sqlite pytest -m cuda tests/workers/test_cuda_shared.py
"""

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import needs_cuda
from tests.workers.conftest import CheckedRunner, SpecFactory
from workers.endings import Outcome
from workers.runner import Runner

pytestmark = needs_cuda()
CUBLAS_WORKSPACE = 32 * 2**20
RUNS = 3  # one process's first, second and third experiment


@pytest.fixture(scope="module")
def cold() -> Iterator[Runner]:
    r = CheckedRunner(warm=False)
    r.start()
    yield r
    r.close()


@pytest.fixture
def shared() -> Iterator[Runner]:
    """A runner of its own, so that its shared process starts with each test."""
    r = CheckedRunner()
    r.start()
    r.capabilities()  # the first spare, on cuda:0, starts here; it becomes the process
    yield r
    r.close()


def ok(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def in_one_process(runner: Runner, spec: dict[str, Any]) -> list[Outcome]:
    """The spec run RUNS times as shared: the first, then the reused runs."""
    outcomes = [runner.run({**spec, "isolation": "shared"}) for _ in range(RUNS)]
    assert len({o.pid for o in outcomes}) == 1, "the process was retired between runs"
    for before, outcome in enumerate(outcomes):
        environment = ok(outcome)["environment"]
        assert environment["isolation"] == "shared"
        assert environment["experiments_before"] == before
        assert (environment["child_start"] == "shared") == (before > 0)
    return outcomes


def without_host_figures(memory: dict[str, Any]) -> dict[str, Any]:
    """The allocator's figures: device-level used memory and host RSS differ between any
    two processes (the context, loaded kernels, what ran before)."""
    return {k: v for k, v in memory.items() if "used" not in k and "rss" not in k}


def events_of(outcome: Outcome) -> list[dict[str, Any]]:
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        events = [json.loads(line) for line in lines]
    outcome.trace_path.unlink()
    return events


def test_add_in_a_reused_process_is_exactly_the_prediction(
    shared: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("add", [1000, 1000], device="cuda:0", trace="none")
    for outcome in in_one_process(shared, spec)[1:]:
        result = ok(outcome)
        memory = result["memory"]
        assert memory["delta_allocated"] == spec["prediction"]["delta_allocated"] == 4_000_256
        assert memory["allocated_before"] == 2 * 4_000_256
        setup = result["phases"][0]
        assert setup["name"] == "setup"
        assert setup["allocated_start"] == 0 and setup["reserved_start"] == 0
        assert all(phase["ooms"] == 0 and phase["alloc_retries"] == 0 for phase in result["phases"])
        # The context was made for an earlier experiment: no start-up figure here.
        assert not any("Starting CUDA in this process" in note for note in result["notes"])
        assert any("that had run" in note and "kernels" in note for note in result["notes"])


def test_every_runs_first_matmul_shows_the_cublas_workspace_as_a_clean_child(
    shared: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("matmul", [1024, 1024], {"other_shape": [1024, 1024]}, device="cuda:0")
    clean = ok(cold.run(spec))
    predicted = spec["prediction"]["delta_allocated"]
    assert clean["memory"]["delta_allocated"] - predicted == CUBLAS_WORKSPACE
    for outcome in in_one_process(shared, spec)[1:]:
        result = ok(outcome)
        assert result["memory"]["delta_allocated"] - predicted == CUBLAS_WORKSPACE
        assert without_host_figures(result["memory"]) == without_host_figures(clean["memory"])
        assert any("cuBLAS's workspace" in note for note in result["notes"])


def test_the_allocation_history_starts_empty_in_a_reused_process(
    shared: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("add", [1000, 1000], device="cuda:0")
    clean = [(e["action"], e["size"], e["phase"]) for e in events_of(cold.run(spec))]
    for outcome in in_one_process(shared, spec)[1:]:
        events = events_of(outcome)
        assert [(e["action"], e["size"], e["phase"]) for e in events] == clean
        assert all(e["t_us"] >= 0 for e in events if e["t_us"] is not None)


def test_a_pinned_transfer_in_a_reused_process_measures_as_in_a_clean_child(
    shared: Runner, cold: Runner, make_spec: SpecFactory
) -> None:
    params = {"pin_memory": True, "non_blocking": True}
    spec = make_spec("to", [1024, 1024], params, device="cuda:0", trace="none")
    clean = ok(cold.run(spec))
    for outcome in in_one_process(shared, spec)[1:]:
        result = ok(outcome)
        assert without_host_figures(result["memory"]) == without_host_figures(clean["memory"])
        assert result["memory"]["pinned_host_after"] >= 4 * 2**20


def test_a_byte_cap_ends_with_its_experiment(shared: Runner, make_spec: SpecFactory) -> None:
    cap = 64 * 2**20
    capped = shared.run(
        make_spec("add", [1024, 1024], device="cuda:0", memory_limit_bytes=cap, isolation="shared")
    )
    ok(capped)
    # Three 64 MiB tensors: past the first experiment's cap, within this one's (none).
    big = shared.run(make_spec("add", [4096, 4096], device="cuda:0", isolation="shared"))
    assert ok(big)["memory"]["allocated_after"] == 3 * 4096 * 4096 * 4
    assert big.pid == capped.pid


def test_expandable_segments_take_a_clean_process(shared: Runner, make_spec: SpecFactory) -> None:
    first = shared.run(make_spec("add", [8], device="cuda:0", trace="none", isolation="shared"))
    ok(first)
    spec = make_spec("empty", [2**30], dtype="uint8", device="cuda:0", isolation="shared")
    spec["allocator"] = {"expandable_segments": True}  # the API refuses this with shared
    outcome = shared.run(spec)
    result = ok(outcome)
    assert result["environment"]["isolation"] == "clean"
    assert result["environment"]["allocator_conf"] == "expandable_segments:True"
    assert outcome.pid != first.pid
    actions = {e["action"] for e in events_of(outcome)}
    assert "segment_map" in actions and "segment_alloc" not in actions
    # The shared process was not touched: it serves the next shared experiment.
    again = shared.run(make_spec("add", [8], device="cuda:0", trace="none", isolation="shared"))
    assert again.pid == first.pid


def test_an_out_of_memory_retires_the_process(shared: Runner, make_spec: SpecFactory) -> None:
    add = make_spec("add", [1000, 1000], device="cuda:0", trace="none", isolation="shared")
    first = shared.run(add)
    ok(first)
    total = shared.capabilities()["gpus"][0]["total_memory"]
    huge = make_spec("empty", [2 * total], dtype="uint8", device="cuda:0", isolation="shared")
    failed = shared.run(huge)
    assert failed.error is not None and failed.error["type"] == "oom"
    assert failed.pid == first.pid
    after = shared.run(add)
    assert after.pid != first.pid
    result = ok(after)
    assert result["environment"]["experiments_before"] == 0
    assert result["memory"]["delta_allocated"] == add["prediction"]["delta_allocated"]
