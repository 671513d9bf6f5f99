"""What the worker sends for one experiment, checked against the API's limits first.

An outcome that the API would refuse (a message past its length, a result past the body
limit, a trace chunk past the chunk limits) is fitted or replaced here by a short
failure the API can store, so that one experiment's output never costs the worker its
loop, nor the next worker that would claim it after the lease expired.
"""

import gzip
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from vramlab import contract
from vramlab.contract import ErrorType, Status

# The worker cuts traces into chunks of this many events (at most the API's limit).
TRACE_CHUNK_EVENTS = 50_000
# The report's lease token and JSON framing, beyond what report_body measures.
REPORT_OVERHEAD_BYTES = 1024


@dataclass(frozen=True)
class Limits:
    """The API's limits, as it states them at registration (contract defaults otherwise)."""

    max_body_bytes: int = contract.MAX_OUTCOME_BYTES
    max_trace_chunk_bytes: int = contract.MAX_TRACE_CHUNK_BYTES
    max_trace_chunk_events: int = contract.MAX_TRACE_CHUNK_EVENTS
    max_error_message_chars: int = contract.MAX_ERROR_MESSAGE_CHARS
    max_error_hint_chars: int = contract.MAX_ERROR_HINT_CHARS

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any] | None) -> "Limits":
        given = reply or {}
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in given.items() if k in names and v is not None})

    @property
    def chunk_events(self) -> int:
        return max(1, min(TRACE_CHUNK_EVENTS, self.max_trace_chunk_events))


class OutOfLimits(Exception):
    """Something the worker would send breaks one of the API's limits."""


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f" … [{len(text) - limit} more characters cut]"
    return text[: max(0, limit - len(marker))] + marker


SIZE_HINT = "a smaller shape, fewer repeats or trace='none' keep what is sent small"


def refused(what: str, why: str, limits: Limits, hint: str = SIZE_HINT) -> dict[str, Any]:
    """A short failure in place of an outcome the API refused or would refuse."""
    return {
        "status": Status.FAILED,
        "result": None,
        "error": {
            "type": ErrorType.REPORT_REFUSED,
            "message": cut(
                f"the experiment ran, but its {what} could not be stored: {why}",
                limits.max_error_message_chars,
            ),
            "hint": cut(hint, limits.max_error_hint_chars),
            "details": None,
        },
        "trace_events": 0,
    }


def unreadable_spec(exc: ValueError) -> dict[str, Any]:
    """A failure in place of running a claimed spec this worker cannot read."""
    return {
        "status": Status.FAILED,
        "result": None,
        "error": {
            "type": ErrorType.INVALID_SPEC,
            "message": cut(f"this worker cannot read the claimed spec: {exc}", 2000),
            "hint": "run a worker of the API's release (vramlab version on both sides)",
            "details": None,
        },
        "trace_events": 0,
    }


def fit_error(error: Mapping[str, Any] | None, limits: Limits) -> dict[str, Any] | None:
    if error is None:
        return None
    fitted = dict(error)
    # The API stores text without NUL characters (a library's message may carry one).
    message = str(fitted.get("message") or "").replace("\x00", "\\x00")
    fitted["message"] = cut(message, limits.max_error_message_chars)
    if fitted.get("hint") is not None:
        fitted["hint"] = cut(
            str(fitted["hint"]).replace("\x00", "\\x00"), limits.max_error_hint_chars
        )
    return fitted


def report_body(
    status: str,
    result: dict[str, Any] | None,
    error: Mapping[str, Any] | None,
    trace_events: int,
    limits: Limits,
) -> dict[str, Any]:
    """The report as it will be sent; a result too large for the API becomes a failure.

    Only the limits are checked here. The shape of the result is the API's to judge (a
    worker a version apart must not turn good figures into failures): a 422 comes back
    as Refused, and the loop reports that instead.
    """
    body = {
        "status": status,
        "result": result,
        "error": fit_error(error, limits),
        "trace_events": trace_events,
    }
    try:
        size = len(json.dumps(body, allow_nan=False).encode())
    except ValueError as exc:  # NaN or infinity: not JSON, the API would refuse it
        return refused("result", f"it is not valid JSON ({exc})", limits)
    if size + REPORT_OVERHEAD_BYTES > limits.max_body_bytes:
        return refused(
            "result",
            f"it is {size} bytes of JSON, over the API's limit of {limits.max_body_bytes} "
            "bytes for a report",
            limits,
        )
    return body


def trace_chunks(path: Path, limits: Limits) -> Iterator[bytes]:
    """The runner's gzip NDJSON trace, re-cut into gzip chunks the API accepts.

    Raises OutOfLimits for a chunk past the API's byte limits (before it is sent).
    """
    most = limits.max_trace_chunk_bytes
    with gzip.open(path, "rb") as f:
        lines = (line if line.endswith(b"\n") else line + b"\n" for line in f if line.strip())
        for seq in itertools.count():
            batch = list(itertools.islice(lines, limits.chunk_events))
            if not batch:
                return
            text = b"".join(batch)
            if len(text) > most * contract.TRACE_CHUNK_EXPANSION:
                raise OutOfLimits(
                    f"trace chunk {seq} holds {len(text)} bytes of events, over the API's "
                    f"limit of {most * contract.TRACE_CHUNK_EXPANSION}"
                )
            gz = gzip.compress(text, compresslevel=6)
            if len(gz) > most:
                raise OutOfLimits(
                    f"trace chunk {seq} is {len(gz)} bytes compressed, over the API's limit "
                    f"of {most}"
                )
            yield gz
