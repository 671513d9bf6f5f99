"""The worker protocol's messages, and what GET /v1/workers shows."""

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from app.core import data
from app.core.contract import Outcome
from app.core.data import TEXT_PATTERN, RequestBody
from vramlab import contract
from vramlab.contract import ReportVerdict, WorkerState

# What a real host can have: the largest GPUs hold under 2 TiB, hosts show at most 16.
MAX_GPU_MEMORY = 2**41
MAX_GPUS = 16
MAX_EXTRAS = 16
MAX_EXTRAS_BYTES = 4096
MAX_PROGRESS_KEYS = 16
MAX_PROGRESS_BYTES = 2048
Version = Annotated[str, StringConstraints(max_length=64, pattern=TEXT_PATTERN)]


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


class Gpu(BaseModel):
    index: int = Field(ge=0, lt=MAX_GPUS, strict=True)
    name: str = Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)
    total_memory: int = Field(ge=2**20, le=MAX_GPU_MEMORY, strict=True)


class Capabilities(BaseModel):
    """What a worker declares. Other keys (versions, flags) are kept as data, bounded."""

    model_config = ConfigDict(extra="allow")

    device_types: list[Literal["cpu", "cuda"]] = Field(min_length=1, max_length=2)
    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS)
    torch: Version | None = None
    cuda: Version | None = None
    driver: Version | None = None

    @model_validator(mode="after")
    def _plausible(self) -> "Capabilities":
        if len(set(self.device_types)) != len(self.device_types):
            raise ValueError("device_types lists a type twice")
        if len({g.index for g in self.gpus}) != len(self.gpus):
            raise ValueError("two GPUs share an index")
        if self.gpus and "cuda" not in self.device_types:
            raise ValueError("GPUs are listed but 'cuda' is not among device_types")
        extras = self.model_extra or {}
        if len(extras) > MAX_EXTRAS:
            raise ValueError(f"at most {MAX_EXTRAS} keys beyond the known ones")
        if (why := data.problem(extras)) is not None:
            raise ValueError(why)
        if any(len(k) > 64 for k in extras) or _json_size(extras) > MAX_EXTRAS_BYTES:
            raise ValueError(f"keys beyond the known ones take at most {MAX_EXTRAS_BYTES} bytes")
        return self


class RegisterRequest(RequestBody):
    name: str = Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)
    hostname: str = Field(default="", max_length=255, pattern=TEXT_PATTERN)
    capabilities: Capabilities
    # The worker's distribution's version; one older than the contract's
    # MIN_WORKER_VERSION is refused (400 worker_too_old). None: a worker from before
    # versioned registers, taken for this release only.
    version: str | None = Field(
        default=None,
        max_length=64,
        pattern=contract.VERSION_PATTERN,
        description=f"the worker's {contract.WORKER_DISTRIBUTION} version; older than "
        f"{contract.MIN_WORKER_VERSION} is refused (worker_too_old)",
    )


class WorkerLimits(BaseModel):
    """What this API accepts from a worker, so that it checks its outcome before sending."""

    max_body_bytes: int = contract.MAX_OUTCOME_BYTES
    max_trace_chunk_bytes: int = contract.MAX_TRACE_CHUNK_BYTES
    max_trace_chunk_events: int = contract.MAX_TRACE_CHUNK_EVENTS
    max_error_message_chars: int = contract.MAX_ERROR_MESSAGE_CHARS
    max_error_hint_chars: int = contract.MAX_ERROR_HINT_CHARS


class RegisterResponse(BaseModel):
    worker_id: str
    lease_seconds: float
    heartbeat_seconds: float
    limits: WorkerLimits = Field(default_factory=WorkerLimits)


class ClaimRequest(RequestBody):
    worker_id: str = Field(max_length=36)
    # Strict: a boolean is not a number of seconds (``false`` is a 422, not 0).
    wait_s: float = Field(default=20.0, ge=0, le=60, strict=True)


class ClaimsRequest(ClaimRequest):
    max: int = Field(
        default=1,
        ge=1,
        le=contract.MAX_CLAIM_BATCH,
        description="the most experiments to take at once (each with its own lease)",
    )


class StopRequest(RequestBody):
    worker_id: str = Field(max_length=36)


class ClaimedExperiment(BaseModel):
    id: str
    attempt: int
    lease_token: str
    lease_expires_at: datetime
    spec: dict[str, Any] = Field(
        description="the validated spec, params filled, with its prediction and the "
        "service's byte cap (`memory_limit_bytes`), which the worker holds the run to"
    )


class ClaimedBatch(BaseModel):
    """Experiments a claim took, in the claim order; empty when no work arrived in wait_s."""

    experiments: list[ClaimedExperiment]


class Lease(BaseModel):
    lease_token: str = Field(max_length=64)


class LeaseRequest(RequestBody, Lease):
    """The lease an experiment is released under."""


def _progress(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_PROGRESS_KEYS or _json_size(value) > MAX_PROGRESS_BYTES:
        raise ValueError(
            f"progress holds at most {MAX_PROGRESS_KEYS} keys in {MAX_PROGRESS_BYTES} bytes"
        )
    if any(isinstance(v, dict | list) for v in value.values()):
        raise ValueError("progress values are strings, numbers, booleans or null")
    return value


# A few flat figures that say how far a run is ({"state": "running", "repeat": 2}).
Progress = Annotated[dict[str, Any], data.AS_DATA, AfterValidator(_progress)]


class HeartbeatRequest(RequestBody, Lease):
    # Older workers send a constant here: still checked as bounded data, no longer kept.
    progress: Progress | None = None


class HeartbeatResponse(BaseModel):
    lease_expires_at: datetime
    cancel_requested: bool


class LeasedOutcome(Lease, Outcome):
    """The contract's outcome, with the lease it is reported under."""


class OutcomeRequest(RequestBody, LeasedOutcome):
    """One outcome, reported alone."""


class ReportItem(LeasedOutcome):
    """One outcome of a batch report: the experiment, its lease, the outcome (checked
    whole with the report), and a small trace with it where the worker has one."""

    experiment_id: str = Field(max_length=64, pattern=contract.EXPERIMENT_ID_PATTERN)
    trace_gz: str | None = Field(
        default=None,
        max_length=contract.MAX_INLINE_TRACE_CHARS,
        description=(
            "the whole trace as one gzip-compressed NDJSON chunk, base64: stored with the "
            "outcome (as chunk 0) in place of an upload, so that a small trace costs no "
            "call of its own; ``trace_events`` counts its events"
        ),
    )


class ReportBatchRequest(RequestBody):
    results: list[ReportItem] = Field(min_length=1, max_length=contract.MAX_REPORT_BATCH)


class ReportItemVerdict(BaseModel):
    experiment_id: str
    verdict: ReportVerdict
    # The experiment's status once stored; the reason when not.
    status: str | None = None
    error: str | None = None


class ReportBatchResponse(BaseModel):
    """One verdict per outcome, in the order they were sent."""

    results: list[ReportItemVerdict]


class WorkerOut(BaseModel):
    id: str
    name: str
    hostname: str
    capabilities: dict[str, Any]
    state: WorkerState
    live: bool
    current_experiment_id: str | None
    registered_at: datetime
    last_seen_at: datetime
