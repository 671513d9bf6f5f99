"""What the API says about an experiment."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.core.contract import ErrorInfo, Prediction, Result, SnapshotResult
from app.experiments.spec_schemas import ExperimentSpec
from vramlab.contract import Status


class ExperimentError(ErrorInfo):
    """Why the experiment failed: ``type`` is stable for programs to act on."""


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
    status_line: str = Field(
        description="the status as a person reads it: the status, a failure's type, or for a "
        "preset whose answer is a refusal that failed as expected, 'answered: <the refusal> "
        "(expected)' (status stays failed)",
    )
    expected_refusal: str | None = Field(
        default=None,
        description="set when the experiment failed with the refusal its preset expects: "
        "that refusal is the preset's answer (e.g. 'autograd refuses this')",
    )
    preset_notes: list[str] = Field(
        default_factory=list,
        description="notes on how this run answers its preset's question (e.g. a GPU "
        "question that ran without a GPU)",
    )
    spec: ExperimentSpec
    attempts: int
    worker_id: str | None
    submitted_by: str | None = Field(default=None, description="the submitting token's id")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool = False
    queue: QueueInfo | None = None
    prediction: Prediction | None = Field(
        default=None,
        description="bytes predicted by the catalog (a prediction); null for a snapshot",
    )
    preset: str | None = Field(default=None, description="the preset it was queued from")
    result: Result | SnapshotResult | None = Field(
        default=None,
        description="what was measured; result.memory holds integer byte counts (a snapshot's "
        "figures are replayed from its trace, with no host RSS)",
    )
    error: ExperimentError | None = None


class ExperimentPage(BaseModel):
    items: list[ExperimentOut]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null at the end"
    )
