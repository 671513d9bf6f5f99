"""Requests and responses of plans (``/v1/plans``)."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.core.data import AS_DATA, DataDict, RequestBody

MAX_GPUS = 8
MAX_VARIANTS = 8
MAX_ANSWERS = 32  # GPUs (capacity_bytes counts as one) x variants

GpuName = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
]


def _one_variant() -> list[dict[str, Any]]:
    return [{}]


class PlanIn(RequestBody):
    """A model spec, the GPUs (or a capacity) to fit it in, and variants to compare."""

    model_config = ConfigDict(extra="forbid")

    spec: DataDict = Field(
        description='a model experiment spec (op "model"), as POST /v1/experiments takes; '
        "predicted for CUDA"
    )
    gpus: list[GpuName] = Field(
        default_factory=list,
        max_length=MAX_GPUS,
        description='GPU names, loosely matched ("4090", "h100", "H100 80GB"): GET /v1/gpus',
    )
    capacity_bytes: int | None = Field(
        default=None,
        ge=2**20,
        le=2**50,
        strict=True,
        description="an emulated card of this many usable bytes (no per-process overhead "
        "taken off), beside or instead of gpus",
    )
    variants: list[Annotated[dict[str, Any], AS_DATA]] = Field(
        default_factory=_one_variant,
        min_length=1,
        max_length=MAX_VARIANTS,
        description='param overrides, one answer per GPU each (e.g. {"checkpointing": true})',
    )
    vary: Literal["batch_size", "seq_len"] = Field(
        default="batch_size", description="the param whose largest fitting value is predicted"
    )
    max_value: int | None = Field(
        default=None, ge=1, le=2**20, strict=True, description="predict no higher than this"
    )
    suggest: bool = Field(
        default=True,
        description="where the first variant does not fit a GPU, what would make it fit; "
        "for a training step, the ways to fine-tune ranked for each GPU (ways)",
    )
    verify: bool = Field(
        default=True,
        description="walk each edge with traces under the card's capacity, from a curve's "
        "estimate, as a fit's prediction does (false: the curve's estimate alone: faster, "
        "and far off for some steps)",
    )


class PlanGpu(BaseModel):
    name: str
    total_bytes: int
    usable_bytes: int = Field(description="what the caching allocator may reserve")
    usable_source: str = Field(description="measured, placeholder, estimate or given")
    bf16: bool | None = None


class PlanVariant(BaseModel):
    index: int
    overrides: dict[str, Any]
    label: str
    value: int = Field(description="the value of vary that this answer's prediction is for")
    gpus: int = Field(
        default=1,
        description="the GPUs the step takes (distributed.gpus, else 1); a distributed "
        "step's figures are per rank, its batch_size per GPU",
    )


class PlanPrediction(BaseModel):
    peak_allocated: int
    peak_reserved: int
    categories: dict[str, int]
    parameters: int | None = Field(
        default=None,
        description="the model's parameters (a quantized weight as the elements it stands for)",
    )
    trainable_parameters: int | None = Field(
        default=None, description="those its optimizer trains (LoRA: its adapters)"
    )


class PlanAnswer(BaseModel):
    gpu: PlanGpu
    variant: PlanVariant
    prediction: PlanPrediction | None = Field(description="null: the step is not predictable")
    fits: bool | None = Field(description="predicted peak reserved <= the card's usable bytes")
    headroom_bytes: int | None = Field(description="usable - predicted peak reserved (< 0: short)")
    predicted_max_fitting: int | None = Field(
        description="the largest value of vary predicted to fit (0: not even the smallest); "
        "a prediction: a fit (POST /v1/fits) measures it"
    )
    edge: Literal["estimated", "traced"] | None = Field(
        default=None,
        description="estimated: read off a curve through traced values; traced: each value "
        "around the edge traced under the card's capacity (verify)",
    )
    note: str | None = None


class Suggestion(BaseModel):
    change: dict[str, Any] = Field(description="param overrides on the first variant")
    label: str
    peak_reserved: int = Field(description="predicted, at the first variant's value")
    bytes_saved: int = Field(description="against the first variant's predicted peak reserved")
    makes_fit: list[str] = Field(description="GPUs it does not fit today that it would fit")
    time_cost: str | None = Field(description="what it costs in time, where known")
    trainable_parameters: int | None = Field(
        default=None, description="what the changed step trains (predicted)"
    )


class Way(BaseModel):
    """One way to fine-tune on a card, predicted at the first variant's value."""

    rank: int = Field(description="1 is the best way for this card (see ways)")
    label: str
    change: dict[str, Any] = Field(
        description="param overrides on the first variant ({}: as given)"
    )
    gpus: int = Field(description="the GPUs it takes; a distributed way's figures are per rank")
    peak_allocated: int
    peak_reserved: int
    fits: bool | None = Field(description="peak reserved (per rank) <= the card's usable bytes")
    headroom_bytes: int
    parameters: int | None = Field(description="the model's parameters")
    trainable_parameters: int | None = Field(description="those this way trains")
    departs: int = Field(
        description="how far it departs from training the spec as given: 0 none, 1 8-bit "
        "optimizer state, 2 a 4-bit base"
    )
    time_cost: str | None = Field(description="what it costs in time, where known")
    note: str | None = None


class CardWays(BaseModel):
    gpu: str
    usable_bytes: int
    ways: list[Way] = Field(
        description="ranked: fits first, then fewer GPUs, more trainable parameters, less "
        "departure from the spec as given, lower peak reserved"
    )


class PlanOut(BaseModel):
    predicted: Literal[True] = Field(
        default=True, description="every figure here is a prediction: nothing ran"
    )
    model: str
    vary: str
    device: str = Field(description="what the figures are predicted for")
    params: dict[str, Any] = Field(description="the first variant's params as checked")
    answers: list[PlanAnswer]
    suggestions: list[Suggestion]
    ways: list[CardWays] = Field(
        default_factory=list,
        description="for a training step (with suggest), per card the ways to fine-tune "
        "ranked: as given, 8-bit AdamW, LoRA, QLoRA, FSDP2 on the fewest of 2, 4 or 8 GPUs "
        "that fit",
    )
    caveats: list[str]
    predictions: int = Field(
        description="how many steps this plan asked the predictor for (each traced, or "
        "answered from its cache); the edges synthesized from them are not counted"
    )
    seconds: float
