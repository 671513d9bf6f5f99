"""Trainer's vocabulary on the CPU: TrainingArguments fields become the knobs (a step is
per-device batch x accumulation steps samples, clipped at max_grad_norm), `adafactor` is
transformers' Adafactor; measured and predicted alike."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workers.conftest import build_spec
from tests.workers.test_finetune_step import close, measured_and_predicted
from workers.runner import Runner

pytest.importorskip("transformers")

TRAINER: dict[str, Any] = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "gradient_checkpointing": True,
    "optim": "adafactor",
    "max_grad_norm": 1.0,
}


def test_trainer_arguments_are_written_out_as_the_knobs() -> None:
    params = build_spec("model", [], {"model": "tiny-gpt2", "trainer": TRAINER})["params"]
    assert params["batch_size"] == 4 and params["micro_batches"] == 2
    assert params["checkpointing"] is True and params["max_grad_norm"] == 1.0
    assert params["optimizer"] == "transformers-adafactor"
    defaults = build_spec("model", [], {"model": "tiny-gpt2", "trainer": {"bf16": True}})["params"]
    assert defaults["batch_size"] == 8  # TrainingArguments' per-device default
    assert defaults["precision"] == "bf16-autocast"
    assert (defaults["optimizer"], defaults["optimizer_impl"]) == ("adamw", "fused")
    assert defaults["max_grad_norm"] == 1.0


def test_a_trainer_step_with_adafactor_and_clipping_is_measured_and_predicted(
    runner: Runner,
) -> None:
    result, predicted = measured_and_predicted(
        runner, model="tiny-gpt2", seq_len=32, trainer=TRAINER
    )
    figures = result["model"]
    # Adafactor's factored state: far less than AdamW's two moments.
    assert 0 < figures["optimizer_state_bytes"] < figures["parameter_bytes"]
    assert close(predicted, figures["peak_allocated"])


def test_clipping_is_measured_and_predicted(runner: Runner) -> None:
    result, predicted = measured_and_predicted(
        runner, model="tiny-llama", batch_size=2, seq_len=32, max_grad_norm=0.5
    )
    assert close(predicted, result["model"]["peak_allocated"])


def test_trainer_fields_it_does_not_know_are_refused() -> None:
    from app.catalog import CatalogError

    for trainer, field in (
        ({"learning_rate_typo": 1}, "params.trainer.learning_rate_typo"),
        ({"optim": "lion"}, "params.trainer.optim"),
        ({"bf16": True, "fp16": True}, "params.trainer.fp16"),
        ({"optim": "adamw_bnb_8bit"}, "params.optimizer"),  # bitsandbytes: CUDA only
    ):
        with pytest.raises(CatalogError) as caught:
            build_spec("model", [], {"model": "tiny-gpt2", "trainer": trainer})
        assert caught.value.field == field


def test_a_trainer_step_keeps_no_kv_cache_and_is_predicted_so(runner: Runner) -> None:
    """Trainer sets ``model.config.use_cache`` to TrainingArguments' ``use_cache`` (False):
    its forward makes no KV cache, where a plain loop over the config's default keeps one
    (the keys' and values' copies, held for the backward). Without a cache transformers
    looks for packed sequences in the position ids, which fake tensors cannot answer: the
    prediction must not build the mask that real tensors skip."""
    from workers.models.predict import predict

    shape = {"model": "tiny-gpt2", "seq_len": 64, "dropout": 0.0}  # SDPA's kernel on the CPU
    trainer = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "bf16": True}
    knobs = {"batch_size": 4, "micro_batches": 2, "precision": "bf16-autocast"}
    plain, _ = measured_and_predicted(
        runner, **shape, **knobs, optimizer="adamw", optimizer_impl="fused", max_grad_norm=1.0
    )
    result, _ = measured_and_predicted(runner, **shape, trainer=trainer)
    # tiny-gpt2: 2 blocks, 64 wide; a micro-batch of 2 x 64 tokens; keys and values in bf16
    cache = 2 * 2 * (2 * 64 * 64) * 2
    assert plain["model"]["peak_allocated"] - result["model"]["peak_allocated"] == cache
    assert plain["categories"]["activations"] - result["categories"]["activations"] == cache
    params = build_spec("model", [], {**shape, "trainer": trainer})["params"]
    predicted = predict(params, "cpu")
    assert predicted["categories"]["activations"] == result["categories"]["activations"]
    assert close(predicted["peak_allocated"], result["model"]["peak_allocated"], 0.001)
