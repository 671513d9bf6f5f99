"""Runs experiments in clean child processes and returns what they measured.

Children fork from the standard library's forkserver, which preloads torch and
workers.child but never touches CUDA: each experiment starts with an empty caching
allocator and its own allocator settings, and a crash, a CUDA error or an out-of-memory
in it cannot take the worker down. This module never imports torch itself, so the worker
loop that uses it stays torch-free.

Warm spares: for each device it has run on, the runner keeps the next child forked and
its device started (CUDA context made, nothing allocated) while the current one runs; a
spec that a started allocator can still honour is handed to a spare, which saves the
fork and the context (most of a tiny experiment's time). Other specs take the cold path:
a child forked for them. One runner may run several experiments at once (worker
``--concurrency``); each result says how many shared its device.

Shared processes: a spec with ``isolation: "shared"`` goes to a long-lived child that
serves spec after spec (up to ``concurrency`` of them per device, each retired after
``shared_runs`` experiments). After each result the child empties and checks itself
(workers/shared.py) and says whether it can serve again; one that cannot, or whose
experiment crashed, timed out or was cancelled, is retired, and the next shared spec
starts a new one (from a warm spare where there is one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    SpawnContext,
    SpawnProcess,
)
from pathlib import Path
from typing import Any

from vramlab.contract import ChildStart, ErrorType, Isolation, Status

from app.catalog.devices import canonical_device
from workers import allocator
from workers.children import EXIT_GRACE_S, Child, SharedPool, reap, reap_soon

PRELOAD = ["torch", "workers.child"]
POLL_S = 0.1
DEFAULT_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 120.0
START_ATTEMPTS = 4
# How a child ended when we stopped it for a cancel (beside "finished", "timeout" and
# the words for an exit or a signal).
_CANCEL = "stopped for a cancel"
SHARED_RUNS = 500  # experiments a shared process serves before it retires

log = logging.getLogger("vramlab.worker")


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

            main(args[0], conn, args[1], args[2], None, args[3])
        elif kind == "spare":  # a warm spare, or a new shared process
            from workers.child import serve

            serve(args[0], conn)
        elif kind == "probe":
            from workers.probe import capabilities

            conn.send_bytes(json.dumps({"result": capabilities()}).encode())
        else:  # "ping": proves the forkserver is up with its modules loaded
            conn.send_bytes(b"{}")
    finally:
        conn.close()


class Runner:
    """Runs experiments in clean children; thread-safe, up to ``concurrency`` at once.

    ``warm`` keeps ``spares`` ready per device (default: ``concurrency``); without it
    every experiment takes the cold path, as before spares existed. A spare's CUDA
    context takes about a quarter of a second to make: with experiments back to back, one
    spare is not ready again by the next claim, and a second one (``spares=2``, another
    idle context on the GPU) covers that gap.

    Shared specs run in up to ``concurrency`` long-lived children per device, each
    retired after ``shared_runs`` experiments (or sooner: see the module's docstring).
    """

    def __init__(
        self,
        device: str = "auto",
        *,
        warm: bool = True,
        concurrency: int = 1,
        spares: int | None = None,
        shared_runs: int = SHARED_RUNS,
    ) -> None:
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if spares is not None and spares < 1:
            raise ValueError(f"spares must be at least 1, not {spares}")
        if shared_runs < 1:
            raise ValueError(f"shared_runs must be at least 1, not {shared_runs}")
        self.spare_count = spares or concurrency
        self.shared_runs = shared_runs
        self.device = device
        self.warm = warm
        self.concurrency = concurrency
        self._ctx: ForkServerContext | None = None
        self._capabilities: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._spares: dict[str, list[Child]] = {}
        self._shared = SharedPool(concurrency, shared_runs)
        self._exiting: list[ForkServerProcess | SpawnProcess] = []
        self._filling: dict[str, threading.Thread] = {}  # the latest fill per device
        # Per device, one counter per running experiment: the most that ran at once.
        self._running: dict[str, list[list[int]]] = {}

    def start(self) -> None:
        """Start the forkserver and wait until it has torch loaded. Idempotent.

        A forkserver that dies later is started again by the next child's launch (the
        stdlib checks its pid), with its preloads.
        """
        with self._lock:
            if self._ctx is not None:
                return
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(_preload())
            self._ctx = ctx
            forkserver.ensure_running()
            # The forkserver imports torch after it starts; one trivial child waits for
            # that so the first experiment's clock does not include it.
            payload, _, _ = self._launch("ping", (), PROBE_TIMEOUT_S, _never)
            if payload is None:
                self._ctx = None
                raise RuntimeError("the forkserver started but its first child did not answer")

    def capabilities(self) -> dict[str, Any]:
        """What this host offers (probed once, in a child), limited to this runner's device.

        With spares on, the first one starts now, on the device most experiments use.
        """
        with self._lock:
            if self._capabilities is not None:
                return self._capabilities
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
            if self.warm:
                self._fill("cuda:0" if "cuda" in caps["device_types"] else "cpu")
            return caps

    def run(
        self,
        spec: dict[str, Any],
        *,
        should_cancel: Callable[[], bool] = _never,
        work_dir: Path | None = None,
    ) -> Outcome:
        # The API sends canonical devices ("cuda:0"); a caller may write "cuda".
        device = canonical_device(str(spec["device"]))
        spec = {**spec, "device": device}
        if self.device == "cpu" and _needs_cuda(spec):
            return Outcome(
                Status.FAILED,
                None,
                _error(
                    ErrorType.UNSUPPORTED_ON_DEVICE,
                    "this worker runs with --device cpu; the experiment needs CUDA",
                    "queue it for a worker that offers this device",
                ),
                None,
                0,
            )
        trace_path = None
        if spec.get("trace", "events") != "none":
            folder = work_dir or Path(tempfile.gettempdir())
            trace_path = folder / f"vramlab-trace-{uuid.uuid4().hex}.ndjson.gz"
        timeout = float(spec.get("timeout_s") or DEFAULT_TIMEOUT_S)
        settings = spec.get("allocator") or {}
        reuse = spec.get("isolation") == Isolation.SHARED
        if reuse and any(v is not None for v in settings.values()):
            # The API refuses this; a caller of the runner itself gets a clean process.
            reuse, spec = False, {**spec, "isolation": Isolation.CLEAN}
        with self._sharing(device) as at_once:
            args = (spec, str(trace_path) if trace_path else None, time.time_ns())
            began = time.perf_counter()
            if reuse:
                child, start = self._shared_child(device, args)
            else:
                child, start = self._child_for(device, settings, args)
            pid = child.proc.pid
            launched = time.perf_counter()
            payload, ended, code = self._wait(child, timeout, should_cancel, keep=reuse)
        if reuse and ended == "finished":
            self._shared.give_back(device, child)
        if self.warm and device == "cpu":
            self._fill_soon(device)
        outcome = self._outcome(payload, ended, code, trace_path, timeout)
        outcome.pid = pid
        outcome.stages["runner_launch"] = launched - began
        outcome.stages["runner_wait"] = time.perf_counter() - launched
        if outcome.result is not None:
            environment = outcome.result.setdefault("environment", {})
            environment["concurrent"] = at_once[0]
            environment["child_start"] = start
        if start == "fresh_interpreter" and outcome.result is not None:
            outcome.result["notes"].append(
                "Run in a fresh interpreter rather than forked: the allocator backend is fixed "
                "when torch loads, so a forked child could not change it."
            )
        if outcome.trace_path is None and trace_path is not None:
            trace_path.unlink(missing_ok=True)
        return outcome

    def close(self) -> None:
        """Retire the spares and the idle shared children (a busy one retires when its
        experiment ends). The forkserver exits by itself once no process holds its
        "alive" pipe, that is when this process exits; the stdlib offers no public way to
        stop it sooner."""
        with self._lock:
            idle = [c for pool in self._spares.values() for c in pool]
            self._spares.clear()
            self._ctx = None
        for child in [*idle, *self._shared.close()]:
            child.conn.close()  # EOF: the child exits without running anything more
            self._exiting.append(child.proc)
        self._settle()

    def spares(self, device: str) -> list[ForkServerProcess | SpawnProcess]:
        """The warm children waiting for a spec on ``device`` ("cpu", "cuda:0")."""
        with self._lock:
            return [child.proc for child in self._spares.get(device, [])]

    def shared(self, device: str) -> list[ForkServerProcess | SpawnProcess]:
        """The shared children waiting for their next spec on ``device``."""
        return self._shared.idle(device)

    # -- children ------------------------------------------------------------------
    def _child_for(
        self, device: str, settings: dict[str, Any], args: tuple[Any, ...]
    ) -> tuple[Child, ChildStart]:
        """A child running ``args``' spec: a warm spare where the settings allow one."""
        handed_at = time.perf_counter()
        if allocator.needs_fresh_interpreter(settings):
            # A forked child cannot change the allocator backend torch loaded with.
            child = self._spawn("experiment", (*args, handed_at), fresh=True)
            return child, "fresh_interpreter"
        spare = self._take_spare(device) if self.warm and allocator.warm_safe(settings) else None
        if spare is not None:
            try:
                spare.conn.send_bytes(json.dumps([*args, handed_at]).encode())
            except OSError:  # it died since is_alive() said otherwise
                self._discard(spare)
                spare = None
        child = spare or self._spawn("experiment", (*args, handed_at))
        if self.warm and device != "cpu":
            # The next experiment's spare starts its CUDA context (a quarter of a second)
            # while this one runs, in a thread: forking takes tens of milliseconds too.
            # A CPU spare starts after the result instead (run()), so that its start-up
            # does not compete for the CPU with an experiment timed on the wall clock.
            self._fill_soon(device)
        return child, "warm_spare" if spare is not None else "forked"

    def _shared_child(self, device: str, args: tuple[Any, ...]) -> tuple[Child, ChildStart]:
        """A shared child running ``args``' spec: an idle one that emptied itself, else a
        new one (a warm spare where there is one: its device has started)."""
        child = self._shared.take(device)
        start: ChildStart = "shared"
        if child is None:
            spare = self._take_spare(device) if self.warm else None
            child = spare or self._spawn("spare", (device,))
            start = "warm_spare" if spare is not None else "forked"
            if spare is not None and device != "cpu":
                self._fill_soon(device)  # as _child_for does when it takes a spare
        try:
            child.conn.send_bytes(json.dumps([*args, time.perf_counter()]).encode())
        except OSError:  # it died since it said it was ready: start one for this spec
            self._discard(child)
            child, start = self._spawn("spare", (device,)), "forked"
            child.conn.send_bytes(json.dumps([*args, time.perf_counter()]).encode())
        child.runs += 1
        return child, start

    def _fill_soon(self, device: str) -> None:
        thread = threading.Thread(target=self._fill, args=(device,), daemon=True)
        with self._lock:
            self._filling[device] = thread
        thread.start()

    def _take_spare(self, device: str) -> Child | None:
        filling = self._filling.get(device)
        if filling is not None and not self._spares.get(device):
            filling.join()  # a spare being forked now is still sooner than a new fork
        with self._lock:
            pool = self._spares.get(device, [])
            while pool:
                child = pool.pop(0)
                if child.proc.is_alive():
                    return child
                self._discard(child)
        return None

    def _fill(self, device: str) -> None:
        with self._lock:
            if self._ctx is None:
                return
            pool = self._spares.setdefault(device, [])
            while len(pool) < self.spare_count:
                try:
                    pool.append(self._spawn("spare", (device,)))
                except RuntimeError as exc:  # the experiments still run, on the cold path
                    log.warning("could not start a spare child for %s: %s", device, exc)
                    return

    def _discard(self, child: Child) -> None:
        child.discard()

    def _settle(self) -> None:
        """Reap children that have sent their results; kill any that will not exit."""
        with self._lock:
            exiting, self._exiting = self._exiting, []
        for proc in exiting:
            reap(proc)

    def _retire(self, proc: ForkServerProcess | SpawnProcess) -> None:
        """A child that sent its result exits by itself (for CUDA, a context teardown of
        tens of milliseconds): reap it in the background, off every experiment's clock.
        Its tensors went back to the driver before it answered (workers/child.py)."""
        reap_soon(proc)

    @contextlib.contextmanager
    def _sharing(self, device: str) -> Iterator[list[int]]:
        """While inside, this experiment counts as running on ``device``; the counter it
        yields ends as the most experiments (this one included) that ran there at once."""
        counter = [0]
        with self._lock:
            running = self._running.setdefault(device, [])
            running.append(counter)
            for other in running:
                other[0] = max(other[0], len(running))
        try:
            yield counter
        finally:
            with self._lock:
                running.remove(counter)

    def _launch(
        self,
        kind: str,
        args: tuple[Any, ...],
        timeout: float,
        should_cancel: Callable[[], bool],
    ) -> tuple[dict[str, Any] | None, str, int | None]:
        """Run one child; return its payload (or None), how it ended in words, its exit code."""
        return self._wait(self._spawn(kind, args), timeout, should_cancel)

    def _spawn(self, kind: str, args: tuple[Any, ...], fresh: bool = False) -> Child:
        ctx: ForkServerContext | SpawnContext = (
            multiprocessing.get_context("spawn") if fresh else self._ctx_or_start()
        )
        # A spare also reads its spec from the pipe; other children only write to it.
        ours, theirs = ctx.Pipe(duplex=kind == "spare")
        try:
            proc = self._start_child(ctx, kind, theirs, args)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the child holds the only other end now: EOF means it is gone
        return Child(proc, ours)

    def _wait(
        self,
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
                        return None, _exit_words(proc.exitcode), proc.exitcode
                    # The child exits by itself (for CUDA, a context teardown): reaped
                    # before the next experiment, not on this one's clock.
                    finished = True
                    return payload, "finished", None
                if should_cancel():
                    return None, _CANCEL, None
                if time.monotonic() > deadline:
                    return None, "timeout", None
        finally:
            if not (finished and keep):
                conn.close()
                if finished:
                    self._retire(proc)
                else:
                    if proc.is_alive():
                        proc.kill()
                    reap(proc)

    def _outcome(
        self,
        payload: dict[str, Any] | None,
        ended: str,
        exitcode: int | None,
        trace_path: Path | None,
        timeout: float,
    ) -> Outcome:
        if ended == _CANCEL:
            return Outcome(Status.CANCELLED, None, None, None, 0)
        if ended == "timeout":
            return Outcome(
                Status.FAILED,
                None,
                _error(
                    ErrorType.TIMEOUT,
                    f"the experiment ran past its timeout of {timeout:g} s and was killed",
                    "raise timeout_s, or use a smaller shape or fewer repeats",
                ),
                None,
                0,
            )
        if payload is None:
            error = _error(
                ErrorType.CRASHED,
                f"the experiment's process {ended} without a result",
                "a crash inside PyTorch or a library (abort, segfault, CUDA error)",
            )
            error["details"] = {"exitcode": exitcode, "signal": _signal_name(exitcode)}
            return Outcome(Status.FAILED, None, error, None, 0)
        result = payload.get("result")
        if result and self._capabilities and result.get("environment", {}).get("driver") is None:
            result["environment"]["driver"] = self._capabilities.get("driver")
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


def _preload() -> list[str]:
    """Torch and the child's modules, plus vramlab's modules that this process imported.

    Each child re-runs the parent's main module before it starts (the stdlib's main
    fix-up: ``python -m app.cli`` or the ``vramlab`` script imports app.cli, pydantic and
    settings, half a second on a busy host); with those imported once in the forkserver,
    the re-run finds them in sys.modules and costs about a millisecond.
    """
    ours = sorted(m for m in list(sys.modules) if m.partition(".")[0] in ("app", "workers"))
    return [*PRELOAD, *(m for m in ours if m not in PRELOAD)]


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


def _error(kind: ErrorType, message: str, hint: str | None) -> dict[str, Any]:
    return {"type": kind, "message": message, "hint": hint, "details": {}}
