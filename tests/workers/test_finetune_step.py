"""The step as the user runs it, on the CPU through the worker's runner: dropout as the
config has it (masks kept), short seq2seq targets, the inference cache and kept logits;
each measured and predicted on fake tensors, and the two agree."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workers.conftest import build_spec
from workers.runner import Runner

pytest.importorskip("transformers")


def measured_and_predicted(runner: Runner, **params: Any) -> tuple[dict[str, Any], int]:
    from workers.models.predict import predict

    spec = build_spec("model", [], params, warmup=0, repeat=1, timeout_s=120.0)
    outcome = runner.run(spec)
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result, predict(spec["params"], "cpu")["peak_allocated"]


def close(predicted: int, measured: int, within: float = 0.01) -> bool:
    return abs(predicted - measured) <= within * measured


GPT2 = {"model": "tiny-gpt2", "batch_size": 4, "seq_len": 32}


def test_training_keeps_the_configs_dropout_masks_and_the_prediction_follows(
    runner: Runner,
) -> None:
    on, predicted_on = measured_and_predicted(runner, **GPT2)
    off, predicted_off = measured_and_predicted(runner, **GPT2, dropout=0.0)
    assert on["model"]["peak_allocated"] > off["model"]["peak_allocated"]
    assert on["categories"]["activations"] > off["categories"]["activations"]
    assert close(predicted_on, on["model"]["peak_allocated"])
    assert close(predicted_off, off["model"]["peak_allocated"])


def test_a_seq2seq_step_with_short_targets_is_smaller_and_predicted(runner: Runner) -> None:
    params = {"model": "tiny-t5", "batch_size": 4, "seq_len": 64}
    long, _ = measured_and_predicted(runner, **params)
    short, predicted = measured_and_predicted(runner, **params, target_len=8)
    assert short["model"]["peak_allocated"] < long["model"]["peak_allocated"]
    assert close(predicted, short["model"]["peak_allocated"])


def test_inference_without_the_cache_and_with_one_logit_is_smaller_and_predicted(
    runner: Runner,
) -> None:
    params = {"model": "tiny-llama", "task": "inference", "batch_size": 4, "seq_len": 64}
    default, _ = measured_and_predicted(runner, **params)
    lean, predicted = measured_and_predicted(runner, **params, use_cache=False, logits_to_keep=1)
    assert lean["model"]["peak_allocated"] < default["model"]["peak_allocated"]
    assert close(predicted, lean["model"]["peak_allocated"], 0.02)


def test_generation_without_a_cache_reruns_the_sequence_and_is_predicted(runner: Runner) -> None:
    result, predicted = measured_and_predicted(
        runner,
        model="tiny-llama",
        task="generate",
        batch_size=2,
        seq_len=16,
        new_tokens=4,
        use_cache=False,
    )
    assert close(predicted, result["model"]["peak_allocated"])


def test_a_config_json_builds_the_model_it_describes(runner: Runner) -> None:
    from vramlab.catalog.model_zoo import PRESETS

    config_json = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0",
        **PRESETS["tiny-llama"].config,
    }
    shape = {"task": "inference", "batch_size": 2, "seq_len": 16}
    preset, _ = measured_and_predicted(runner, model="tiny-llama", **shape)
    inline, predicted = measured_and_predicted(runner, config_json=config_json, **shape)
    assert inline["model"]["peak_allocated"] == preset["model"]["peak_allocated"]
    assert inline["model"]["parameter_count"] == preset["model"]["parameter_count"]
    assert close(predicted, inline["model"]["peak_allocated"])


def test_a_cuda_prediction_keeps_a_one_byte_mask_per_dropout() -> None:
    """CUDA runs a training dropout as ATen's fused kernel, which keeps a bool mask for the
    backward; the CPU keeps its noise in the input's dtype (four bytes an element in
    float32). The CUDA prediction traced on CPU fake tensors holds CUDA's masks."""
    from workers.models.predict import predict

    def activations(dropout: float) -> int:
        params = build_spec("model", [], {**GPT2, "dropout": dropout}, device="cuda")["params"]
        return int(predict(params, "cuda")["categories"]["activations"])

    # tiny-gpt2: the embeddings' dropout and two per block (after attention, after the
    # MLP), each over batch x seq x width; attention's own dropout is inside its kernel.
    masks = (1 + 2 * 2) * (4 * 32 * 64)
    assert activations(0.1) - activations(0.0) == masks


def test_a_deep_t5_with_short_targets_is_extended_as_traced_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """T5-base, 8 x 512, 64-token targets, predicted for CUDA: at two and three blocks its
    backward peaks late (the decoder's gradients made, the encoder's activations still
    held), a moment that grows less per block than the backward's start (every activation
    held), which is the peak at twelve. Each phase's start is extended on its own line too,
    so the shallow extension equals the whole trace."""
    from workers.models import cost
    from workers.models.predict import predict

    spec = {"model": "t5-base", "batch_size": 8, "seq_len": 512, "target_len": 64}
    params = build_spec("model", [], spec, device="cuda")["params"]
    extended = predict(params, "cuda")
    monkeypatch.setattr(cost, "DEEP_ENOUGH", 10**6)  # 24 blocks: traced whole
    whole = predict(params, "cuda")
    assert (extended["phase"], whole["phase"]) == ("backward", "backward")
    assert extended["peak_allocated"] == whole["peak_allocated"]


def test_torchs_adafactor_is_predicted_as_it_runs(runner: Runner) -> None:
    """torch's Adafactor reads values in its update (the step, two norms), which fake
    tensors do not hold: the prediction answers those reads and traces the rest, its
    factored state and its update's buffers, as the worker measures them."""
    from workers.models.predict import predict

    params = {"model": "tiny-llama", "batch_size": 2, "seq_len": 32, "optimizer": "adafactor"}
    result, predicted = measured_and_predicted(runner, **params)
    figures = result["model"]
    assert close(predicted, figures["peak_allocated"], 0.001)
    spec = build_spec("model", [], params)
    categories = predict(spec["params"], "cpu")["categories"]
    assert categories["optimizer_state"] == figures["optimizer_state_bytes"]
    # factored: far less than AdamW's two moments, one per element of every parameter
    assert figures["optimizer_state_bytes"] < figures["parameter_bytes"] / 4
