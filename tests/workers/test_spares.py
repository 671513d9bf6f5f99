"""Warm spare children and concurrent experiments, through the runner's public interface."""

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from tests.workers.conftest import CheckedRunner, SpecFactory
from workers import allocator
from workers.children import EXIT_GRACE_S
from workers.endings import Outcome
from workers.runner import Runner


def succeeded(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    if outcome.trace_path is not None:
        outcome.trace_path.unlink()
    return outcome.result


def test_a_warm_spare_measures_what_a_cold_child_measures(
    runner: Runner, make_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = make_spec("add", [1000, 1000])
    cold = CheckedRunner(warm=False)
    try:
        cold_result = succeeded(cold.run(spec, work_dir=tmp_path))
    finally:
        cold.close()
    runner.capabilities()  # the first spare starts here
    warm_outcome = runner.run(spec, work_dir=tmp_path)
    warm_result = succeeded(warm_outcome)
    assert cold_result["environment"]["child_start"] == "forked"
    assert warm_result["environment"]["child_start"] == "warm_spare"
    for result in (cold_result, warm_result):
        memory = result["memory"]
        assert memory["delta_allocated"] == spec["prediction"]["delta_allocated"]
        assert memory["allocated_before"] == 8_000_000
        assert result["environment"]["concurrent"] == 1
    assert warm_outcome.stages["handoff"] >= 0
    assert set(warm_outcome.stages) >= {"handoff", "run", "notes", "report"}


def test_each_experiment_gets_a_spare_of_its_own(runner: Runner, make_spec: SpecFactory) -> None:
    # A spare runs one spec and exits: the next experiment's child is a new process.
    spec = make_spec("add", [8], trace="none")
    pids = []
    for _ in range(3):
        outcome = runner.run(spec)
        assert succeeded(outcome)["environment"]["child_start"] == "warm_spare"
        pids.append(outcome.pid)
    assert None not in pids and len(set(pids)) == 3


def test_a_dead_spare_falls_back_to_a_forked_child(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("add", [8], trace="none")
    succeeded(runner.run(spec))  # leaves a spare for the CPU, forked in the background
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing threshold
    while not runner.spares("cpu"):
        assert time.monotonic() < deadline, "no spare was forked"
        time.sleep(0.05)
    for spare in runner.spares("cpu"):
        spare.kill()
        spare.join(10)
    result = succeeded(runner.run(spec))
    assert result["environment"]["child_start"] == "forked"
    assert succeeded(runner.run(spec))["environment"]["child_start"] == "warm_spare"


def test_a_crash_in_a_spare_is_reported(runner: Runner, make_spec: SpecFactory) -> None:
    succeeded(runner.run(make_spec("add", [8], trace="none")))
    outcome = runner.run(make_spec("abort", [4]))
    assert outcome.error is not None and outcome.error["type"] == "crashed"
    assert succeeded(runner.run(make_spec("add", [8], trace="none")))


def test_settings_that_need_a_new_allocator_take_the_cold_path() -> None:
    assert allocator.warm_safe({})
    assert allocator.warm_safe({"expandable_segments": True, "max_split_size_mb": 64})
    assert allocator.warm_safe({"garbage_collection_threshold": 0.6})
    assert allocator.warm_safe({"roundup_power2_divisions": 4, "backend": None})
    assert not allocator.warm_safe({"backend": "cudaMallocAsync"})
    assert not allocator.warm_safe({"pinned_use_cuda_host_register": True})


def test_concurrent_experiments_say_how_many_shared_the_device(
    make_spec: SpecFactory,
) -> None:
    runner = CheckedRunner(concurrency=2)
    runner.start()
    long_started = threading.Event()
    release = threading.Event()
    outcomes: list[Outcome] = []

    def should_cancel() -> bool:
        long_started.set()  # polled only once its child is running
        return release.is_set()

    def long_run() -> None:
        spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1)
        outcomes.append(runner.run(spec, should_cancel=should_cancel))

    thread = threading.Thread(target=long_run)
    thread.start()
    try:
        assert long_started.wait(120)
        result = succeeded(runner.run(make_spec("add", [8], trace="none")))
    finally:
        release.set()
        thread.join(120)
        runner.close()
    assert result["environment"]["concurrent"] == 2
    assert [o.status for o in outcomes] == ["cancelled"]


def test_a_runner_keeps_as_many_spares_as_asked(make_spec: SpecFactory) -> None:
    runner = CheckedRunner(spares=2)
    runner.start()
    try:
        runner.capabilities()
        assert len(runner.spares("cpu")) == 2
        outcome = runner.run(make_spec("add", [8], trace="none"))
        assert succeeded(outcome)["environment"]["child_start"] == "warm_spare"
        deadline = time.monotonic() + 120  # a bound on a hang, not a timing threshold
        while len(runner.spares("cpu")) < 2:
            assert time.monotonic() < deadline, "the spare was not replaced"
            time.sleep(0.05)
        assert outcome.pid not in {p.pid for p in runner.spares("cpu")}
    finally:
        runner.close()


def test_experiments_that_end_out_of_order_each_keep_their_own_count() -> None:
    """The loops of `--concurrency N` enter and leave the device's count in any order. The
    count was removed by value, so an experiment leaving could take another's entry: a
    later one then raised ValueError inside the worker loop (seen with --concurrency 4 and
    batch claims, which stopped the worker), and `concurrent` figures were wrong."""
    runner = CheckedRunner(warm=False)
    try:
        with contextlib.ExitStack() as c_stack:
            c = c_stack.enter_context(runner._sharing("cpu"))
            with runner._sharing("cpu") as b:
                assert b[0] == 2
            with runner._sharing("cpu") as a, runner._sharing("cpu") as b2:
                assert (a[0], b2[0]) == (3, 3)
            assert c[0] == 3  # three ran at once while it ran
        with runner._sharing("cpu") as alone:
            assert alone[0] == 1  # nothing left behind
    finally:
        runner.close()


def test_closing_retires_idle_children_without_their_exit_grace() -> None:
    """A spare that cannot exit promptly (here: stopped, as a starved one on a loaded
    host) is killed after a short shared grace; close waited the whole per-child exit
    grace (10 s) for each before, so an idle worker took seconds to stop on SIGTERM."""
    runner = Runner(spares=2)
    runner.start()
    runner.capabilities()
    spares = runner.spares("cpu")
    assert len(spares) == 2
    pids = [proc.pid for proc in spares if proc.pid is not None]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    runner.close()
    took = time.monotonic() - began
    assert not any(psutil.pid_exists(pid) for pid in pids)  # reaped
    assert took < EXIT_GRACE_S  # not a timing threshold: the grace it no longer waits
