"""The runner on the CPU, through its public interface: real children, real torch."""

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import CheckedRunner, SpecFactory
from workers.endings import Outcome
from workers.runner import Runner

MEMORY_KEYS = {
    "allocated_before",
    "allocated_after",
    "allocated_peak",
    "reserved_before",
    "reserved_after",
    "reserved_peak",
    "delta_allocated",
    "host_rss_before",
    "host_rss_after",
    "device_used_before",
    "device_used_after",
    "pinned_host_before",
    "pinned_host_after",
}


def events_of(outcome: Outcome) -> list[dict[str, Any]]:
    assert outcome.trace_path is not None
    with gzip.open(outcome.trace_path, "rt") as lines:
        events = [json.loads(line) for line in lines]
    outcome.trace_path.unlink()
    return events


def succeeded(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def test_add_measures_the_output_and_traces_its_allocation(
    runner: Runner, make_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = make_spec("add", [1000, 1000])
    outcome = runner.run(spec, work_dir=tmp_path)
    result = succeeded(outcome)
    memory = result["memory"]
    assert set(memory) == MEMORY_KEYS
    assert memory["delta_allocated"] >= 4_000_000
    assert memory["delta_allocated"] == spec["prediction"]["delta_allocated"]
    assert memory["allocated_before"] == 8_000_000
    assert memory["reserved_after"] == memory["allocated_after"]
    assert [p["name"] for p in result["phases"]] == ["setup", "op", "after"]
    assert result["trace"]["source"] == "cpu_profiler"
    assert result["outputs"][0]["bytes"] == 4_000_000
    assert any("exactly the prediction" in note for note in result["notes"])
    assert outcome.trace_path is not None and outcome.trace_path.parent == tmp_path
    events = events_of(outcome)
    assert len(events) == outcome.trace_events == result["trace"]["events"]
    allocs = [e for e in events if e["action"] == "alloc" and e["size"] == 4_000_000]
    assert [e["phase"] for e in allocs].count("setup") == 2
    assert [e["phase"] for e in allocs].count("op") == 1 + spec["warmup"] + spec["repeat"] - 1
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["name"] for e in events if e["action"] == "mark"] == ["setup", "op", "after"]


def test_matmul_reports_shape_and_timing(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("matmul", [64, 48], {"other_shape": [48, 32]}, repeat=4, trace="none")
    result = succeeded(runner.run(spec))
    assert result["outputs"][0]["shape"] == [64, 32]
    timing = result["timing"]
    assert timing["method"] == "perf_counter"
    assert len(timing["repeats_s"]) == 4
    assert timing["min_s"] <= timing["median_s"] <= timing["max_s"]
    assert result["memory"]["delta_allocated"] == 64 * 32 * 4
    assert result["trace"] == {"source": "none", "events": 0, "truncated": False}


@pytest.mark.parametrize("op,dtype", [("empty", "int16"), ("randn", "float64")])
def test_creation_ops_allocate_their_tensor(
    runner: Runner, make_spec: SpecFactory, op: str, dtype: str
) -> None:
    spec = make_spec(op, [30, 40], dtype=dtype, trace="none")
    result = succeeded(runner.run(spec))
    nbytes = 30 * 40 * (2 if dtype == "int16" else 8)
    assert result["memory"]["allocated_before"] == 0
    assert result["memory"]["delta_allocated"] == nbytes
    assert result["outputs"][0]["dtype"] == dtype


def test_to_with_copy_makes_a_new_tensor(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("to", [100, 100], {"copy": True}, trace="none")
    result = succeeded(runner.run(spec))
    assert result["memory"]["delta_allocated"] == 40_000
    assert result["outputs"][0]["is_view_of_input"] is False
    assert result["timing"]["bytes_per_s"] > 0


def test_to_without_change_returns_the_source(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("to", [100, 100], trace="none")
    result = succeeded(runner.run(spec))
    assert result["memory"]["delta_allocated"] == 0
    assert result["outputs"][0]["is_view_of_input"] is True
    assert any("returns the source tensor itself" in note for note in result["notes"])


def test_stacks_name_the_op_function(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(make_spec("add", [10, 10], trace="stacks"))
    succeeded(outcome)
    allocs = [e for e in events_of(outcome) if e["action"] == "alloc"]
    assert allocs and all(e["frames"] for e in allocs)
    assert any("workers/ops/" in f["filename"] for f in allocs[0]["frames"])


def test_a_crash_is_reported_and_the_next_run_works(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(make_spec("abort", [4]))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "crashed"
    assert "SIGABRT" in outcome.error["message"]
    assert outcome.error["details"]["exitcode"] == -signal.SIGABRT
    assert outcome.trace_path is None
    succeeded(runner.run(make_spec("add", [8], trace="none")))


def test_a_dead_forkserver_is_restarted(runner: Runner, make_spec: SpecFactory) -> None:
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid  # the stdlib's, private: no public handle
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    succeeded(runner.run(make_spec("add", [8], trace="none")))


def test_timeout_kills_the_child(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1, timeout_s=1.0)
    outcome = runner.run(spec)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "timeout"


def test_cancel_kills_the_child(runner: Runner, make_spec: SpecFactory) -> None:
    polls = 0

    def should_cancel() -> bool:
        nonlocal polls
        polls += 1
        return polls > 3

    spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1)
    outcome = runner.run(spec, should_cancel=should_cancel)
    assert outcome.status == "cancelled"
    assert outcome.result is None and outcome.trace_path is None


def test_unsupported_dtype_keeps_pytorchs_message(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(make_spec("add", [4], dtype="float8_e4m3fn"))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "unsupported_on_device"
    assert "not implemented for 'Float8_e4m3fn'" in outcome.error["message"]
    assert outcome.error["hint"]


def test_out_of_memory_keeps_the_figures(runner: Runner, make_spec: SpecFactory) -> None:
    # 1 EiB: past any machine's address space, so the CPU allocator refuses it even where
    # the kernel overcommits.
    outcome = runner.run(make_spec("empty", [2**30, 2**30], dtype="uint8"))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "oom"
    assert outcome.error["details"]["requested_bytes"] == 2**60
    assert outcome.result is not None
    assert outcome.result["memory"]["allocated_before"] == 0


def cuda_available() -> bool:
    return "cuda" in Runner().capabilities()["device_types"]


@pytest.fixture(scope="module")
def cpu_only(runner: Runner) -> None:
    if "cuda" in runner.capabilities()["device_types"]:
        pytest.skip("this host has CUDA: the CPU-only errors cannot happen here")


@pytest.mark.usefixtures("cpu_only")
def test_pinned_memory_without_cuda_is_unsupported(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(make_spec("to", [4], {"pin_memory": True}))
    assert outcome.error is not None and outcome.error["type"] == "unsupported_on_device"
    assert "pin" in outcome.error["message"]


@pytest.mark.usefixtures("cpu_only")
def test_cuda_without_cuda_is_unsupported(runner: Runner, make_spec: SpecFactory) -> None:
    outcome = runner.run(make_spec("randn", [4], device="cuda:0"))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "unsupported_on_device"
    assert outcome.error["message"]


def test_capabilities(runner: Runner) -> None:
    caps = runner.capabilities()
    assert "cpu" in caps["device_types"]
    assert caps["torch"] and caps["python"] and caps["hostname"]
    cpu_caps = Runner("cpu").capabilities()
    assert cpu_caps["device_types"] == ["cpu"] and cpu_caps["gpus"] == []


def test_a_cpu_runner_refuses_cuda_specs(make_spec: SpecFactory) -> None:
    cpu = CheckedRunner("cpu")
    for spec in (
        make_spec("add", [4], device="cuda:0"),
        make_spec("to", [4], {"source_device": "cuda:0"}, device="cpu"),
        make_spec("to", [4], {"pin_memory": True}, device="cpu"),
    ):
        outcome = cpu.run(spec)
        assert outcome.error is not None and outcome.error["type"] == "unsupported_on_device"
        assert "--device cpu" in outcome.error["message"]


def test_the_runner_module_does_not_import_torch() -> None:
    code = "import sys, workers.runner; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


def test_another_allocator_backend_runs_in_a_fresh_interpreter(
    runner: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("add", [10], trace="none", allocator={"backend": "cudaMallocAsync"})
    result = succeeded(runner.run(spec))
    assert result["environment"]["allocator_conf"] == "backend:cudaMallocAsync"
    assert any("fresh interpreter" in note for note in result["notes"])
