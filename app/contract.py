"""The API↔worker contract: the one place that spells each status and error type.

Torch-free and web-free: the API (schemas, services, pages, CLI) and the worker (loop,
runner, result builder) both import it. The enums are ``StrEnum``s, so a value is its
own string on the wire and in the database.
"""

from enum import StrEnum


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
