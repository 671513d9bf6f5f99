"""A plan's edges through the predictor's protocol (workers/models/predict.py): a step's
allocation log at any batch or sequence length equals the one synthesized from the logs
traced at two (three) others, and a card's edge from them is where predictions under its
capacity stop fitting."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from workers.models import edges
from workers.models.predict import answer

MiB = 2**20
TINY = {"model": "tiny-gpt2", "seq_len": 32, "batch_size": 4}


def _log(params: dict[str, Any]) -> list[tuple[int, int]]:
    out = answer({"params": params, "device": "cuda", "log": True})
    assert out["log"], out
    return edges.unpack(out["log"])


@pytest.mark.parametrize(
    ("base", "vary", "traced", "checked"),
    [
        (TINY, "batch_size", [4, 2], [3, 7, 16]),
        ({**TINY, "precision": "bf16-autocast", "checkpointing": True}, "batch_size", [2, 3], [5]),
        ({"model": "tiny-bert", "seq_len": 16}, "batch_size", [2, 4], [6]),
        (TINY, "seq_len", [128, 64, 32], [96, 256]),
    ],
)
def test_a_log_at_any_value_is_the_one_synthesized_from_a_few_traced(
    base: dict[str, Any], vary: str, traced: list[int], checked: list[int]
) -> None:
    fit = edges.fitted([(x, _log({**base, vary: x})) for x in traced])
    assert fit is not None
    for x in checked:
        assert edges.at(fit, x) == _log({**base, vary: x}), x


def test_a_length_no_kernel_pads_alike_is_synthesized_close_enough_to_replay_the_same() -> None:
    # Memory-efficient attention pads its logsumexp to a multiple of 32 tokens: between
    # multiples a few small sizes are not on the polynomial; what is reserved is the same.
    from workers.models.predict import reserved_peak, trace

    fit = edges.fitted([(x, _log({**TINY, "seq_len": x})) for x in (128, 64, 32)])
    assert fit is not None
    for x in (50, 200):
        traced = trace({**TINY, "seq_len": x}, "cuda")
        assert traced.events is not None and traced.settings is not None
        synthesized = edges.at(fit, x)
        assert synthesized is not None
        assert reserved_peak(synthesized, traced.settings) == reserved_peak(
            traced.events, traced.settings
        )
    # Points that are not all multiples of the padding do not line up: nothing is made.
    assert edges.fitted([(x, _log({**TINY, "seq_len": x})) for x in (64, 32, 16)]) is None


def _edge(points: list[int], capacity: int) -> dict[str, Any]:
    request = {
        "points": [[x, edges.pack(_log({**TINY, "batch_size": x}))] for x in points],
        "capacities": [capacity, 2**40],
        "step": 1,
        "top": 4096,
        "value": 4,
    }
    out = answer({"params": TINY, "device": "cuda", "edges": request})
    assert "error" not in out, out
    found, roomy = out["edges"]
    assert roomy["edge"] in (None, 4096)  # a terabyte holds the largest batch allowed
    result: dict[str, Any] = found
    return result


def _capped(batch: int, capacity: int) -> int:
    out = answer({"params": {**TINY, "batch_size": batch, "capacity_bytes": capacity}})
    reserved: int = out["peak_reserved"]
    return reserved


def test_an_edge_is_where_predictions_under_the_capacity_stop_fitting() -> None:
    capacity = 90 * MiB
    found = _edge([4, 2], capacity)
    edge = found["edge"]
    assert edge > 4
    assert _capped(edge, capacity) <= capacity < _capped(edge + 1, capacity)
    assert found["reserved_at_value"] == _capped(4, capacity)
    # Batch 1's own log differs (see below): where 2 does not fit, 1 is left to a trace.
    tight = _capped(2, 2**40) // 2
    assert _capped(2, tight) > tight
    assert _edge([4, 2], tight)["edge"] is None


def test_logs_that_do_not_line_up_give_no_edge() -> None:
    # At batch 1 a step makes a few allocations fewer: nothing is synthesized from it.
    assert _edge([1, 2], 90 * MiB) == {"edge": None, "reserved_at_value": None}
