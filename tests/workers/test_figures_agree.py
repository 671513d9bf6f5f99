"""Figures that never mislead: the same op measured with other repeats agrees with
itself, notes name only what applies to the device, modules are built as documented."""

from typing import Any

import pytest

from tests.workers.conftest import SpecFactory
from workers.endings import Outcome
from workers.runner import Runner


def ok(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


@pytest.mark.parametrize("module", ["mlp", "transformer_block"])
def test_cpu_module_forward_delta_does_not_depend_on_the_repeats(
    runner: Runner, make_spec: SpecFactory, module: str
) -> None:
    params = {"module": module, "width": 64, "heads": 2, "dropout": 0.0}
    shape = [2, 5, 16] if module == "transformer_block" else [5, 100]
    once = ok(runner.run(make_spec("module_forward", shape, params, warmup=0, repeat=1)))
    many = ok(runner.run(make_spec("module_forward", shape, params, warmup=1, repeat=3)))
    delta = once["memory"]["delta_allocated"]
    assert many["memory"]["delta_allocated"] == delta
    # ... and agrees with the result's own categories: the output plus what autograd saved.
    categories = many["details"]["categories"]
    assert delta == categories["outputs"] + categories["activations_saved"]


def test_a_cpu_matmul_names_no_cublas(runner: Runner, make_spec: SpecFactory) -> None:
    spec = make_spec("matmul", [64, 32], {"other_shape": [32, 16]})
    assert spec["prediction"]["exact"] is True and spec["prediction"]["caveats"] == []
    result = ok(runner.run(spec))
    assert not any("cuBLAS" in note for note in result["notes"])


def test_transformer_block_uses_pytorchs_dropout_unless_told(
    runner: Runner, make_spec: SpecFactory
) -> None:
    params = {"module": "transformer_block", "width": 64, "heads": 2}
    default = ok(runner.run(make_spec("module_forward", [2, 8, 16], params, repeat=1)))
    none = ok(
        runner.run(make_spec("module_forward", [2, 8, 16], {**params, "dropout": 0.0}, repeat=1))
    )
    saved = [r["details"]["categories"]["activations_saved"] for r in (default, none)]
    # PyTorch's layer (dropout 0.1) saves its dropout masks for backward too.
    assert saved[0] > saved[1]
