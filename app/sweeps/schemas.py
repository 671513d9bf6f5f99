"""A sweep as it is asked for and as it reads: its grid, its rows (the CSV's columns)."""

from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field

from app.core.data import AS_DATA, DataDict, RequestBody
from vramlab.contract import ErrorType, Status


class SweepIn(RequestBody):
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
    rows: list[SweepRow] = Field(description="the points from ``offset``, at most ``limit``")
    next_offset: int | None = Field(
        default=None, description="where the next page of rows starts; null after the last"
    )


class SweepProgress(BaseModel):
    """How far a sweep has got: one row's read, whatever the sweep's size."""

    id: str
    n_points: int
    progress: dict[str, int] = Field(description="experiments by status")
    finished: int = Field(description="points that succeeded, failed or were cancelled")
    done: bool
    version: str = Field(
        description="changes whenever ``progress`` does: pass it back as ``seen`` to wait "
        "for the next change"
    )
