"""What would make a step fit: changes to the first variant, each traced at its value and
ranked by the bytes it saves, with what it costs in time where that is known. (The ways
to fine-tune, LoRA, QLoRA, an 8-bit optimizer and FSDP across GPUs, are ranked for each
card apart: app/plans/ways.py.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from app.experiments.predictor import ModelPrediction
from app.plans.schemas import PlanPrediction, Suggestion


class Card(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def usable_bytes(self) -> int: ...
    @property
    def bf16(self) -> bool | None: ...


PredictMany = Callable[[list[dict[str, Any]]], list[ModelPrediction]]
Allowed = Callable[[Mapping[str, Any], str, int], bool]

CHECKPOINTING_COST = (
    "about a third more compute a step: each block's forward runs again in the backward"
)
AUTOCAST_COST = (
    "usually faster (tensor cores) on sm80+ cards; fp32 weights and optimizer state stay"
)
MICRO_COST = (
    "the same samples a step in {m} passes: slower where a micro-batch is too small to keep "
    "the GPU busy"
)
OPTIMIZER_COST = "about the same step time; it trains differently (factored second moments)"
TOKENS_COST = "no time cost, but it changes what is trained: half the context"


def candidates(
    params: Mapping[str, Any], vary: str, value: int
) -> list[tuple[str, dict[str, Any], str]]:
    """(label, overrides, time cost) of each change that applies to these params."""
    out: list[tuple[str, dict[str, Any], str]] = []
    train = params.get("task") == "train"
    if train and not params.get("checkpointing"):
        out.append(("activation checkpointing", {"checkpointing": True}, CHECKPOINTING_COST))
    if params.get("precision") == "fp32":
        if train:
            out.append(("bf16 autocast", {"precision": "bf16-autocast"}, AUTOCAST_COST))
        else:
            out.append(("bf16 weights", {"precision": "bf16"}, "usually faster on sm80+ cards"))
    if train and vary == "batch_size":
        micro = int(params.get("micro_batches") or 1)
        batch = int(params.get("batch_size") or 1)
        for m in (micro * 2, micro * 4):
            if batch % m == 0:
                out.append(
                    (
                        f"{m} micro-batches (gradient accumulation)",
                        {"micro_batches": m},
                        MICRO_COST.format(m=m),
                    )
                )
    if train and params.get("optimizer") in ("adam", "adamw"):
        out.append(
            (
                "Adafactor instead of AdamW",
                {"optimizer": "adafactor", "optimizer_impl": "default"},
                OPTIMIZER_COST,
            )
        )
    seq = params.get("seq_len")
    if vary != "seq_len" and isinstance(seq, int) and seq >= 2:
        out.append((f"fewer tokens: seq_len {seq // 2}", {"seq_len": seq // 2}, TOKENS_COST))
    return out


def ranked(
    predict_many: PredictMany,
    allowed: Allowed,
    params: dict[str, Any],
    vary: str,
    value: int,
    base: PlanPrediction | None,
    cards: Sequence[Card],
    short: list[str],
) -> list[Suggestion]:
    """Each candidate traced at ``value`` (``allowed``: whether the catalog takes a
    change); the ones that save bytes, most saved first."""
    if base is None:
        return []
    found = [
        (label, change, cost)
        for label, change, cost in candidates(params, vary, value)
        if all(allowed({**params, **change}, k, v) for k, v in change.items())
    ]
    answers = predict_many([{**params, **change} for _, change, _ in found])
    out = []
    for (label, change, cost), answer in zip(found, answers, strict=True):
        if answer.peak_reserved is None or answer.peak_reserved >= base.peak_reserved:
            continue
        bf16 = change.get("precision", "").startswith("bf16")
        makes_fit = [
            c.name
            for c in cards
            if c.name in short
            and answer.peak_reserved <= c.usable_bytes
            and not (bf16 and c.bf16 is False)
        ]
        out.append(
            Suggestion(
                change=change,
                label=label,
                peak_reserved=answer.peak_reserved,
                bytes_saved=base.peak_reserved - answer.peak_reserved,
                makes_fit=makes_fit,
                time_cost=cost,
                trainable_parameters=answer.trainable_parameter_count,
            )
        )
    return sorted(out, key=lambda s: -s.bytes_saved)
