"""Every catalog op on the CPU through the Runner: it runs, and where the catalog's
prediction is exact, the measured bytes match it. Plus the phenomena each family shows."""

from typing import Any

import pytest

from app.catalog import OPS
from tests.op_cases import CASES
from tests.workers.conftest import SpecFactory
from workers.endings import Outcome
from workers.ops import OPS as WORKER_OPS
from workers.runner import Runner

# A scenario and a model experiment have tests of their own (test_scenario.py,
# tests/e2e/test_models.py): a model's prediction is its step's peak, not an op's tensors.
RUNNABLE = [
    n for n, e in OPS.items() if "diagnostic" not in e.tags and n not in ("scenario", "model")
]


def ok(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def test_every_catalog_op_has_a_case_and_a_worker_function() -> None:
    assert sorted(CASES) == sorted(RUNNABLE)
    assert set(RUNNABLE) <= set(WORKER_OPS)


@pytest.mark.parametrize("op", RUNNABLE)
def test_op_runs_and_matches_an_exact_prediction(
    runner: Runner, make_spec: SpecFactory, op: str
) -> None:
    shape, params, dtype = CASES[op]
    spec = make_spec(op, shape, params, dtype=dtype, trace="none", repeat=1)
    result = ok(runner.run(spec))
    pred = spec["prediction"]
    if params.get("source_kind") != "numpy":  # NumPy's own allocation: see the numpy test
        assert result["memory"]["allocated_before"] == pred["allocated_before"]
    if pred["exact"]:
        assert result["memory"]["delta_allocated"] == pred["delta_allocated"], result["notes"]
    else:
        assert any(note.startswith("Not predicted exactly") for note in result["notes"])
    placement = result["placement"]
    assert set(placement["inputs"].values()) | set(placement["parameters"].values()) <= {"cpu"}
    assert placement.get("host_device_copies", []) == []


def test_a_view_keeps_its_whole_base_alive(runner: Runner, make_spec: SpecFactory) -> None:
    view = ok(runner.run(make_spec("narrow", [256, 64], {"length": 2}, trace="none")))
    cloned = ok(runner.run(make_spec("narrow", [256, 64], {"length": 2, "clone": True})))
    assert view["outputs"][0]["bytes"] == 2 * 64 * 4
    assert view["outputs"][0]["storage_bytes"] == view["memory"]["delta_allocated"] == 256 * 64 * 4
    assert cloned["memory"]["delta_allocated"] == 2 * 64 * 4
    assert any("keeps its whole base alive" in n for n in view["notes"])


def test_expand_is_free_and_repeat_copies(runner: Runner, make_spec: SpecFactory) -> None:
    expand = ok(runner.run(make_spec("expand", [64, 1], {"sizes": [64, 4096]}, trace="none")))
    repeat = ok(runner.run(make_spec("repeat", [64, 1], {"repeats": [1, 4096]}, trace="none")))
    assert expand["memory"]["delta_allocated"] == 0
    assert repeat["memory"]["delta_allocated"] == 64 * 4096 * 4


def test_autograd_reports_saved_tensors_sections_and_grads(
    runner: Runner, make_spec: SpecFactory
) -> None:
    spec = make_spec("matmul", [32, 16], {"other_shape": [16, 8], "requires_grad": True})
    result = ok(runner.run(spec))
    assert [o["name"] for o in result["outputs"]] == ["out", "grad_a", "grad_b"]
    assert result["memory"]["delta_allocated"] == spec["prediction"]["delta_allocated"]
    details = result["details"]
    assert details["autograd"]["tensors_saved"] == 2  # matmul saves both operands
    assert details["autograd"]["new_bytes_saved"] == 0  # ...which are its inputs
    assert set(details["sections"]) == {"forward", "backward"}
    back = details["sections"]["backward"]
    assert back["allocated_peak"] >= back["allocated_end"] > back["allocated_start"]


def test_exp_saves_its_output_for_backward(runner: Runner, make_spec: SpecFactory) -> None:
    result = ok(runner.run(make_spec("exp", [64, 64], {"requires_grad": True}, trace="none")))
    assert result["details"]["autograd"]["new_bytes_saved"] == 64 * 64 * 4


def test_inplace_on_a_leaf_that_requires_grad_is_an_autograd_error(
    runner: Runner, make_spec: SpecFactory
) -> None:
    outcome = runner.run(make_spec("add_", [64, 64], {"requires_grad": True}))
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error["type"] == "autograd_error"
    assert "leaf Variable that requires grad" in outcome.error["message"]
    assert outcome.result is not None and outcome.result["placement"]["inputs"] == {
        "a": "cpu",
        "b": "cpu",
    }


def test_train_step_reports_each_category(runner: Runner, make_spec: SpecFactory) -> None:
    params = {"module": "linear", "width": 32, "optimizer": "adam"}
    spec = make_spec("module_train_step", [8, 64], params, trace="none")
    result = ok(runner.run(spec))
    cat = result["details"]["categories"]
    weights = (32 * 64 + 32) * 4
    assert cat["parameters"] == cat["gradients"] == weights
    assert cat["optimizer_state"] == 2 * weights + 2 * 4  # exp_avg, exp_avg_sq, step counters
    assert set(result["details"]["sections"]) == {"forward", "backward", "optimizer_step"}
    sgd = ok(runner.run(make_spec("module_train_step", [8, 64], {**params, "optimizer": "sgd"})))
    assert sgd["details"]["categories"]["optimizer_state"] == 0


def test_checkpointing_saves_less(runner: Runner, make_spec: SpecFactory) -> None:
    params = {"module": "mlp", "width": 256, "layers": 3}
    plain = ok(runner.run(make_spec("module_backward", [64, 128], params, trace="none")))
    ckpt = ok(runner.run(make_spec("module_backward", [64, 128], {**params, "checkpoint": True})))
    saved = [r["details"]["categories"]["activations_saved"] for r in (plain, ckpt)]
    assert saved[1] < saved[0]


def test_dtype_support_gives_the_matrix_with_errors(runner: Runner, make_spec: SpecFactory) -> None:
    result = ok(runner.run(make_spec("dtype_support", [8, 8], trace="none", repeat=1)))
    support = result["details"]["dtype_support"]
    assert set(support["matrix"]) >= {"float32", "bfloat16", "float8_e4m3fn", "bool"}
    assert all(cell["ok"] for cell in support["matrix"]["float32"].values())
    float8 = support["matrix"]["float8_e4m3fn"]
    assert float8["move"]["ok"] and not all(c["ok"] for c in float8.values())
    assert any(not c["ok"] and c["error"] for c in float8.values())
    assert "float8_e4m3fn" in support["moves_but_some_ops_fail"]


def test_a_cpu_scalar_beside_a_tensor_is_allowed(runner: Runner, make_spec: SpecFactory) -> None:
    result = ok(runner.run(make_spec("mixed_device", [8, 8], {"case": "cpu_scalar"})))
    assert any("0-dim CPU tensor" in n for n in result["notes"])
    assert result["placement"]["mixed_device_calls"] == {}


def test_numpy_source_shares_memory_and_is_row_major(
    runner: Runner, make_spec: SpecFactory
) -> None:
    params = {"source_kind": "numpy", "source_dtype": "float64", "copy": True}
    result = ok(runner.run(make_spec("to", [16, 16], params, dtype="float64")))
    assert result["details"]["numpy"]["c_contiguous"]
    assert result["details"]["numpy"]["shares_memory_with_array"]
    assert result["details"]["copies"]["both_alive"]
    # NumPy allocated the source: PyTorch's CPU allocator, and so allocated_before, never saw it.
    assert result["memory"]["allocated_before"] == 0
    assert any("allocated by NumPy" in n for n in result["notes"])


def test_allocator_settings_reach_the_child(runner: Runner, make_spec: SpecFactory) -> None:
    allocator = {
        "expandable_segments": True,
        "max_split_size_mb": 64,
        "garbage_collection_threshold": 0.6,
        "roundup_power2_divisions": 4,
    }
    result = ok(runner.run(make_spec("empty", [16], allocator=allocator, trace="none")))
    conf = result["environment"]["allocator_conf"]
    assert conf == (
        "expandable_segments:True,max_split_size_mb:64,"
        "garbage_collection_threshold:0.6,roundup_power2_divisions:4"
    )
