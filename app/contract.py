"""The API↔worker contract: the one place that spells each status, error type and figure.

Torch-free and web-free (pydantic only): the API (schemas, services, pages, CLI) and the
worker (loop, runner, result builder) both import it. The enums are ``StrEnum``s, so a
value is its own string on the wire and in the database. The models describe what the
worker really produces; every field that exists is declared (``extra="forbid"``), so a
new figure is added here first, and a generated client sees typed results.
"""

from enum import StrEnum
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Status(StrEnum):
    """Where an experiment is: ``queued`` → ``running`` → one of the three ends."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})


class WorkerState(StrEnum):
    """What a registered worker is doing; ``stopped`` once it said it exits."""

    IDLE = "idle"
    BUSY = "busy"
    STOPPED = "stopped"


class Isolation(StrEnum):
    """How an experiment's process is kept apart from others' (a spec's ``isolation``).

    ``clean``: a process of its own, forked for it (or a warm spare), gone after it.
    ``shared``: a long-lived process of the worker's that runs many experiments, emptied
    and checked before each one; it needs no allocator settings of its own.
    """

    CLEAN = "clean"
    SHARED = "shared"


class FitStatus(StrEnum):
    """Where a fit search is (``GET /v1/fits/{id}``): ``queued`` until its first step,
    ``running`` while predicting or measuring, then one of the three ends."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (FitStatus.SUCCEEDED, FitStatus.FAILED, FitStatus.CANCELLED)


# The params a fit search may vary (``POST /v1/fits``'s ``vary``).
FIT_VARIES = ("batch_size", "seq_len")


# How the process that ran an experiment started: a warm spare (CUDA started before the
# spec came), forked for the spec, a fresh interpreter (to change the allocator backend),
# or ``shared``: a shared process that had already run other experiments.
ChildStart = Literal["warm_spare", "forked", "fresh_interpreter", "shared"]


class ErrorType(StrEnum):
    """Why an experiment failed, stable for programs to act on."""

    INVALID_SPEC = "invalid_spec"
    UNSUPPORTED_ON_DEVICE = "unsupported_on_device"
    DEVICE_MISMATCH = "device_mismatch"
    AUTOGRAD_ERROR = "autograd_error"
    OOM = "oom"
    # The run passed the service's byte cap (VRAMLAB_MAX_EXPERIMENT_BYTES) and was stopped.
    MEMORY_LIMIT = "memory_limit"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    LOST = "lost"
    # The worker could not report what it ran (its outcome broke the API's limits).
    REPORT_REFUSED = "report_refused"
    INTERNAL = "internal"


# Failures whose figures are a result worth keeping (the others carry only the error).
KEEPS_RESULT = frozenset(
    {ErrorType.OOM, ErrorType.MEMORY_LIMIT, ErrorType.DEVICE_MISMATCH, ErrorType.AUTOGRAD_ERROR}
)

# -- limits the API enforces on an outcome (the worker checks them before sending) -------
MAX_ERROR_MESSAGE_CHARS = 20_000
MAX_ERROR_HINT_CHARS = 5_000
MAX_TRACE_EVENTS = 10**9
# The API's default request body limit (VRAMLAB_MAX_BODY_BYTES): an outcome's JSON.
MAX_OUTCOME_BYTES = 1 * 2**20
# Trace uploads (defaults of VRAMLAB_MAX_TRACE_CHUNK_BYTES and _EVENTS): one gzip chunk,
# its events, and how far its text may expand past its byte limit.
MAX_TRACE_CHUNK_BYTES = 32 * 2**20
MAX_TRACE_CHUNK_EVENTS = 100_000
TRACE_CHUNK_EXPANSION = 8


# -- batches of the worker protocol ----------------------------------------------------
# A worker may take several experiments in one claim and report several outcomes in one
# request: each experiment keeps its own lease and is checked on its own (exactly once,
# by the token whose worker claimed it); an item refused changes nothing.
# An experiment's id as the API hands it out (a lower-case UUID); what a worker's
# outcome names must look like one.
EXPERIMENT_ID_PATTERN = r"^[0-9a-f][0-9a-f-]{0,63}$"
CLAIM_BATCH_PATH = "/v1/worker/claims"
REPORT_BATCH_PATH = "/v1/worker/results"
# The most experiments one claim takes (its ``max``) and outcomes one report carries
# (the whole report also fits the API's body limit, ``max_body_bytes``).
MAX_CLAIM_BATCH = 64
MAX_REPORT_BATCH = 64


class ReportVerdict(StrEnum):
    """What became of one outcome of a batch report."""

    STORED = "stored"
    # The lease no longer owns the experiment (expired and re-claimed, or ended): drop it.
    LEASE_LOST = "lease_lost"
    # Refused for good (another token's worker claimed it, or the outcome does not hold
    # up, such as trace events that were never uploaded): the error says why.
    REFUSED = "refused"


class Figure(StrEnum):
    """The names of the v1 memory figures (``result.memory``'s keys), for code that
    reads them out of plain data (comparisons, counters, sweep rows)."""

    ALLOCATED_BEFORE = "allocated_before"
    ALLOCATED_AFTER = "allocated_after"
    ALLOCATED_PEAK = "allocated_peak"
    RESERVED_BEFORE = "reserved_before"
    RESERVED_AFTER = "reserved_after"
    RESERVED_PEAK = "reserved_peak"
    DELTA_ALLOCATED = "delta_allocated"
    HOST_RSS_BEFORE = "host_rss_before"
    HOST_RSS_AFTER = "host_rss_after"


# The actions of PyTorch's memory snapshot format (``device_traces`` entries), which the
# memory_viz export writes and the snapshot import reads.
MEMORY_VIZ_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)

# The actions of vramlab's trace events: the snapshot format's, a completed free written
# ``free``, and ``mark`` (a phase boundary). ``?action=`` filters take these alone.
TraceAction = Literal[
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "free",
    "mark",
]
TRACE_ACTIONS: tuple[str, ...] = get_args(TraceAction)

# The v1 memory keys: integer byte counts in every succeeded result's ``memory``.
MEMORY_KEYS = tuple(str(f) for f in Figure)

# Shared-process figures: in a shared process that ran experiments before this one, host
# RSS (before, after, and so the change between them) starts from what those left, so it
# depends on the process's history, not on this experiment alone. The allocator's
# figures do not: the process empties and resets the allocator before each experiment.
SHARED_PROCESS_FIGURES = (Figure.HOST_RSS_BEFORE, Figure.HOST_RSS_AFTER)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SectionFigures(_Model):
    """One named section of an op (forward, backward, optimizer_step): allocated bytes at
    its start and end, and its own peak."""

    allocated_start: int
    allocated_end: int
    allocated_peak: int


class _AllocatorFigures(_Model):
    allocated_before: int
    allocated_after: int
    allocated_peak: int
    reserved_before: int
    reserved_after: int
    reserved_peak: int
    delta_allocated: int


# The figures the caching allocator gives (no host or device-level ones): what must agree
# between two runs of one spec, wherever they ran.
ALLOCATOR_KEYS = tuple(_AllocatorFigures.model_fields)


class MemoryFigures(_AllocatorFigures):
    """The op's figures (for a scenario: from its first step to its last), in bytes.

    ``allocated_*`` and ``reserved_*`` come from the caching allocator on CUDA and from
    the profiler's memory events on the CPU; ``host_rss_*`` from the OS. The extras are
    the device as the driver sees it (other processes and the CUDA context included) and
    PyTorch's pinned host allocator; they are null where they do not apply.
    """

    host_rss_before: int
    host_rss_after: int
    device_used_before: int | None = None
    device_used_after: int | None = None
    pinned_host_before: int | None = None
    pinned_host_after: int | None = None


class Phase(_Model):
    """One measured phase (set-up, op, after, or a scenario's step)."""

    name: str
    allocated_start: int | None = None
    allocated_end: int | None = None
    allocated_peak: int | None = None
    reserved_start: int | None = None
    reserved_end: int | None = None
    reserved_peak: int | None = None
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    host_rss_start: int | None = None
    host_rss_end: int | None = None
    device_used_start: int | None = None
    device_used_end: int | None = None
    pinned_host_start: int | None = None
    pinned_host_end: int | None = None
    wall_s: float | None = None


class Timing(_Model):
    """Time of the op: CUDA events or perf_counter over ``repeat`` calls after ``warmup``.

    A scenario has only its method and the steps' wall time.
    """

    method: Literal["cuda_events", "perf_counter"]
    median_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    repeats_s: list[float] | None = None
    warmup: int | None = None
    repeat: int | None = None
    bytes_per_s: float | None = None
    wall_s: float | None = None


class Environment(_Model):
    """Where it ran: versions, host, GPU, allocator settings."""

    torch: str | None = None
    cuda: str | None = None
    cudnn: int | None = None
    hostname: str | None = None
    python: str | None = None
    platform: str | None = None
    gpu_name: str | None = None
    gpu_total_memory: int | None = None
    driver: str | None = None
    allocator_conf: str | None = None
    device: str | None = None
    # Set by the worker's runner: how many experiments shared this device at once, and how
    # this one's process started (ChildStart).
    concurrent: int | None = None
    child_start: ChildStart | None = None
    # The process's isolation, and in a shared process how many experiments it had run
    # before this one (0: its first; null for a clean process).
    isolation: Isolation | None = None
    experiments_before: int | None = Field(default=None, ge=0)


class Category(StrEnum):
    """What a block of memory held at a peak: the one vocabulary of model experiments,
    recordings and imported snapshots (``unknown``: the evidence does not decide; never a
    confident wrong category)."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    # Temporaries of an op and library workspaces (cuBLAS/cuDNN handles' workspaces).
    TEMPORARIES = "temporaries"
    OTHER = "other"
    UNKNOWN = "unknown"


CATEGORY_KEYS = tuple(str(c) for c in Category)


class Categories(_Model):
    """Bytes held at a peak, by category (allocated bytes, the caching allocator's view)."""

    parameters: int = Field(default=0, ge=0)
    gradients: int = Field(default=0, ge=0)
    optimizer_state: int = Field(default=0, ge=0)
    activations: int = Field(default=0, ge=0)
    temporaries: int = Field(default=0, ge=0)
    other: int = Field(default=0, ge=0)
    unknown: int = Field(default=0, ge=0)


class PhasePeak(_Model):
    """One phase of a model step (forward, backward, optimizer): its own peaks."""

    name: str
    peak_allocated: int = Field(ge=0)
    peak_reserved: int = Field(ge=0)
    allocated_end: int | None = Field(default=None, ge=0)
    wall_s: float | None = None


class ModelStep(_Model):
    """One step of a model experiment (a training step, a forward pass, a generation)."""

    step: int = Field(ge=1)
    peak_allocated: int = Field(ge=0)
    peak_reserved: int = Field(ge=0)
    phases: list[PhasePeak] = Field(default_factory=list)
    wall_s: float | None = None


class ModelFigures(_Model):
    """What a model experiment measured beyond the memory figures: the model, each step,
    the reported step's peaks (step 2 of a training run: optimizer state exists) and speed."""

    model: str
    model_type: str
    task: Literal["train", "inference", "generate"]
    parameter_count: int = Field(ge=0)
    # What the model's objects hold after the reported step (storages, allocator-rounded on
    # CUDA): its parameters, its gradients and its optimizer's state on the device.
    parameter_bytes: int | None = Field(default=None, ge=0)
    gradient_bytes: int | None = Field(default=None, ge=0)
    optimizer_state_bytes: int | None = Field(default=None, ge=0)
    reported_step: int = Field(ge=1)
    peak_allocated: int = Field(ge=0)
    peak_reserved: int = Field(ge=0)
    steps: list[ModelStep] = Field(default_factory=list)
    time_per_step_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


class TensorPrediction(_Model):
    name: str
    shape: list[int]
    dtype: str
    device: str
    bytes: int


class StepPrediction(_Model):
    label: str
    allocated_after: int
    host_tensor_bytes: int | None = None


class Prediction(_Model):
    """Bytes the catalog predicts (a prediction, not a measurement)."""

    label: Literal["prediction"] = "prediction"
    device: str
    allocated_before: int
    delta_allocated: int
    allocated_after: int
    host_tensor_bytes: int
    inputs: list[TensorPrediction] = Field(default_factory=list)
    outputs: list[TensorPrediction] = Field(default_factory=list)
    rounding: str
    devices: list[str] = Field(default_factory=list)
    exact: bool
    caveats: list[str] = Field(default_factory=list)
    # A scenario's: the most its named tensors hold at once, and each top-level step.
    peak_named_bytes: int | None = None
    steps: list[StepPrediction] | None = None
    # A model experiment's: the predicted peak of its reported step, and what holds it.
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    categories: Categories | None = None


class TensorInfo(_Model):
    """A tensor the op took or returned, as measured."""

    name: str
    shape: list[int]
    dtype: str
    device: str
    bytes: int
    # A view's storage may be far larger than the view: it keeps its whole base alive.
    storage_bytes: int
    layout: Literal["strided", "channels_last", "sparse_coo"]
    is_contiguous: bool | None
    is_view_of_input: bool


class TraceSummary(_Model):
    source: Literal["cuda_memory_history", "cpu_profiler", "none"]
    events: int
    truncated: bool


class Copy(_Model):
    """Copies between two devices that one aten op made, summed."""

    op: str
    from_: str = Field(alias="from")
    to: str
    calls: int
    bytes: int


class HeldTensor(_Model):
    """One tensor a scenario's name held at its end."""

    shape: list[int]
    dtype: str
    device: str
    bytes: int
    pinned: bool


class MoreTensors(_Model):
    """How many more tensors a name held beyond those listed."""

    more: int


class Placement(_Model):
    """Where tensors live, and the copies between devices that the op (or scenario) made."""

    inputs: dict[str, str] | None = None
    outputs: dict[str, str] | None = None
    parameters: dict[str, str] | None = None
    parameter_devices: list[str] | None = None
    tensors: dict[str, list[HeldTensor | MoreTensors]] | None = None
    host_device_copies: list[Copy] | None = None
    device_device_copies: list[Copy] | None = None
    mixed_device_calls: dict[str, list[str]] | None = None
    cpu_ops_in_cuda_experiment: dict[str, int] | None = None
    # CPU calls on 0-dim tensors alone: scalar state PyTorch keeps on the host by design.
    host_scalar_ops: dict[str, int] | None = None
    method: str | None = None


class ErrorInfo(_Model):
    """A failure: a type that a program can act on, a message, maybe a hint and details."""

    type: ErrorType
    message: str = Field(max_length=MAX_ERROR_MESSAGE_CHARS)
    hint: str | None = Field(default=None, max_length=MAX_ERROR_HINT_CHARS)
    details: dict[str, Any] | None = None


class Step(Phase):
    """A scenario's step: its phase's figures, its prediction, its error if it failed."""

    do: str
    error: ErrorInfo | None = None
    predicted_allocated_after: int | None = None


class Result(_Model):
    """What a worker measured for one experiment (succeeded, or failed with figures)."""

    memory: MemoryFigures
    phases: list[Phase] = Field(default_factory=list)
    timing: Timing | None = None
    environment: Environment | None = None
    prediction: Prediction | None = None
    inputs: list[TensorInfo] = Field(default_factory=list)
    outputs: list[TensorInfo] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    trace: TraceSummary | None = None
    placement: Placement | None = None
    # What the op itself reported (modules, autograd, sections, dtype support): op-specific.
    details: dict[str, Any] | None = None
    steps: list[Step] | None = None
    # A model experiment's: what held memory at the reported step's peak, and its figures.
    categories: Categories | None = None
    model: ModelFigures | None = None

    def shared_process_figures(self) -> tuple[str, ...]:
        """The figures of ``memory`` that depend on what ran earlier in the process
        (``SHARED_PROCESS_FIGURES``, in a shared process that had run experiments before
        this one); none for a clean process or a shared process's first experiment."""
        env = self.environment
        if env is None or env.isolation != Isolation.SHARED or not env.experiments_before:
            return ()
        return tuple(str(f) for f in SHARED_PROCESS_FIGURES)


class SnapshotFigures(_AllocatorFigures):
    """An imported snapshot's figures, replayed from its trace: no host RSS was recorded."""

    host_rss_before: None = None
    host_rss_after: None = None


class SnapshotResult(_Model):
    """What the API stores for an imported memory snapshot (not a worker's report)."""

    memory: SnapshotFigures
    environment: dict[str, Any] = Field(default_factory=dict)
    snapshot: dict[str, Any] = Field(
        description="the import's summary: peak, blocks alive at it, categories, segments "
        "(GET /v1/snapshots/{id} types it)"
    )


class Outcome(_Model):
    """What a worker reports when an experiment ends."""

    status: Literal[Status.SUCCEEDED, Status.FAILED, Status.CANCELLED]
    result: Result | None = None
    error: ErrorInfo | None = None
    trace_events: int = Field(default=0, ge=0, le=MAX_TRACE_EVENTS)

    @model_validator(mode="after")
    def _consistent(self) -> "Outcome":
        if self.status == Status.SUCCEEDED and self.result is None:
            raise ValueError("a succeeded outcome needs a result")
        if self.status == Status.FAILED and self.error is None:
            raise ValueError("a failed outcome needs an error")
        return self

    def wire(self) -> dict[str, Any]:
        """The outcome as JSON-ready data, keys as the contract spells them."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
