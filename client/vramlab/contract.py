"""The API↔worker contract: the names (:mod:`vramlab.names`, re-exported here) and the
shapes of what a worker reports and the API returns.

Plain dataclasses (the standard library alone), so the contract imports wherever vramlab's
client is installed. A field's ``metadata`` holds its bounds and its key on the wire
(``ge``, ``le``, ``max_length``, ``alias``, ``description``, as pydantic's ``Field``
spells them). The API validates with pydantic models built from these classes in one
place (app/core/contract.py); the worker checks what it sends with :mod:`vramlab.wire`.
Every field that exists is declared (unknown keys are refused), so a new figure is added
here first, and a generated client sees typed results.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, TypeVar, dataclass_transform

from vramlab import wire
from vramlab.names import (
    ALLOCATOR_KEYS,
    CATEGORY_KEYS,
    CLAIM_BATCH_PATH,
    EXPERIMENT_ID_PATTERN,
    FINISHED,
    FIT_VARIES,
    KEEPS_RESULT,
    MAX_CLAIM_BATCH,
    MAX_ERROR_HINT_CHARS,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_INLINE_TRACE_CHARS,
    MAX_OUTCOME_BYTES,
    MAX_REPORT_BATCH,
    MAX_TRACE_CHUNK_BYTES,
    MAX_TRACE_CHUNK_EVENTS,
    MAX_TRACE_EVENTS,
    MEMORY_KEYS,
    MEMORY_VIZ_ACTIONS,
    MIN_WORKER_VERSION,
    REPORT_BATCH_PATH,
    SHARED_PROCESS_FIGURES,
    TRACE_ACTIONS,
    TRACE_CHUNK_EXPANSION,
    VERSION_PATTERN,
    WORKER_DISTRIBUTION,
    Category,
    ChildStart,
    ErrorType,
    Figure,
    FitStatus,
    Isolation,
    ReportVerdict,
    Status,
    TraceAction,
    WorkerState,
    version_key,
)

__all__ = [
    "ALLOCATOR_KEYS",
    "CATEGORY_KEYS",
    "CLAIM_BATCH_PATH",
    "EXPERIMENT_ID_PATTERN",
    "FINISHED",
    "FIT_VARIES",
    "KEEPS_RESULT",
    "MAX_CLAIM_BATCH",
    "MAX_ERROR_HINT_CHARS",
    "MAX_ERROR_MESSAGE_CHARS",
    "MAX_INLINE_TRACE_CHARS",
    "MAX_OUTCOME_BYTES",
    "MAX_REPORT_BATCH",
    "MAX_TRACE_CHUNK_BYTES",
    "MAX_TRACE_CHUNK_EVENTS",
    "MAX_TRACE_EVENTS",
    "MEMORY_KEYS",
    "MEMORY_VIZ_ACTIONS",
    "MIN_WORKER_VERSION",
    "REPORT_BATCH_PATH",
    "SHARED_PROCESS_FIGURES",
    "TRACE_ACTIONS",
    "TRACE_CHUNK_EXPANSION",
    "VERSION_PATTERN",
    "WORKER_DISTRIBUTION",
    "Categories",
    "Category",
    "ChildStart",
    "Copy",
    "Environment",
    "ErrorInfo",
    "ErrorType",
    "Figure",
    "FitStatus",
    "HeldTensor",
    "Isolation",
    "MemoryFigures",
    "ModelFigures",
    "ModelStep",
    "MoreTensors",
    "Outcome",
    "Phase",
    "PhasePeak",
    "Placement",
    "Prediction",
    "RankFigures",
    "RankPrediction",
    "ReportVerdict",
    "Result",
    "SectionFigures",
    "SnapshotFigures",
    "SnapshotResult",
    "Status",
    "Step",
    "StepPrediction",
    "TensorInfo",
    "TensorPrediction",
    "Timing",
    "TraceAction",
    "TraceSummary",
    "WorkerState",
    "version_key",
]


T = TypeVar("T")


@dataclass_transform(kw_only_default=True, field_specifiers=(dataclasses.field, field))
def contract_type(cls: type[T]) -> type[T]:
    """A class of the contract: a frozen-free, keyword-only dataclass whose unknown keys
    are refused (``CONTRACT_TYPES`` lists them, in an order where each comes after the
    classes its fields hold)."""
    doc = cls.__doc__  # a class without one keeps none (not the signature dataclass writes)
    made = dataclasses.dataclass(kw_only=True)(cls)
    made.__doc__ = doc
    CONTRACT_TYPES.append(made)
    return made


CONTRACT_TYPES: list[type] = []


@contract_type
class SectionFigures:
    """One named section of an op (forward, backward, optimizer_step): allocated bytes at
    its start and end, and its own peak."""

    allocated_start: int
    allocated_end: int
    allocated_peak: int


@contract_type
class _AllocatorFigures:
    allocated_before: int
    allocated_after: int
    allocated_peak: int
    reserved_before: int
    reserved_after: int
    reserved_peak: int
    delta_allocated: int


@contract_type
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


@contract_type
class Phase:
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


@contract_type
class Timing:
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


@contract_type
class Environment:
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
    experiments_before: int | None = field(default=None, metadata={"ge": 0})


@contract_type
class Categories:
    """Bytes held at a peak, by category (allocated bytes, the caching allocator's view)."""

    parameters: int = field(default=0, metadata={"ge": 0})
    gradients: int = field(default=0, metadata={"ge": 0})
    optimizer_state: int = field(default=0, metadata={"ge": 0})
    activations: int = field(default=0, metadata={"ge": 0})
    temporaries: int = field(default=0, metadata={"ge": 0})
    other: int = field(default=0, metadata={"ge": 0})
    unknown: int = field(default=0, metadata={"ge": 0})


@contract_type
class PhasePeak:
    """One phase of a model step (forward, backward, optimizer): its own peaks."""

    name: str
    peak_allocated: int = field(metadata={"ge": 0})
    peak_reserved: int = field(metadata={"ge": 0})
    allocated_end: int | None = field(default=None, metadata={"ge": 0})
    wall_s: float | None = None


@contract_type
class ModelStep:
    """One step of a model experiment (a training step, a forward pass, a generation)."""

    step: int = field(metadata={"ge": 1})
    peak_allocated: int = field(metadata={"ge": 0})
    peak_reserved: int = field(metadata={"ge": 0})
    phases: list[PhasePeak] = field(default_factory=list)
    wall_s: float | None = None


@contract_type
class RankFigures:
    """One rank of a distributed model experiment (its own process and GPU): its reported
    step's peaks, what its objects hold (a sharded parameter's local shard) and what held
    memory at its peak."""

    rank: int = field(metadata={"ge": 0})
    device: str
    peak_allocated: int = field(metadata={"ge": 0})
    peak_reserved: int = field(metadata={"ge": 0})
    parameter_bytes: int | None = field(default=None, metadata={"ge": 0})
    gradient_bytes: int | None = field(default=None, metadata={"ge": 0})
    optimizer_state_bytes: int | None = field(default=None, metadata={"ge": 0})
    # DDP's gradient buckets (beside the gradients; in categories' gradients).
    bucket_bytes: int | None = field(default=None, metadata={"ge": 0})
    categories: Categories | None = None
    steps: list[ModelStep] = field(default_factory=list)


@contract_type
class RankPrediction:
    """One rank's predicted peak and what holds it (ranks on equal batches are alike)."""

    rank: int = field(metadata={"ge": 0})
    peak_allocated: int = field(metadata={"ge": 0})
    peak_reserved: int = field(metadata={"ge": 0})
    categories: Categories | None = None


@contract_type
class ModelFigures:
    """What a model experiment measured beyond the memory figures: the model, each step,
    the reported step's peaks (step 2 of a training run: optimizer state exists) and speed."""

    model: str
    model_type: str
    task: Literal["train", "inference", "generate"]
    parameter_count: int = field(metadata={"ge": 0})
    # What the model's objects hold after the reported step (storages, allocator-rounded on
    # CUDA): its parameters, its gradients and its optimizer's state on the device.
    parameter_bytes: int | None = field(default=None, metadata={"ge": 0})
    gradient_bytes: int | None = field(default=None, metadata={"ge": 0})
    optimizer_state_bytes: int | None = field(default=None, metadata={"ge": 0})
    # What the optimizer trains (all parameters, or LoRA's adapters and modules_to_save),
    # by name (a repeated block's index as ``*``), and paged optimizer state: in CUDA
    # managed memory, which the allocator's figures above do not count.
    trainable_parameter_count: int | None = field(default=None, metadata={"ge": 0})
    trainable_parameters: list[str] | None = None
    paged_optimizer_state_bytes: int | None = field(default=None, metadata={"ge": 0})
    reported_step: int = field(metadata={"ge": 1})
    peak_allocated: int = field(metadata={"ge": 0})
    peak_reserved: int = field(metadata={"ge": 0})
    steps: list[ModelStep] = field(default_factory=list)
    time_per_step_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    # A distributed run (params.distributed): its plan, and each rank's figures; the
    # peaks above are the highest rank's (the one reported), batch_size per GPU.
    distributed: dict[str, Any] | None = None
    ranks: list[RankFigures] | None = None


@contract_type
class TensorPrediction:
    name: str
    shape: list[int]
    dtype: str
    device: str
    bytes: int


@contract_type
class StepPrediction:
    label: str
    allocated_after: int
    host_tensor_bytes: int | None = None


@contract_type
class Prediction:
    """Bytes the catalog predicts (a prediction, not a measurement)."""

    label: Literal["prediction"] = "prediction"
    device: str
    allocated_before: int
    delta_allocated: int
    allocated_after: int
    host_tensor_bytes: int
    inputs: list[TensorPrediction] = field(default_factory=list)
    outputs: list[TensorPrediction] = field(default_factory=list)
    rounding: str
    devices: list[str] = field(default_factory=list)
    exact: bool
    caveats: list[str] = field(default_factory=list)
    # A scenario's: the most its named tensors hold at once, and each top-level step.
    peak_named_bytes: int | None = None
    steps: list[StepPrediction] | None = None
    # A model experiment's: the predicted peak of its reported step, and what holds it.
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    categories: Categories | None = None
    # ...and the device those figures are for ("cuda (H100-class)", "cpu"): a spec that
    # named no device on a service of CPU workers is predicted for CUDA, and runs on the CPU.
    predicted_for: str | None = None
    # A distributed spec's: each rank's (the peaks above are any rank's: they are alike).
    ranks: list[RankPrediction] | None = None


@contract_type
class TensorInfo:
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


@contract_type
class TraceSummary:
    source: Literal["cuda_memory_history", "cpu_profiler", "none"]
    events: int
    truncated: bool


@contract_type
class Copy:
    """Copies between two devices that one aten op made, summed."""

    op: str
    from_: str = field(metadata={"alias": "from"})
    to: str
    calls: int
    bytes: int


@contract_type
class HeldTensor:
    """One tensor a scenario's name held at its end."""

    shape: list[int]
    dtype: str
    device: str
    bytes: int
    pinned: bool


@contract_type
class MoreTensors:
    """How many more tensors a name held beyond those listed."""

    more: int


@contract_type
class Placement:
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


@contract_type
class ErrorInfo:
    """A failure: a type that a program can act on, a message, maybe a hint and details."""

    type: ErrorType
    message: str = field(metadata={"max_length": MAX_ERROR_MESSAGE_CHARS})
    hint: str | None = field(default=None, metadata={"max_length": MAX_ERROR_HINT_CHARS})
    details: dict[str, Any] | None = None


@contract_type
class Step(Phase):
    """A scenario's step: its phase's figures, its prediction, its error if it failed."""

    do: str
    error: ErrorInfo | None = None
    predicted_allocated_after: int | None = None


@contract_type
class Result:
    """What a worker measured for one experiment (succeeded, or failed with figures)."""

    memory: MemoryFigures
    phases: list[Phase] = field(default_factory=list)
    timing: Timing | None = None
    environment: Environment | None = None
    prediction: Prediction | None = None
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
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


@contract_type
class SnapshotFigures(_AllocatorFigures):
    """An imported snapshot's figures, replayed from its trace: no host RSS was recorded."""

    host_rss_before: None = None
    host_rss_after: None = None


@contract_type
class SnapshotResult:
    """What the API stores for an imported memory snapshot (not a worker's report)."""

    memory: SnapshotFigures
    environment: dict[str, Any] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(
        metadata={
            "description": "the import's summary: peak, blocks alive at it, categories, segments "
            "(GET /v1/snapshots/{id} types it)"
        }
    )


@contract_type
class Outcome:
    """What a worker reports when an experiment ends."""

    status: Literal[Status.SUCCEEDED, Status.FAILED, Status.CANCELLED]
    result: Result | None = None
    error: ErrorInfo | None = None
    trace_events: int = field(default=0, metadata={"ge": 0, "le": MAX_TRACE_EVENTS})

    def __post_init__(self) -> None:
        consistent(self)

    def wire(self) -> dict[str, Any]:
        """The outcome as JSON-ready data, keys as the contract spells them."""
        data: dict[str, Any] = wire.dump(self)
        return data


def consistent(outcome: Any) -> None:
    """What an outcome's status needs beside it (a result, an error); ValueError if not.
    The API's pydantic model runs the same check."""
    if outcome.status == Status.SUCCEEDED and outcome.result is None:
        raise ValueError("a succeeded outcome needs a result")
    if outcome.status == Status.FAILED and outcome.error is None:
        raise ValueError("a failed outcome needs an error")


# One spelling of the allocator's figures: the names and the model agree.
assert tuple(f.name for f in dataclasses.fields(_AllocatorFigures)) == ALLOCATOR_KEYS

# The checks the API's models add to these classes (app/core/contract.py).
VALIDATORS: dict[type, Callable[[Any], None]] = {Outcome: consistent}
