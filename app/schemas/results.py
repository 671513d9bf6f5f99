"""Responses about results: the peak, sweeps and comparisons."""

from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field
from vramlab.contract import ErrorType, Status

from app.schemas.data import AS_DATA, DataDict


class BlockOut(BaseModel):
    """One allocation seen in the trace."""

    addr: int | None
    size: int
    seq: int
    t_us: float = Field(description="microseconds from the experiment's start")
    phase: str | None
    frames: list[dict[str, Any]] = Field(default_factory=list)


class PeakMoment(BaseModel):
    seq: int | None
    t_us: float
    phase: str | None
    allocated: int
    reserved: int | None = Field(description="null where the trace records no segments (CPU)")


class PeakOut(BaseModel):
    experiment_id: str
    events: int
    peak: PeakMoment | None
    alive_at_peak: list[BlockOut] = Field(description="blocks alive at the peak, largest first")
    alive_count: int
    largest: list[BlockOut] = Field(description="the largest allocations of the whole trace")
    measured_allocated_peak: int | None = Field(
        default=None, description="result.memory.allocated_peak, from the allocator's stats"
    )


class SweepIn(BaseModel):
    """A base spec and a grid; every combination of the grid's values is one experiment."""

    spec: DataDict = Field(description="an experiment spec, as POST /v1/experiments takes")
    grid: Annotated[dict[str, list[Any]], AS_DATA] = Field(
        description=(
            'keys: "shape", "dtype", "device", "repeat", "warmup", "trace", "isolation", '
            '"allocator.<key>", "params.<key>" or a bare op parameter name'
        ),
        json_schema_extra={
            "examples": [{"shape": [[256, 256], [1024, 1024]], "dtype": ["float32", "bfloat16"]}]
        },
    )


class SweepRow(BaseModel):
    # Which point this is; the other fields are its figures (the CSV's columns).
    IDENTITY: ClassVar[tuple[str, ...]] = ("index", "experiment_id", "status", "values")

    index: int
    experiment_id: str
    status: Status
    values: dict[str, Any] = Field(description="this point's grid values")
    delta_allocated: int | None = None
    allocated_peak: int | None = None
    reserved_peak: int | None = None
    predicted_delta: int | None = None
    time_s: float | None = None
    error_type: ErrorType | None = None


class SweepOut(BaseModel):
    id: str
    created_at: datetime
    spec: dict[str, Any]
    grid: dict[str, list[Any]]
    n_points: int
    progress: dict[str, int] = Field(description="experiments by status")
    done: bool
    rows: list[SweepRow]


class CompareItem(BaseModel):
    id: str
    kind: str = Field(default="experiment", description="experiment or snapshot")
    status: Status
    label: str
    spec: dict[str, Any]
    figures: dict[str, float | int | None]
    shared_process_figures: list[str] = Field(
        default_factory=list,
        description="figures that depend on what ran earlier in the same shared process "
        "(host RSS after earlier experiments), not on this experiment alone",
    )


class CompareOut(BaseModel):
    items: list[CompareItem]
    differences: dict[str, list[float | int | None]] = Field(
        description="each figure's difference from the first experiment's"
    )
    environment: dict[str, list[Any]] = Field(description="environment keys whose values differ")
    environment_same: dict[str, Any]
    categories: dict[str, list[int | None]] = Field(
        default_factory=dict,
        description="bytes alive at the peak by inferred category (snapshots; null for an "
        "experiment, whose trace is not categorised)",
    )
    summary: list[str] = Field(
        default_factory=list,
        description="each item against the first, in words: its peak and the category "
        "that differs most",
    )
