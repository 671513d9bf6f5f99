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
        description="where the first variant does not fit a GPU, what would make it fit",
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


class PlanPrediction(BaseModel):
    peak_allocated: int
    peak_reserved: int
    categories: dict[str, int]


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
    caveats: list[str]
    predictions: int = Field(
        description="how many steps this plan asked the predictor for (each traced, or "
        "answered from its cache); the edges synthesized from them are not counted"
    )
    seconds: float
