"""The catalog's CUDA-only phenomena: device mismatch, pinned transfers, the allocator
backend, fragmentation and backward's peak. Skipped without a GPU."""

from typing import Any

import pytest

from tests.workers.conftest import SpecFactory
from tests.workers.test_scenario import scenario_spec
from workers.endings import Outcome
from workers.runner import Runner

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def ok(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


@pytest.mark.parametrize("case", ["tensor_tensor", "module_on_cpu"])
def test_inputs_on_two_devices_fail_as_device_mismatch(
    runner: Runner, make_spec: SpecFactory, case: str
) -> None:
    outcome = runner.run(make_spec("mixed_device", [4, 64], {"case": case}, device="cuda:0"))
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error["type"] == "device_mismatch", outcome.error
    devices = set(outcome.error["details"]["input_devices"].values())
    assert devices == {"cpu", "cuda:0"}
    assert outcome.error["hint"]


def test_cpu_scalar_with_gpu_tensor_is_allowed(runner: Runner, make_spec: SpecFactory) -> None:
    result = ok(runner.run(make_spec("mixed_device", [64], {"case": "cpu_scalar"}, device="cuda")))
    assert result["placement"]["inputs"] == {"a": "cuda:0", "b": "cpu"}
    assert result["placement"]["host_device_copies"] == []


def test_pinned_transfer_reports_pinned_host_bytes_and_both_copies(
    runner: Runner, make_spec: SpecFactory
) -> None:
    params = {"pin_memory": True, "non_blocking": True}
    result = ok(runner.run(make_spec("to", [1024, 1024], params, device="cuda")))
    assert result["memory"]["pinned_host_after"] >= 4 * 2**20
    assert result["details"]["copies"]["both_alive"]
    assert result["timing"]["bytes_per_s"] > 0
    copies = result["placement"]["host_device_copies"]
    assert copies and copies[0]["from"] == "cpu" and copies[0]["to"] == "cuda:0"


def test_cuda_malloc_async_falls_back_to_counters(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("empty", [2**20], device="cuda", allocator={"backend": "cudaMallocAsync"})
    result = ok(runner.run(spec))
    assert result["trace"]["source"] == "none"
    assert any("cudaMallocAsync" in n for n in result["notes"])


def test_holes_grow_reserved_and_expandable_segments_is_set(runner: Runner) -> None:
    m = 1024 * 1024
    steps = [
        {"do": "create", "name": "xs", "fn": "empty", "shape": [m], "count": 32},
        {"do": "delete", "name": "xs", "every": 2},
        {"do": "create", "name": "large", "fn": "empty", "shape": [16 * m]},
    ]
    spec = scenario_spec(steps, device="cuda:0", trace="none")
    result = ok(runner.run(spec))
    holes = result["steps"][2]
    assert holes["reserved_end"] > holes["reserved_start"]
    assert result["steps"][1]["inactive_split_bytes"] is not None


def test_backward_has_its_own_peak(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec(
        "matmul", [1024, 512], {"other_shape": [512, 256], "requires_grad": True}, device="cuda"
    )
    result = ok(runner.run(spec))
    back = result["details"]["sections"]["backward"]
    assert back["allocated_peak"] >= back["allocated_end"]
    assert result["memory"]["allocated_peak"] >= back["allocated_peak"]


def _gpu_count() -> int:
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_copy_keeps_both_copies(runner: Runner, make_spec: SpecFactory) -> None:
    """cuda:0 -> cuda:1: the new copy is on the second GPU, the source stays on the first."""
    spec = make_spec("to", [4096, 4096], {"source_device": "cuda:0"}, device="cuda:1")
    result = ok(runner.run(spec))
    assert result["environment"]["device"] == "cuda:1"
    assert result["memory"]["delta_allocated"] == spec["prediction"]["delta_allocated"] == 2**26
    assert result["timing"]["bytes_per_s"] > 0
    assert [t["device"] for t in result["inputs"]] == ["cuda:0"]
    assert [t["device"] for t in result["outputs"]] == ["cuda:1"]
    assert runner.capabilities()["gpus"][1]["index"] == 1


def test_adams_step_counters_are_not_user_tensors_left_on_the_cpu(
    runner: Runner, make_spec: SpecFactory
) -> None:
    params = {"module": "linear", "width": 32, "optimizer": "adam"}
    result = ok(runner.run(make_spec("module_train_step", [8, 64], params, device="cuda")))
    assert result["placement"]["host_scalar_ops"]
    assert not any("silently computed" in note for note in result["notes"])
    assert any("by design" in note for note in result["notes"])
