"""What the API says about an experiment."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.schemas.spec import ExperimentSpec

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
ErrorType = Literal[
    "invalid_spec",
    "unsupported_on_device",
    "device_mismatch",
    "autograd_error",
    "oom",
    "memory_limit",
    "crashed",
    "timeout",
    "lost",
    "internal",
]


class ExperimentError(BaseModel):
    type: ErrorType
    message: str
    hint: str | None = None
    details: dict[str, Any] | None = None


class QueueInfo(BaseModel):
    """While queued: can any live worker run this, and if not, why."""

    runnable: bool
    live_workers: int
    reason: str | None = None


class ExperimentOut(BaseModel):
    id: str
    kind: Literal["experiment", "snapshot"] = Field(
        default="experiment", description="a queued experiment, or an imported memory snapshot"
    )
    name: str | None = Field(default=None, description="a snapshot's name")
    status: Status
    spec: ExperimentSpec
    attempts: int
    worker_id: str | None
    submitted_by: str | None = Field(default=None, description="the submitting token's id")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool = False
    progress: dict[str, Any] | None = None
    queue: QueueInfo | None = None
    prediction: dict[str, Any] = Field(description="bytes predicted by the catalog (a prediction)")
    preset: str | None = Field(default=None, description="the preset it was queued from")
    result: dict[str, Any] | None = Field(
        default=None, description="what was measured; result.memory holds integer byte counts"
    )
    error: ExperimentError | None = None


class ExperimentPage(BaseModel):
    items: list[ExperimentOut]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null at the end"
    )
