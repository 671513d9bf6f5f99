"""Shared isolation through the runner's public interface: many experiments in one warm
process, each measured as a clean process measures it; a process whose experiment
crashed, timed out, was cancelled, failed in a way that may leave state, was left holding
memory, or served its share is retired, and the next shared experiment runs in a new one."""

import gzip
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from tests.workers.conftest import CheckedRunner, SpecFactory
from vramlab.contract import ALLOCATOR_KEYS
from workers.endings import Outcome
from workers.runner import Runner

MiB = 2**20


@pytest.fixture
def fresh() -> Iterator[Runner]:
    """A runner of its own: its shared processes start from none."""
    r = CheckedRunner()
    r.start()
    yield r
    r.close()


def succeeded(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def trace_of(outcome: Outcome) -> list[tuple[str, int, str]]:
    """The trace without its times and addresses: what was allocated and freed, in order."""
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        events = [json.loads(line) for line in lines]
    outcome.trace_path.unlink()
    return [(e["action"], e["size"], e["phase"]) for e in events]


def figures(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "memory": {k: result["memory"][k] for k in ALLOCATOR_KEYS},
        "phases": [
            (p["name"], p["allocated_start"], p["allocated_peak"]) for p in result["phases"]
        ],
        "outputs": result["outputs"],
    }


def test_shared_experiments_run_in_one_process_with_a_clean_processs_figures(
    fresh: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("add", [1000, 1000])
    clean_outcome = fresh.run(spec)
    clean = succeeded(clean_outcome)
    clean_trace = trace_of(clean_outcome)
    outcomes = [fresh.run({**spec, "isolation": "shared"}) for _ in range(3)]
    results = [succeeded(o) for o in outcomes]
    traces = [trace_of(o) for o in outcomes]

    assert len({o.pid for o in outcomes}) == 1 and outcomes[0].pid != clean_outcome.pid
    environments = [r["environment"] for r in results]
    assert [e["isolation"] for e in environments] == ["shared"] * 3
    assert [e["experiments_before"] for e in environments] == [0, 1, 2]
    assert [e["child_start"] for e in environments][1:] == ["shared", "shared"]
    assert clean["environment"]["isolation"] == "clean"
    assert clean["environment"]["experiments_before"] is None
    for result, trace in zip(results, traces, strict=True):
        assert result["memory"]["delta_allocated"] == spec["prediction"]["delta_allocated"]
        assert figures(result) == figures(clean)
        assert trace == clean_trace  # the trace starts empty: nothing of the run before
    assert "that had run 2 experiments before this one" in results[2]["notes"][-1]
    assert "host RSS" in results[2]["notes"][-1]
    # Host RSS depends on what ran before: the result says which figures are the process's.
    marked = [n for n in results[2]["notes"] if n.startswith("Shared-process figures:")]
    assert len(marked) == 1 and "host_rss_before and host_rss_after" in marked[0]
    assert f"{results[2]['memory']['host_rss_before']:,}" in marked[0]
    assert "the 2 experiments before this one" in marked[0]
    assert not any(n.startswith("Shared-process figures:") for n in results[0]["notes"])
    assert not any("shared process" in note for note in clean["notes"])


def test_an_experiment_keeps_nothing_of_the_one_before_it(
    fresh: Runner, make_spec: SpecFactory
) -> None:
    # A training step records its sections' figures (forward, backward, optimizer_step);
    # the add after it in the same process must not report them as its own.
    params = {"module": "mlp", "width": 64, "out_features": 8}
    step = fresh.run(make_spec("module_train_step", [8, 32], params, isolation="shared"))
    assert set(succeeded(step)["details"]["sections"]) >= {"forward", "backward"}
    add = fresh.run(make_spec("add", [1000, 1000], isolation="shared"))
    assert add.pid == step.pid
    assert "sections" not in (succeeded(add).get("details") or {})


def test_a_plain_refusal_keeps_the_process_and_a_cap_is_lifted_after_its_run(
    fresh: Runner, make_spec: SpecFactory
) -> None:
    capped = fresh.run(
        make_spec("add", [1000, 1000], memory_limit_bytes=64 * MiB, isolation="shared")
    )
    succeeded(capped)
    refused = fresh.run(make_spec("add", [4], dtype="float8_e4m3fn", isolation="shared"))
    assert refused.error is not None and refused.error["type"] == "unsupported_on_device"
    # 128 MiB, past the first experiment's cap: that cap no longer holds in this process.
    big = fresh.run(
        make_spec("empty", [128 * MiB], dtype="uint8", trace="none", isolation="shared")
    )
    assert succeeded(big)["environment"]["experiments_before"] == 2
    assert capped.pid == refused.pid == big.pid


def _crash(runner: Runner, make_spec: SpecFactory) -> Outcome:
    return runner.run(make_spec("abort", [4], isolation="shared"))


def _timeout(runner: Runner, make_spec: SpecFactory) -> Outcome:
    spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1, timeout_s=1.0)
    return runner.run({**spec, "isolation": "shared"})


def _cancel(runner: Runner, make_spec: SpecFactory) -> Outcome:
    spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1, isolation="shared")
    return runner.run(spec, should_cancel=lambda: True)


def _memory_limit(runner: Runner, make_spec: SpecFactory) -> Outcome:
    params = {"out_channels": 8, "kernel_size": 31, "padding": 15}
    spec = make_spec(
        "conv2d", [1, 8, 128, 128], params, dtype="float64", memory_limit_bytes=64 * MiB
    )
    return runner.run({**spec, "isolation": "shared"})


def _leak(runner: Runner, make_spec: SpecFactory) -> Outcome:
    # Succeeds, but leaves its tensors alive in the process: it is not empty afterwards.
    return runner.run(make_spec("leak", [1000], isolation="shared"))


@pytest.mark.parametrize(
    ("run_bad", "ends"),
    [
        (_crash, "crashed"),
        (_timeout, "timeout"),
        (_cancel, "cancelled"),
        (_memory_limit, "memory_limit"),
        (_leak, "succeeded"),
    ],
)
def test_a_process_that_may_hold_state_is_retired_and_the_next_runs_in_a_new_one(
    fresh: Runner,
    make_spec: SpecFactory,
    run_bad: Callable[[Runner, SpecFactory], Outcome],
    ends: str,
) -> None:
    add = make_spec("add", [1000, 1000], trace="none", isolation="shared")
    first = fresh.run(add)
    succeeded(first)
    bad = run_bad(fresh, make_spec)
    kind = bad.error["type"] if bad.error else bad.status
    assert kind == ends
    assert bad.pid == first.pid  # it ran in the shared process
    after = fresh.run(add)
    result = succeeded(after)
    assert after.pid != first.pid
    assert result["environment"]["experiments_before"] == 0
    assert result["memory"]["delta_allocated"] == add["prediction"]["delta_allocated"]


def test_a_process_retires_after_its_share_of_experiments(make_spec: SpecFactory) -> None:
    runner = CheckedRunner(shared_runs=2)
    runner.start()
    try:
        spec = make_spec("add", [8], trace="none", isolation="shared")
        pids = [runner.run(spec).pid for _ in range(5)]
    finally:
        runner.close()
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_allocator_settings_run_clean_and_say_so(fresh: Runner, make_spec: SpecFactory) -> None:
    # The API refuses these together (422); a caller of the runner gets a clean process.
    spec = make_spec("add", [8], trace="none", isolation="shared")
    spec["allocator"] = {"max_split_size_mb": 64}
    result = succeeded(fresh.run(spec))
    assert result["environment"]["isolation"] == "clean"
    assert fresh.shared("cpu") == []


def test_concurrent_shared_experiments_each_get_a_process_and_close_retires_them(
    make_spec: SpecFactory,
) -> None:
    runner = CheckedRunner(concurrency=2)
    runner.start()
    started, release = threading.Event(), threading.Event()
    held: list[Outcome] = []

    def hold() -> bool:
        started.set()  # polled only once its child is running
        return release.is_set()

    sleep = make_spec("sleep", [4], {"seconds": 0.5}, warmup=0, repeat=1, isolation="shared")
    thread = threading.Thread(target=lambda: held.append(runner.run(sleep, should_cancel=hold)))
    thread.start()
    try:
        assert started.wait(120)
        add = runner.run(make_spec("add", [8], trace="none", isolation="shared"))
        thread.join(120)
        assert succeeded(add)["environment"]["concurrent"] == 2
        assert held[0].status == "succeeded" and held[0].pid != add.pid
        idle = {p.pid for p in runner.shared("cpu")}
        assert idle == {add.pid, held[0].pid}
    finally:
        release.set()
        thread.join(120)
        runner.close()
    assert not any(psutil.pid_exists(pid) for pid in idle)  # closing retired them
