"""The ways to fine-tune a training step, ranked for each card: the spec as given (a
full fine-tune, usually), 8-bit AdamW, LoRA, QLoRA, and FSDP2 on the fewest of 2, 4 or 8
GPUs that fit, each predicted at the first variant's value, with what it trains (its
trainable parameters) and what it costs.

For each card the ways are ranked: those predicted to fit first; then the fewest GPUs;
then the most trainable parameters (a full fine-tune before adapters); then the least
departure from the spec as given (the spec itself, then 8-bit optimizer state, then a
4-bit base); then the lowest peak. A distributed way's figures are per rank (every rank
of FSDP on equal batches holds alike: docs/models.md), its batch per GPU the spec's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.catalog.distributed import FSDP_OPTIMIZERS
from app.experiments.predictor import ModelPrediction
from app.plans.schemas import CardWays, PlanAnswer, Way
from vramlab.runspec import DISTRIBUTED_MAX_GPUS

# peft's default dropout (0): masks on every adapted input cost more than LoRA saves
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
NF4 = {"method": "nf4", "double_quant": True, "compute_dtype": "bf16"}  # what "qlora" means
LORA_LABEL = "LoRA r=16 (adapters only)"
QLORA_LABEL = "QLoRA: a 4-bit NF4 base with LoRA r=16"
FSDP_GPUS = tuple(n for n in (2, 4, 8) if n <= DISTRIBUTED_MAX_GPUS)
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
FSDP_COST = (
    "{n} times the samples a step (each GPU at this batch); every block gathered and its "
    "gradients reduce-scattered: slower over PCIe than NVLink"
)
QLORA_ABOVE_LORA = (
    "QLoRA peaks above LoRA here: prepare_model_for_kbit_training keeps the layers it does not "
    "quantize in float32, so the step's activations are float32 (twice bf16's), and "
    "float32 attention over grouped-query heads takes CUDA's math kernel, which holds "
    "the whole seq x seq scores; the 4-bit base saves less than that costs at this "
    "length (a shorter sequence or checkpointing narrows it)"
)
FSDP_NOTE = (
    "per rank, each of {n}; its reserved is the allocated peak rounded up to 2 MiB "
    "segments (a floor: collectives' buffers and the allocator's holes are not replayed)"
)


class Card(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def usable_bytes(self) -> int: ...


PredictMany = Callable[[list[dict[str, Any]]], list[ModelPrediction]]
Normalize = Callable[[Mapping[str, Any]], dict[str, Any] | None]


@dataclass(frozen=True)
class Candidate:
    label: str
    change: dict[str, Any]
    time_cost: str | None
    departs: int  # 0: trains as given; 1: 8-bit optimizer state; 2: a quantized base
    gpus: int = 1


def candidates(params: Mapping[str, Any]) -> list[Candidate]:
    """The ways that apply to a training step's params (none for inference)."""
    if params.get("task") != "train":
        return []
    full = not params.get("peft") and not params.get("quantization")
    single = params.get("distributed") is None
    out = []
    if full and single and params.get("optimizer") in ("adam", "adamw"):
        out.append(Candidate("8-bit AdamW", {"optimizer": "adamw-8bit"}, OPTIMIZER_8BIT_COST, 1))
    if full and single:
        out.append(Candidate(LORA_LABEL, {"peft": LORA}, LORA_COST, 0))
        out.append(Candidate(QLORA_LABEL, {"quantization": NF4, "peft": LORA}, QLORA_COST, 2))
    if full and single and params.get("optimizer") in FSDP_OPTIMIZERS:
        for n in FSDP_GPUS:
            out.append(
                Candidate(
                    f"FSDP2 full sharding on {n} GPUs",
                    {"distributed": {"strategy": "fsdp", "gpus": n}},
                    FSDP_COST.format(n=n),
                    0,
                    n,
                )
            )
    return out


@dataclass(frozen=True)
class Predicted:
    candidate: Candidate
    answer: ModelPrediction


def ranked(
    predict_many: PredictMany,
    normalize: Normalize,
    params: dict[str, Any],
    base: ModelPrediction,
    given: Sequence[PlanAnswer],
    cards: Sequence[Card],
) -> tuple[list[CardWays], list[str]]:
    """For each card, the ways ranked (``base``: the spec's own prediction; ``given``: its
    answers, one per card, whose ``fits`` the spec's row keeps). Each way is predicted
    once for every card; FSDP's row on a card is the fewest GPUs that fit it (the most
    tried where none does). Also what could not be predicted (a way past the
    predictor's time limit), each a line saying why."""
    if params.get("task") != "train" or base.peak_reserved is None:
        return [], []
    found: list[tuple[Candidate, dict[str, Any]]] = []
    for c in candidates(params):
        full = normalize({**params, **c.change})
        if full is not None:
            found.append((c, full))
    answers = predict_many([full for _, full in found])
    predicted = [
        Predicted(c, a)
        for (c, _), a in zip(found, answers, strict=True)
        if a.peak_reserved is not None
    ]
    unranked = [
        f"not ranked: {c.label}: {'; '.join(a.caveats) or 'not predicted'}"
        for (c, _), a in zip(found, answers, strict=True)
        if a.peak_reserved is None
    ]
    label = (
        "full fine-tune (as given)" if _full_fine_tune(params) else f"as given ({_kind(params)})"
    )
    notes = _notes(predicted)
    own = Candidate(label, {}, None, 0, int((params.get("distributed") or {}).get("gpus") or 1))
    out = []
    for i, card in enumerate(cards):
        rows = [_way(own, base, card, given[i].fits if i < len(given) else None)]
        sharded = [p for p in predicted if p.candidate.gpus > 1]
        for p in predicted:
            if p.candidate.gpus == 1:
                rows.append(_way(p.candidate, p.answer, card, note=notes.get(p.candidate.label)))
        if sharded:
            fitting = [p for p in sharded if _reserved(p.answer) <= card.usable_bytes]
            pick = fitting[0] if fitting else sharded[-1]
            rows.append(_way(pick.candidate, pick.answer, card))
        rows.sort(key=_order)
        ranked_rows = [w.model_copy(update={"rank": r}) for r, w in enumerate(rows, start=1)]
        out.append(CardWays(gpu=card.name, usable_bytes=card.usable_bytes, ways=ranked_rows))
    return out, unranked


def _notes(predicted: Sequence[Predicted]) -> dict[str, str]:
    """What a way's row says beside its figures, by label: why QLoRA peaks above LoRA
    where it does (its float32 activations), which no one expects of a 4-bit base."""
    peaks = {p.candidate.label: p.answer.peak_allocated or 0 for p in predicted}
    if LORA_LABEL in peaks and peaks.get(QLORA_LABEL, 0) > peaks[LORA_LABEL]:
        return {QLORA_LABEL: QLORA_ABOVE_LORA}
    return {}


def _reserved(a: ModelPrediction) -> int:
    assert a.peak_reserved is not None
    return a.peak_reserved


def _full_fine_tune(params: Mapping[str, Any]) -> bool:
    return not params.get("peft") and not params.get("quantization")


def _kind(params: Mapping[str, Any]) -> str:
    if params.get("quantization") and params.get("peft"):
        return "a quantized base with adapters"
    return "adapters" if params.get("peft") else "a quantized base"


def _way(
    c: Candidate,
    a: ModelPrediction,
    card: Card,
    fits: bool | None = None,
    note: str | None = None,
) -> Way:
    assert a.peak_reserved is not None and a.peak_allocated is not None
    if fits is None:
        fits = a.peak_reserved <= card.usable_bytes
    return Way(
        rank=0,
        label=c.label,
        change=c.change,
        gpus=c.gpus,
        peak_allocated=a.peak_allocated,
        peak_reserved=a.peak_reserved,
        fits=fits,
        headroom_bytes=card.usable_bytes - a.peak_reserved,
        parameters=a.parameter_count,
        trainable_parameters=a.trainable_parameter_count,
        departs=c.departs,
        time_cost=c.time_cost,
        note=FSDP_NOTE.format(n=c.gpus) if c.gpus > 1 else note,
    )


def _order(w: Way) -> tuple[bool, int, int, int, int]:
    return (not w.fits, w.gpus, -(w.trainable_parameters or 0), w.departs, w.peak_reserved)
