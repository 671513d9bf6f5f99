"""How a child's run ended, as the runner's Outcome: the child's payload, or a timeout,
a cancel or a crash (with its exit code and signal) in words. Torch-free."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramlab.contract import ErrorType, Status
from workers.children import EXIT_GRACE_S, Child, reap, reap_soon

POLL_S = 0.1
# How a child ended when we stopped it for a cancel (beside "finished", "timeout" and
# the words for an exit or a signal).
CANCEL = "stopped for a cancel"


@dataclass
class Outcome:
    status: Status
    result: dict[str, Any] | None  # on success; on an OOM failure, the figures at that moment
    error: dict[str, Any] | None  # {"type", "message", "hint", "details"}
    trace_path: Path | None  # gzip NDJSON, one normalised event per line; the caller deletes it
    trace_events: int
    # Seconds per stage of the child's life (hand-off, device start, run, notes...): where
    # an experiment's time goes, for bench/ (not part of the result).
    stages: dict[str, float] = field(default_factory=dict)
    pid: int | None = None  # the child's process id


def wait(
    child: Child,
    timeout: float,
    should_cancel: Callable[[], bool],
    keep: bool = False,
) -> tuple[dict[str, Any] | None, str, int | None]:
    """Wait for the child's result. ``keep``: a child that answered stays as it is (a
    shared child, which the caller gives back); any other is retired or killed."""
    proc, conn = child.proc, child.conn
    finished = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            if conn.poll(POLL_S):
                try:
                    payload: dict[str, Any] = json.loads(conn.recv_bytes())
                except EOFError:
                    proc.join(EXIT_GRACE_S)
                    return None, exit_words(proc.exitcode), proc.exitcode
                # The child exits by itself (for CUDA, a context teardown): reaped
                # before the next experiment, not on this one's clock.
                finished = True
                return payload, "finished", None
            if should_cancel():
                return None, CANCEL, None
            if time.monotonic() > deadline:
                return None, "timeout", None
    finally:
        if not (finished and keep):
            conn.close()
            if finished:
                reap_soon(proc)  # it exits by itself: reaped off every clock
            else:
                if proc.is_alive():
                    proc.kill()
                reap(proc)


def outcome_of(
    payload: dict[str, Any] | None,
    ended: str,
    exitcode: int | None,
    trace_path: Path | None,
    timeout: float,
    driver: Any = None,
) -> Outcome:
    """The Outcome of a child that ended so; ``driver``: the host's, for a result that
    could not read it."""
    if ended == CANCEL:
        return Outcome(Status.CANCELLED, None, None, None, 0)
    if ended == "timeout":
        return Outcome(
            Status.FAILED,
            None,
            failure(
                ErrorType.TIMEOUT,
                f"the experiment ran past its timeout of {timeout:g} s and was killed",
                "raise timeout_s, or use a smaller shape or fewer repeats",
            ),
            None,
            0,
        )
    if payload is None:
        error = failure(
            ErrorType.CRASHED,
            f"the experiment's process {ended} without a result",
            "a crash inside PyTorch or a library (abort, segfault, CUDA error)",
        )
        error["details"] = {"exitcode": exitcode, "signal": signal_name(exitcode)}
        return Outcome(Status.FAILED, None, error, None, 0)
    result = payload.get("result")
    if result and driver is not None and result.get("environment", {}).get("driver") is None:
        result["environment"]["driver"] = driver
    count = int(payload.get("trace_events") or 0)
    path = trace_path if count and trace_path is not None and trace_path.exists() else None
    stages = {k: float(v) for k, v in (payload.get("stages") or {}).items()}
    return Outcome(
        Status(payload["status"]),
        result,
        payload.get("error"),
        path,
        count if path else 0,
        stages,
    )


def signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def exit_words(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        return f"was killed by signal {signal_name(code)} ({-code})"
    return f"exited with code {code}"


def failure(kind: ErrorType, message: str, hint: str | None) -> dict[str, Any]:
    return {"type": kind, "message": message, "hint": hint, "details": {}}
