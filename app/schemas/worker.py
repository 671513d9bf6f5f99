"""The worker protocol's messages, and what GET /v1/workers shows."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.schemas.experiment import ErrorType


class Gpu(BaseModel):
    index: int = Field(ge=0, le=63)
    name: str = Field(max_length=200)
    total_memory: int = Field(ge=0, le=2**50)


class Capabilities(BaseModel):
    model_config = ConfigDict(extra="allow")

    device_types: list[Literal["cpu", "cuda"]] = Field(min_length=1)
    gpus: list[Gpu] = Field(default_factory=list, max_length=64)
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None


class RegisterRequest(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    hostname: str = Field(default="", max_length=255)
    capabilities: Capabilities


class RegisterResponse(BaseModel):
    worker_id: str
    lease_seconds: float
    heartbeat_seconds: float


class ClaimRequest(BaseModel):
    worker_id: str = Field(max_length=36)
    wait_s: float = Field(default=20.0, ge=0, le=60)


class ClaimedExperiment(BaseModel):
    id: str
    attempt: int
    lease_token: str
    lease_expires_at: datetime
    spec: dict[str, Any] = Field(
        description="the validated spec, params filled, with its prediction and the "
        "service's byte cap (`memory_limit_bytes`), which the worker holds the run to"
    )


class LeaseRequest(BaseModel):
    lease_token: str = Field(max_length=64)


class HeartbeatRequest(LeaseRequest):
    progress: dict[str, Any] | None = None


class HeartbeatResponse(BaseModel):
    lease_expires_at: datetime
    cancel_requested: bool


class WorkerError(BaseModel):
    type: ErrorType
    message: str = Field(max_length=20_000)
    hint: str | None = Field(default=None, max_length=5_000)
    details: dict[str, Any] | None = None


class MemoryFigures(BaseModel):
    """The contract's byte counts: every succeeded result carries them as integers."""

    model_config = ConfigDict(extra="allow")

    allocated_before: int
    allocated_after: int
    allocated_peak: int
    reserved_before: int
    reserved_after: int
    reserved_peak: int
    delta_allocated: int
    host_rss_before: int
    host_rss_after: int


class ResultIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    memory: MemoryFigures


class OutcomeRequest(LeaseRequest):
    status: Literal["succeeded", "failed", "cancelled"]
    result: dict[str, Any] | None = None
    error: WorkerError | None = None
    trace_events: int = Field(default=0, ge=0, le=10**9)

    @model_validator(mode="after")
    def _consistent(self) -> "OutcomeRequest":
        if self.status == "succeeded":
            if self.result is None:
                raise ValueError("a succeeded outcome needs a result")
            ResultIn.model_validate(self.result)
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed outcome needs an error")
        return self


class WorkerOut(BaseModel):
    id: str
    name: str
    hostname: str
    capabilities: dict[str, Any]
    state: str
    live: bool
    current_experiment_id: str | None
    registered_at: datetime
    last_seen_at: datetime
