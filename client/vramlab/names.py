"""The names of the API↔worker contract: each status, error type, figure, path and limit,
spelled once. Standard library only, so the client (httpx alone) imports it as the server
and the worker do; :mod:`vramlab.contract` adds the shapes of the bodies (dataclasses) and
re-exports every name here. The enums are ``StrEnum``s: a value is its own string on the
wire and in the database.
"""

from enum import StrEnum
from typing import Literal, get_args


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
# spec came), a warm model child (a warm spare that had also imported what a model's
# trial imports), forked for the spec, a fresh interpreter (to change the allocator
# backend), or ``shared``: a shared process that had already run other experiments.
ChildStart = Literal["warm_spare", "warm_model", "forked", "fresh_interpreter", "shared"]


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
# A trace this small (its gzip chunk, base64) may travel inside its outcome in a batch
# report instead of being uploaded on its own: a tiny experiment's trace costs no call.
MAX_INLINE_TRACE_CHARS = 64 * 2**10

# -- the worker's version at register ---------------------------------------------------
# A worker says its distribution's version when it registers (``version``); the API
# refuses one older than MIN_WORKER_VERSION (400 ``worker_too_old``, naming both versions
# and what to install). A worker that says none predates versioned registers (vramlab
# 0.1.0): this release still takes it, the next refuses it.
WORKER_DISTRIBUTION = "vramlab-worker"
MIN_WORKER_VERSION = "0.1.0"
# A release's number, then perhaps a pre-release or local tag: 0.1.0, 0.2.0rc1, 1.0+cu126.
VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)*[0-9A-Za-z.+-]*$"


def version_key(version: str) -> tuple[int, ...]:
    """A version's release numbers, comparable: ``0.10.0`` after ``0.9.2``, ``0.1`` equal
    to ``0.1.0``; a tag after the numbers (``rc1``, ``+cu126``) is not compared."""
    numbers = []
    for part in version.split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


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
MemoryVizAction = Literal[
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
]
MEMORY_VIZ_ACTIONS: tuple[str, ...] = get_args(MemoryVizAction)

# The actions of vramlab's trace events: the snapshot format's, a completed free written
# ``free``, and ``mark`` (a phase boundary). ``?action=`` filters take these alone.
TraceAction = Literal[MemoryVizAction, "free", "mark"]
TRACE_ACTIONS: tuple[str, ...] = get_args(TraceAction)

# The v1 memory keys: integer byte counts in every succeeded result's ``memory``.
MEMORY_KEYS = tuple(str(f) for f in Figure)

# Shared-process figures: in a shared process that ran experiments before this one, host
# RSS (before, after, and so the change between them) starts from what those left, so it
# depends on the process's history, not on this experiment alone. The allocator's
# figures do not: the process empties and resets the allocator before each experiment.
SHARED_PROCESS_FIGURES = (Figure.HOST_RSS_BEFORE, Figure.HOST_RSS_AFTER)

# The figures the caching allocator gives (no host or device-level ones): what must agree
# between two runs of one spec, wherever they ran.
ALLOCATOR_KEYS = (
    "allocated_before",
    "allocated_after",
    "allocated_peak",
    "reserved_before",
    "reserved_after",
    "reserved_peak",
    "delta_allocated",
)


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
