"""Runs one experiment in a clean child process and returns what it measured.

Children fork from the standard library's forkserver, which preloads torch and
workers.child but never touches CUDA: each experiment starts in a fraction of a second
with an empty caching allocator and its own allocator settings, and a crash, a CUDA
error or an out-of-memory in it cannot take the worker down. This module never imports
torch itself, so the worker loop that uses it stays torch-free.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    SpawnContext,
    SpawnProcess,
)
from pathlib import Path
from typing import Any, Literal

from app.catalog.devices import canonical_device
from workers import allocator

PRELOAD = ["torch", "workers.child"]
POLL_S = 0.1
DEFAULT_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 120.0
START_ATTEMPTS = 4
EXIT_GRACE_S = 10.0  # after a result, how long a child may take to exit before a kill


@dataclass
class Outcome:
    status: Literal["succeeded", "failed", "cancelled"]
    result: dict[str, Any] | None  # on success; on an OOM failure, the figures at that moment
    error: dict[str, Any] | None  # {"type", "message", "hint", "details"}
    trace_path: Path | None  # gzip NDJSON, one normalised event per line; the caller deletes it
    trace_events: int


def _never() -> bool:
    return False


def _needs_cuda(spec: dict[str, Any]) -> bool:
    """Whether any tensor of the spec lives on a GPU, or needs one (pinned host memory)."""
    params = spec.get("params") or {}
    # The catalog's plan names every device (other operands, pinned memory, steps).
    planned = (spec.get("prediction") or {}).get("devices") or []
    devices = (str(spec["device"]), str(params.get("source_device") or "cpu"), *planned)
    return bool(params.get("pin_memory")) or any(str(d).startswith("cuda") for d in devices)


def _child_entry(kind: str, conn: Connection, args: tuple[Any, ...]) -> None:
    """Runs in the child. Imports happen here so this module stays torch-free."""
    try:
        if kind == "experiment":
            # Before torch loads (in a fresh interpreter), so that even the backend applies.
            allocator.set_env(allocator.conf_string(args[0].get("allocator") or {}))
            from workers.child import main

            main(args[0], conn, args[1], args[2])
        elif kind == "probe":
            from workers.probe import capabilities

            conn.send_bytes(json.dumps({"status": "succeeded", "result": capabilities()}).encode())
        else:  # "ping": proves the forkserver is up with its modules loaded
            conn.send_bytes(b"{}")
    finally:
        conn.close()


class Runner:
    def __init__(self, device: str = "auto") -> None:
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
        self.device = device
        self._ctx: ForkServerContext | None = None
        self._capabilities: dict[str, Any] | None = None

    def start(self) -> None:
        """Start the forkserver and wait until it has torch loaded. Idempotent.

        A forkserver that dies later is started again by the next child's launch (the
        stdlib checks its pid), with its preloads.
        """
        if self._ctx is not None:
            return
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        self._ctx = ctx
        forkserver.ensure_running()
        # The forkserver imports torch after it starts; one trivial child waits for that
        # so the first experiment's clock does not include it.
        payload, _, _ = self._launch("ping", (), PROBE_TIMEOUT_S, _never)
        if payload is None:
            self._ctx = None
            raise RuntimeError("the forkserver started but its first child did not answer")

    def capabilities(self) -> dict[str, Any]:
        """What this host offers (probed in a child), limited to this runner's device."""
        payload, ended, _ = self._launch("probe", (), PROBE_TIMEOUT_S, _never)
        if payload is None:
            raise RuntimeError(f"the capabilities probe failed: {ended}")
        caps: dict[str, Any] = payload["result"]
        if self.device == "cpu":
            caps = {**caps, "device_types": ["cpu"], "gpus": [], "driver": None}
        elif self.device == "cuda" and "cuda" not in caps["device_types"]:
            raise RuntimeError(
                "device='cuda' was asked for but this host has no usable CUDA "
                f"device (torch {caps['torch']}, CUDA build {caps['cuda']})"
            )
        self._capabilities = caps
        return caps

    def run(
        self,
        spec: dict[str, Any],
        *,
        should_cancel: Callable[[], bool] = _never,
        work_dir: Path | None = None,
    ) -> Outcome:
        # The API sends canonical devices ("cuda:0"); a caller may write "cuda".
        spec = {**spec, "device": canonical_device(str(spec["device"]))}
        if self.device == "cpu" and _needs_cuda(spec):
            return Outcome(
                "failed",
                None,
                {
                    "type": "unsupported_on_device",
                    "message": "this worker runs with --device cpu; the experiment needs CUDA",
                    "hint": "queue it for a worker that offers this device",
                    "details": {},
                },
                None,
                0,
            )
        trace_path = None
        if spec.get("trace", "events") != "none":
            folder = work_dir or Path(tempfile.gettempdir())
            trace_path = folder / f"vramlab-trace-{uuid.uuid4().hex}.ndjson.gz"
        args = (spec, str(trace_path) if trace_path else None, time.time_ns())
        timeout = float(spec.get("timeout_s") or DEFAULT_TIMEOUT_S)
        # A forked child cannot change the allocator backend torch loaded with.
        fresh = allocator.needs_fresh_interpreter(spec.get("allocator") or {})
        payload, ended, code = self._launch("experiment", args, timeout, should_cancel, fresh)
        outcome = self._outcome(payload, ended, code, trace_path, timeout)
        if fresh and outcome.result is not None:
            outcome.result["notes"].append(
                "Run in a fresh interpreter rather than forked: the allocator backend is fixed "
                "when torch loads, so a forked child could not change it."
            )
        if outcome.trace_path is None and trace_path is not None:
            trace_path.unlink(missing_ok=True)
        return outcome

    def close(self) -> None:
        # The forkserver exits by itself once no process holds its "alive" pipe, that is
        # when this process exits; the stdlib offers no public way to stop it sooner.
        self._ctx = None

    def _outcome(
        self,
        payload: dict[str, Any] | None,
        ended: str,
        exitcode: int | None,
        trace_path: Path | None,
        timeout: float,
    ) -> Outcome:
        if ended == "cancelled":
            return Outcome("cancelled", None, None, None, 0)
        if ended == "timeout":
            return Outcome(
                "failed",
                None,
                _error(
                    "timeout",
                    f"the experiment ran past its timeout of {timeout:g} s and was killed",
                    "raise timeout_s, or use a smaller shape or fewer repeats",
                ),
                None,
                0,
            )
        if payload is None:
            error = _error(
                "crashed",
                f"the experiment's process {ended} without a result",
                "a crash inside PyTorch or a library (abort, segfault, CUDA error)",
            )
            error["details"] = {"exitcode": exitcode, "signal": _signal_name(exitcode)}
            return Outcome("failed", None, error, None, 0)
        result = payload.get("result")
        if result and self._capabilities and result.get("environment", {}).get("driver") is None:
            result["environment"]["driver"] = self._capabilities.get("driver")
        count = int(payload.get("trace_events") or 0)
        path = trace_path if count and trace_path is not None and trace_path.exists() else None
        return Outcome(payload["status"], result, payload.get("error"), path, count if path else 0)

    def _launch(
        self,
        kind: str,
        args: tuple[Any, ...],
        timeout: float,
        should_cancel: Callable[[], bool],
        fresh: bool = False,
    ) -> tuple[dict[str, Any] | None, str, int | None]:
        """Run one child; return its payload (or None), how it ended in words, its exit code."""
        ctx: ForkServerContext | SpawnContext = (
            multiprocessing.get_context("spawn") if fresh else self._ctx_or_start()
        )
        receiver, sender = ctx.Pipe(duplex=False)
        proc: ForkServerProcess | SpawnProcess | None = None
        try:
            proc = self._start_child(ctx, kind, sender, args)
            sender.close()  # the child holds the only writer now: EOF means it is gone
            deadline = time.monotonic() + timeout
            while True:
                if receiver.poll(POLL_S):
                    try:
                        payload: dict[str, Any] = json.loads(receiver.recv_bytes())
                    except EOFError:
                        proc.join(EXIT_GRACE_S)
                        return None, _exit_words(proc.exitcode), proc.exitcode
                    proc.join(EXIT_GRACE_S)
                    return payload, "finished", proc.exitcode
                if should_cancel():
                    return None, "cancelled", None
                if time.monotonic() > deadline:
                    return None, "timeout", None
        finally:
            receiver.close()
            sender.close()
            if proc is not None:
                if proc.is_alive():
                    proc.kill()
                    proc.join(EXIT_GRACE_S)
                with contextlib.suppress(ValueError):
                    proc.close()

    def _start_child(
        self,
        ctx: ForkServerContext | SpawnContext,
        kind: str,
        sender: Connection,
        args: tuple[Any, ...],
    ) -> ForkServerProcess | SpawnProcess:
        last: BaseException | None = None
        for attempt in range(START_ATTEMPTS):
            proc = ctx.Process(
                target=_child_entry, args=(kind, sender, args), name=f"vramlab-{kind}", daemon=True
            )
            try:
                proc.start()
                return proc
            except (EOFError, OSError) as exc:
                # The forkserver died or is dying. The stdlib starts a new one once the old
                # one has exited and can be reaped: give it a moment, then try again.
                last = exc
                time.sleep(0.2 * (attempt + 1))
        raise RuntimeError("could not start a child: the forkserver keeps failing") from last

    def _ctx_or_start(self) -> ForkServerContext:
        if self._ctx is None:
            self.start()
        assert self._ctx is not None
        return self._ctx


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def _exit_words(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        return f"was killed by signal {_signal_name(code)} ({-code})"
    return f"exited with code {code}"


def _error(kind: str, message: str, hint: str | None) -> dict[str, Any]:
    return {"type": kind, "message": message, "hint": hint, "details": {}}
