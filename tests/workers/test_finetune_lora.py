"""LoRA through peft on the CPU: the base frozen, only the adapters trained, measured by
the worker and predicted on fake tensors alike; the result names what it trains."""

from __future__ import annotations

import pytest

from tests.workers.test_finetune_step import close, measured_and_predicted
from workers.runner import Runner

pytest.importorskip("peft")

LLAMA = {"model": "tiny-llama", "batch_size": 4, "seq_len": 32}


def test_lora_trains_only_its_adapters_and_is_predicted(runner: Runner) -> None:
    full, _ = measured_and_predicted(runner, **LLAMA)
    lora, predicted = measured_and_predicted(runner, **LLAMA, peft={"r": 8})
    figures = lora["model"]
    # The adapters' A and B of every linear layer: r x (in + out) each.
    assert 0 < figures["trainable_parameter_count"] < full["model"]["parameter_count"] / 2
    assert figures["gradient_bytes"] == 4 * figures["trainable_parameter_count"]
    assert figures["optimizer_state_bytes"] >= 2 * figures["gradient_bytes"]
    assert all("lora_" in name for name in figures["trainable_parameters"])
    assert (
        "base_model.model.model.layers.*.self_attn.q_proj.lora_A.default.weight"
        in (figures["trainable_parameters"])
    )
    assert figures["peak_allocated"] < full["model"]["peak_allocated"]
    assert close(predicted, figures["peak_allocated"])
    assert full["model"]["trainable_parameter_count"] == full["model"]["parameter_count"]


def test_lora_with_dropout_and_checkpointing_is_predicted(runner: Runner) -> None:
    result, predicted = measured_and_predicted(
        runner,
        model="tiny-gpt2",
        batch_size=4,
        seq_len=32,
        checkpointing=True,
        peft={"r": 16, "alpha": 32, "dropout": 0.1, "target_modules": ["c_attn"]},
    )
    assert close(predicted, result["model"]["peak_allocated"])


def test_modules_to_save_are_trained_whole(runner: Runner) -> None:
    result, _ = measured_and_predicted(
        runner,
        **LLAMA,
        peft={"r": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
    )
    names = result["model"]["trainable_parameters"]
    assert "base_model.model.lm_head.modules_to_save.default.weight" in names
