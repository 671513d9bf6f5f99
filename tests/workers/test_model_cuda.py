"""Model experiments on a CUDA GPU, through the worker's runner (a fresh child per run):
the figures against plain PyTorch, the categories against the peak, the prediction
against the measurement, and an emulated smaller card.

Run on a GPU host with ``pytest -m cuda tests/workers/test_model_cuda.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import needs_cuda
from tests.workers.conftest import build_spec
from workers.runner import Runner

pytestmark = [*needs_cuda(), pytest.mark.slow]
pytest.importorskip("transformers")

SMALL_GPT2 = {"model": "gpt2", "config": {"n_layer": 4}, "batch_size": 4, "seq_len": 256}


def model_spec(**params: Any) -> dict[str, Any]:
    return build_spec("model", [], params, device="cuda:0", warmup=0, repeat=1, timeout_s=300.0)


def run(runner: Runner, **params: Any) -> dict[str, Any]:
    outcome = runner.run(model_spec(**params))
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def test_a_training_step_equals_plain_pytorch_and_its_prediction(runner: Runner) -> None:
    from workers.models.predict import predict

    result = run(runner, **SMALL_GPT2)
    figures = result["model"]
    reference = subprocess.run(
        [sys.executable, "-m", "bench.model_reference", json.dumps(SMALL_GPT2)],
        capture_output=True,
        text=True,
        check=True,
    )
    plain = json.loads(reference.stdout.strip().splitlines()[-1])
    assert figures["parameter_bytes"] == plain["parameters"]
    assert figures["gradient_bytes"] == plain["gradients"]
    assert figures["optimizer_state_bytes"] == plain["optimizer_state"]
    assert abs(figures["peak_allocated"] - plain["peak_step2"]) <= 0.01 * plain["peak_step2"]
    assert sum(result["categories"].values()) == figures["peak_allocated"]
    predicted = predict({**SMALL_GPT2, "task": "train"}, "cuda")["peak_allocated"]
    assert abs(predicted - figures["peak_allocated"]) <= 0.03 * figures["peak_allocated"]


@pytest.mark.parametrize(
    "params",
    [
        {**SMALL_GPT2, "precision": "bf16-autocast", "checkpointing": True},
        {**SMALL_GPT2, "precision": "fp16-autocast", "micro_batches": 2},
        {**SMALL_GPT2, "task": "inference"},
        {**SMALL_GPT2, "task": "generate", "new_tokens": 8},
        {"model": "tiny-t5", "task": "generate", "batch_size": 2, "seq_len": 32},
        {"model": "tiny-vit", "batch_size": 8, "optimizer": "adam", "optimizer_impl": "fused"},
    ],
)
def test_every_task_runs_and_is_predicted_within_3_percent(
    runner: Runner, params: dict[str, Any]
) -> None:
    from workers.models.predict import predict

    result = run(runner, **params)
    measured = result["model"]["peak_allocated"]
    assert sum(result["categories"].values()) == measured
    predicted = predict({"task": "train", **params}, "cuda")["peak_allocated"]
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)


def test_an_emulated_card_runs_out_of_memory_as_a_real_one(runner: Runner) -> None:
    outcome = runner.run(model_spec(**SMALL_GPT2, capacity_bytes=200 * 2**20))
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "oom"
    assert "capacity_bytes" in outcome.error["message"]


@pytest.mark.parametrize(
    ("params", "allocator"),
    [
        (SMALL_GPT2, {}),
        ({**SMALL_GPT2, "precision": "bf16-autocast", "checkpointing": True}, {}),
        (SMALL_GPT2, {"expandable_segments": True}),
        (SMALL_GPT2, {"max_split_size_mb": 64}),
    ],
)
def test_the_reserved_peak_is_predicted_within_3_percent(
    runner: Runner, params: dict[str, Any], allocator: dict[str, Any]
) -> None:
    """The step replayed through the allocator model reserves what the real allocator
    reserved (the measured figure: the reported step's, as a fit trial's)."""
    from workers.models.predict import predict

    spec = model_spec(**params)
    spec["allocator"] = allocator
    outcome = runner.run(spec)
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    measured = outcome.result["model"]["peak_reserved"]
    predicted = predict(params, "cuda", allocator)["peak_reserved"]
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)
