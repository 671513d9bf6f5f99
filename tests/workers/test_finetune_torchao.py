"""torchao's low-bit AdamW (8-bit, 4-bit, FP8 state) on the CPU: measured by the worker
running torchao's own optimizer, predicted by the documented rule for its state
(workers/models/rules.py) inside the same tally, and counted independently here from a
plain torchao optimizer's state tensors."""

from __future__ import annotations

import pytest

from app.catalog import CatalogError
from tests.workers.conftest import build_spec
from tests.workers.test_finetune_step import close, measured_and_predicted
from workers.runner import Runner

pytest.importorskip("transformers")
pytest.importorskip("torchao")

LLAMA = {"model": "tiny-llama", "batch_size": 2, "seq_len": 32}
EMBEDDING = 1000 * 64  # tiny-llama's largest parameter (vocabulary x hidden)
# Its update's buffers per element on the CPU (torchao 0.18): dequantized moments in
# float32, 4-bit's codes before packing, two float32 scales per block.
UPDATE_PER_ELEMENT = {
    "torchao-adamw-8bit": 8 + 8 / 256,
    "torchao-adamw-4bit": 26 + 8 / 128,
    "torchao-adamw-fp8": 2 + 8 / 256,
}
CLASSES = {
    "torchao-adamw-8bit": "AdamW8bit",
    "torchao-adamw-4bit": "AdamW4bit",
    "torchao-adamw-fp8": "AdamWFp8",
}


def plain_state_bytes(name: str) -> int:
    """The bytes a plain torchao optimizer's state holds after one step of tiny-llama, as
    torchao's docs show it: its quantized moments by their codes, scales and maps."""
    import torch
    import torchao.optim
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(  # tiny-llama, as the catalog describes it
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_config(config)
    optimizer = getattr(torchao.optim, CLASSES[name])(model.parameters(), lr=1e-4)
    ids = torch.zeros(2, 32, dtype=torch.long)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            parts = [getattr(value, a) for a in ("codes", "scale", "qmap") if hasattr(value, a)]
            total += sum(t.nbytes for t in parts or [value])
    return total


@pytest.mark.parametrize("name", list(CLASSES))
def test_torchao_state_is_measured_as_torchao_allocates_and_predicted(
    runner: Runner, name: str
) -> None:
    result, predicted = measured_and_predicted(runner, **LLAMA, optimizer=name)
    from workers.models.predict import predict

    figures = result["model"]
    assert figures["optimizer_state_bytes"] == plain_state_bytes(name)
    spec = build_spec("model", [], {**LLAMA, "optimizer": name})
    prediction = predict(spec["params"], "cpu")
    assert prediction["categories"]["optimizer_state"] == figures["optimizer_state_bytes"]
    assert result["categories"]["optimizer_state"] == figures["optimizer_state_bytes"]
    # 8-bit and FP8 peak in the backward; 4-bit inside its compiled update, while the
    # embedding's moments are dequantized and their codes made (the rule's buffers).
    assert close(predicted, figures["peak_allocated"], 0.001)
    # Step 2's update (its state made in step 1), as the rule says: the optimizer
    # phase's peak above what the backward left, at the largest parameter (the embedding).
    phases = {p["name"]: p for p in figures["steps"][1]["phases"]}
    held = phases["optimizer"]["peak_allocated"] - phases["backward"]["allocated_end"]
    assert close(held, UPDATE_PER_ELEMENT[name] * EMBEDDING, 0.01), held
    # Low-bit moments: well under AdamW's two float32 moments a parameter.
    assert figures["optimizer_state_bytes"] < figures["parameter_bytes"]


def test_torchao_optimizers_are_refused_where_torchao_does_not_match_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib import metadata

    from workers.models import finetune
    from workers.models.predict import answer

    params = build_spec("model", [], {**LLAMA, "optimizer": "torchao-adamw-8bit"})["params"]
    monkeypatch.setattr(finetune, "TORCHAO_MIN_TORCH", {(0, 18): (99, 0)})
    refused = answer({"id": 1, "params": params, "device": "cpu"})["error"]
    assert refused["field"] == "params.optimizer"
    assert "built for torch 99.0 or later" in refused["message"]
    assert "unpredictable" not in refused  # refused, not measured only

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    refused = answer({"id": 2, "params": params, "device": "cpu"})["error"]
    assert refused["field"] == "params.optimizer"
    assert "torchao is not installed" in refused["message"]


def test_torchao_optimizers_are_in_the_catalog_and_not_across_gpus() -> None:
    from vramlab.runspec import OPTIMIZERS

    assert set(CLASSES) <= set(OPTIMIZERS)
    build_spec("model", [], {**LLAMA, "optimizer": "torchao-adamw-4bit"}, device="cuda:0")
    with pytest.raises(CatalogError) as caught:
        build_spec(
            "model",
            [],
            {
                **LLAMA,
                "optimizer": "torchao-adamw-8bit",
                "distributed": {"strategy": "ddp", "gpus": 2},
            },
            device="cuda",
        )
    assert caught.value.field == "params.optimizer"
