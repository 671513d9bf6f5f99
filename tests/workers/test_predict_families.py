"""A predictor child answers a family's other batch sizes (the same spec but for its batch
size) from its traces at three, through the protocol (workers/models/predict.py): the
answers are the ones a fresh trace gives, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from workers.models.predict import FAMILIES, answer

TINY = {"model": "tiny-gpt2", "seq_len": 32}


def _ask(params: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    out = answer({"params": params, "device": device})
    assert "error" not in out, out
    out.pop("seconds")
    return out


def _fresh(params: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    FAMILIES.clear()
    return _ask(params, device)


@pytest.mark.parametrize(
    ("base", "device"),
    [
        (TINY, "cuda"),
        ({**TINY, "precision": "bf16-autocast", "checkpointing": True}, "cuda"),
        ({**TINY, "config": {"n_layer": 8}}, "cuda"),  # traced shallow and extended
        ({"model": "tiny-bert", "seq_len": 16, "task": "inference"}, "cuda"),
        (TINY, "cpu"),
    ],
)
def test_other_batch_sizes_of_a_family_are_answered_as_fresh_traces_answer(
    base: dict[str, Any], device: str
) -> None:
    fresh = {b: _fresh({**base, "batch_size": b}, device) for b in (1, 5, 9, 2)}
    FAMILIES.clear()
    for b in (3, 1, 2, 7):  # batch 1 is traced, never a point
        _ask({**base, "batch_size": b}, device)
    assert FAMILIES.reused == 0
    for b in (5, 9, 2):
        assert _ask({**base, "batch_size": b}, device) == fresh[b], b
    assert FAMILIES.reused > 0
    assert _ask({**base, "batch_size": 1}, device) == fresh[1]


def test_a_family_is_the_spec_but_for_its_batch_size() -> None:
    FAMILIES.clear()
    for b in (2, 3, 4):
        _ask({**TINY, "batch_size": b})
    other = {**TINY, "seq_len": 16, "batch_size": 5}
    assert _ask(other) == _fresh(other)
    assert FAMILIES.reused == 0


def test_a_family_whose_traces_disagree_is_traced_every_time() -> None:
    # Two micro-batches split a batch unevenly: such specs have no family.
    FAMILIES.clear()
    base = {**TINY, "micro_batches": 2}
    for b in (2, 4, 6):
        _ask({**base, "batch_size": b})
    assert _ask({**base, "batch_size": 8}) == _fresh({**base, "batch_size": 8})
    assert FAMILIES.reused == 0


def test_a_loss_whose_chunks_are_powers_of_two_is_traced_every_time() -> None:
    # Liger's chunk is the next power of two of tokens / ceil(vocab / width): at batch 2,
    # 4 and 8 the chunks lie on a line (128 of them each time), at 3 they do not (96 of
    # 8 tokens, where the line says 128 of 6). The allocation log (a plan's edges) shows it.
    def ask(batch: int) -> dict[str, Any]:
        out = answer({"params": {**base, "batch_size": batch}, "device": "cuda", "log": True})
        assert "error" not in out, out
        out.pop("seconds")
        return out

    FAMILIES.clear()
    base = {"model": "tiny-llama", "seq_len": 256, "loss": "liger", "config": {"vocab_size": 8192}}
    for b in (2, 4, 8):
        ask(b)
    at_three = ask(3)
    assert FAMILIES.reused == 0  # traced, not synthesized from the line
    FAMILIES.clear()
    assert at_three == ask(3)
