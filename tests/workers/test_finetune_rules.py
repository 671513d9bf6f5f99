"""bitsandbytes' optimizers and quantized bases, and Liger's fused loss: CUDA-only specs,
predicted on fake tensors by their documented rules (workers/models/rules.py). The CPU
checks the specs and the rules; the ``cuda`` tests run the real libraries on a GPU host:
``pytest -m cuda tests/workers/test_finetune_rules.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.catalog import CatalogError
from tests.helpers import needs_cuda
from tests.workers.conftest import build_spec

pytest.importorskip("transformers")

LLAMA = {"model": "tiny-llama", "batch_size": 2, "seq_len": 32, "precision": "bf16"}


def predicted(**params: Any) -> dict[str, Any]:
    from workers.models.predict import predict

    return predict(build_spec("model", [], params, device="cuda:0")["params"], "cuda")


def blocks(n: int, size: int) -> int:
    return math.ceil(n / size)


def rounded(n: int) -> int:
    return -(-n // 512) * 512


def sizes(params: dict[str, Any]) -> list[int]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workers.models.build import build

    checked = build_spec("model", [], params, device="cuda:0")["params"]
    with FakeTensorMode(allow_non_fake_inputs=True):
        built = build(checked, torch.device("cpu"), initialize=False)
    return [p.numel() for p in built.trainable()]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({**LLAMA, "optimizer": "adamw-8bit"}, "params.optimizer"),
        ({**LLAMA, "quantization": "qlora"}, "params.quantization"),
        ({**LLAMA, "loss": "liger"}, "params.loss"),
    ],
)
def test_bitsandbytes_and_liger_specs_are_for_cuda_devices(
    params: dict[str, Any], field: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        build_spec("model", [], params, device="cpu")
    assert caught.value.field == field
    build_spec("model", [], params, device="cuda:0")  # accepted where they run


def test_qlora_is_written_out_and_a_quantized_base_is_not_trained_whole() -> None:
    params = build_spec("model", [], {**LLAMA, "quantization": "qlora"}, device="cuda:0")["params"]
    assert params["quantization"] == {
        "method": "nf4",
        "double_quant": True,
        "compute_dtype": "bf16",
    }
    assert params["peft"]["r"] == 8
    with pytest.raises(CatalogError) as caught:
        build_spec("model", [], {**LLAMA, "quantization": {"method": "nf4"}}, device="cuda:0")
    assert caught.value.field == "params.quantization"


def test_8bit_adamw_state_is_two_bytes_a_parameter_plus_block_absmax() -> None:
    full = predicted(**LLAMA)["categories"]["optimizer_state"]
    eight = predicted(**LLAMA, optimizer="adamw-8bit")["categories"]["optimizer_state"]
    from workers.models.rules import BNB_MIN_8BIT, BNB_OPTIM_BLOCK

    expected = rounded(256 * 4) * 2  # the two quantization maps
    for n in sizes(LLAMA):
        if n >= BNB_MIN_8BIT:
            expected += 2 * rounded(n) + 2 * rounded(4 * blocks(n, BNB_OPTIM_BLOCK))
        else:
            expected += 2 * rounded(4 * n)
    assert eight == expected < full


def test_paged_state_is_reported_apart_from_the_peak() -> None:
    params = {**LLAMA, "model": "llama-1b", "config": {"num_hidden_layers": 2}}
    eight = predicted(**params, optimizer="adamw-8bit")
    paged = predicted(**params, optimizer="paged-adamw-8bit")
    paged32 = predicted(**params, optimizer="paged-adamw")
    big = [n for n in sizes(params) if n >= 100_000]
    assert paged["paged_optimizer_state_bytes"] == 2 * sum(big)
    assert paged32["paged_optimizer_state_bytes"] == 8 * sum(big)
    assert paged["peak_allocated"] < eight["peak_allocated"]
    assert any("managed memory" in c for c in paged["caveats"])


def test_a_paged_optimizer_is_refused_by_fit_searches(client: Any) -> None:
    response = client.post(
        "/v1/fits",
        json={
            "spec": {
                "op": "model",
                "device": "cuda",
                "params": {**LLAMA, "optimizer": "paged-adamw-8bit"},
            },
            "capacity_bytes": 2**30,
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == "spec.params.optimizer"


def test_a_4bit_base_holds_half_a_byte_a_weight_and_qlora_trains_only_adapters() -> None:
    base = {**LLAMA, "model": "llama-1b", "config": {"num_hidden_layers": 2}}
    lora = predicted(**base, peft={"r": 8})
    qlora = predicted(**base, quantization="qlora")
    nf4 = predicted(**base, quantization={"method": "nf4"}, peft={"r": 8})
    assert qlora["categories"]["optimizer_state"] == lora["categories"]["optimizer_state"]

    # Double quantisation shrinks the absmax: 4 bytes per 64 weights to about 1.
    def held(p: dict[str, Any]) -> int:  # the packed weights, and their statistics
        return int(p["categories"]["parameters"] + p["categories"]["other"])

    assert held(qlora) < held(nf4)
    assert qlora["peak_allocated"] < nf4["peak_allocated"]


def test_qloras_float32_grouped_attention_keeps_the_whole_matrix_as_cuda_does() -> None:
    # peft's prepare_model_for_kbit_training casts the norms to float32, so a QLoRA
    # Llama's queries are float32: FlashAttention refuses them and the memory-efficient
    # kernel takes no grouped key/value heads, so CUDA runs the math path (keys and
    # values repeated to every head, the softmax kept for the backward: heads x seq x
    # seq floats a layer). The CPU's fused kernel keeps neither; with full heads CUDA's
    # memory-efficient kernel keeps neither either.
    base = {**LLAMA, "model": "llama-1b", "seq_len": 512, "quantization": "qlora"}
    heads, seq = 32, 512

    def activations(kv_heads: int, layers: int) -> int:
        config = {"num_hidden_layers": layers, "num_key_value_heads": kv_heads}
        return int(predicted(**base, config=config)["categories"]["activations"])

    grouped = activations(8, 3) - activations(8, 2)  # one more layer's activations
    full = activations(heads, 3) - activations(heads, 2)
    matrix = LLAMA["batch_size"] * heads * seq * seq * 4
    assert grouped - full >= matrix * 0.9  # less the smaller keys and values


def test_gpt2s_conv1d_layers_are_quantized_as_transformers_quantizes_them() -> None:
    # GPT-2's linear layers are transformers' Conv1D; its bitsandbytes integration
    # quantizes them too (transposed), so a 4-bit GPT-2 holds its blocks in half a byte a
    # weight: only the embeddings (and LayerNorms) stay in 32-bit floats.
    base = {"model": "gpt2", "batch_size": 1, "seq_len": 32, "config": {"n_layer": 2}}
    lora = predicted(**base, peft={"r": 8})
    qlora = predicted(**base, quantization="qlora")
    n_embd, vocab, positions = 768, 50257, 1024
    block_weights = 2 * 12 * n_embd * n_embd  # c_attn 3, c_proj 1, c_fc 4, mlp c_proj 4
    saved = lora["categories"]["parameters"] - qlora["categories"]["parameters"]
    assert saved >= 4 * block_weights - block_weights // 2 - 2**20  # fp32 -> ~0.5 byte
    assert qlora["categories"]["parameters"] >= 4 * (vocab + positions) * n_embd


def test_liger_never_holds_the_whole_batchs_logits() -> None:
    params = {**LLAMA, "model": "llama-1b", "config": {"num_hidden_layers": 2}, "seq_len": 512}
    plain = predicted(**params, peft={"r": 8})
    fused = predicted(**params, peft={"r": 8}, loss="liger")
    assert fused["peak_allocated"] < plain["peak_allocated"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        {"optimizer": "adamw-8bit"},
        {"optimizer": "paged-adamw-8bit"},
        {"quantization": "qlora"},
        {"loss": "liger", "peft": {"r": 8}},
    ],
    ids=["adamw-8bit", "paged-adamw-8bit", "qlora", "liger"],
)
@pytest.mark.parametrize("_cuda", [pytest.param(None, marks=needs_cuda())])
def test_on_a_gpu_the_rules_predict_the_real_libraries(extra: dict[str, Any], _cuda: None) -> None:
    from vramlab.runspec import RunSpec
    from workers.runner import Runner

    params = {**LLAMA, "model": "llama-1b", "config": {"num_hidden_layers": 4}, **extra}
    spec = build_spec("model", [], params, device="cuda:0", warmup=0, repeat=1, timeout_s=600.0)
    runner = Runner()
    runner.start()
    try:
        outcome = runner.run(RunSpec.from_wire(spec))
    finally:
        runner.close()
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    measured = outcome.result["model"]["peak_allocated"]
    assert abs(predicted(**params)["peak_allocated"] - measured) <= 0.03 * measured
