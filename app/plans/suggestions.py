"""What would make a step fit: changes to the first variant, each traced at its value and
ranked by the bytes it saves, with what it costs in time where that is known."""

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
# peft's default dropout (0): masks on every adapted input cost more than LoRA saves
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
NF4 = {"method": "nf4", "double_quant": True, "compute_dtype": "bf16"}  # what "qlora" means
LORA_COST = (
    "less compute a step (no gradients for the frozen base's weights); it trains small "
    "adapters on every linear layer, not the whole model (peft)"
)
QLORA_COST = (
    "slower a step: every matmul dequantizes the 4-bit base; trains the same adapters as "
    "LoRA (bitsandbytes and peft on the worker)"
)
OPTIMIZER_8BIT_COST = (
    "about the same step time; AdamW's two moments kept in 8 bits (bitsandbytes), a "
    "quarter of their 32-bit bytes"
)


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
    full = train and not params.get("peft") and not params.get("quantization")
    if full and params.get("optimizer") in ("adam", "adamw"):
        out.append(("8-bit AdamW", {"optimizer": "adamw-8bit"}, OPTIMIZER_8BIT_COST))
    if full:
        out.append(("LoRA r=16 (fine-tune adapters only)", {"peft": LORA}, LORA_COST))
        out.append(
            (
                "QLoRA: a 4-bit NF4 base with LoRA r=16",
                {"quantization": NF4, "peft": LORA},
                QLORA_COST,
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
            )
        )
    return sorted(out, key=lambda s: -s.bytes_saved)
