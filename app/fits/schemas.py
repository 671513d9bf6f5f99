"""Requests and responses of fit searches (``/v1/fits``)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.data import AS_DATA, DataDict, RequestBody
from vramlab.contract import FitStatus, Status

MAX_VARIANTS = 8


def _one_variant() -> list[dict[str, Any]]:
    return [{}]


class FitRequirements(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f]+$",
        description="run the trials on a GPU whose name contains this; without "
        "capacity_bytes, the capacity is that GPU's memory",
    )


class FitIn(RequestBody):
    """A model spec, the param to vary, and the capacity to fit it in."""

    model_config = ConfigDict(extra="forbid")

    spec: DataDict = Field(
        description='a model experiment spec (op "model"), as POST /v1/experiments takes'
    )
    vary: Literal["batch_size", "seq_len"] = Field(
        default="batch_size", description="the param searched for its largest fitting value"
    )
    capacity_bytes: int | None = Field(
        default=None,
        ge=1,
        le=2**50,
        strict=True,
        description="the memory to fit in; else the named GPU's (requirements.gpu_name)",
    )
    variants: list[Annotated[dict[str, Any], AS_DATA]] = Field(
        default_factory=_one_variant,
        min_length=1,
        max_length=MAX_VARIANTS,
        description='param overrides, one search each (e.g. {"checkpointing": true})',
    )
    requirements: FitRequirements = Field(default_factory=FitRequirements)
    max_value: int | None = Field(
        default=None, ge=1, le=2**20, strict=True, description="search no higher than this"
    )


class FitTrial(BaseModel):
    value: int
    status: Status
    experiment_id: str
    peak_allocated: int | None = Field(description="measured, model.peak_allocated")
    peak_reserved: int | None = None
    predicted_peak_allocated: int | None = None
    error_type: str | None = None
    rank: int | None = Field(
        default=None,
        description="a distributed trial's rank whose peak this is: the highest rank's, or "
        "the rank that ran out of memory (null: one process)",
    )


class PredictedPoint(BaseModel):
    value: int
    peak_allocated: int | None
    peak_reserved: int | None


class FitVariant(BaseModel):
    index: int
    overrides: dict[str, Any]
    state: Literal["predicting", "measuring", "done", "failed", "cancelled"]
    predicted_max_fitting: int | None = Field(
        description="the largest value whose predicted peak fits (null: not predicted)"
    )
    max_fitting: int | None = Field(
        description="the largest value measured to fit (null: not yet, or none fits)"
    )
    first_failing: int | None = Field(
        description="the value above max_fitting, measured to run out of memory "
        "(null: max_fitting is the search's upper bound)"
    )
    prediction_error: float | None = Field(
        description="(measured - predicted) / predicted peak at max_fitting, in percent"
    )
    upper_bound: int = Field(description="the highest value this search could try")
    predicted_points: list[PredictedPoint] = Field(
        default_factory=list,
        description="the values the prediction tried on its way to predicted_max_fitting, "
        "each with its predicted peaks: the variant's predicted curve",
    )
    note: str | None = None
    error: str | None = None
    trials: list[FitTrial]


class FitOut(BaseModel):
    id: str
    status: FitStatus
    created_at: datetime
    finished_at: datetime | None
    spec: dict[str, Any]
    vary: str
    capacity_bytes: int
    capacity_source: str
    max_value: int
    error: str | None
    variants: list[FitVariant]


class FitSummary(BaseModel):
    id: str
    status: FitStatus
    created_at: datetime
    model: str | None
    vary: str
    capacity_bytes: int
    max_fitting: list[int | None] = Field(description="each variant's, in order")


class FitPage(BaseModel):
    items: list[FitSummary]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null at the end"
    )
