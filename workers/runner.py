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
import importlib.util
import json
import logging
import multiprocessing
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    SpawnProcess,
)
from pathlib import Path
from typing import Any

from vramlab.catalog.devices import canonical_device
from vramlab.contract import ChildStart, ErrorType, Isolation, Status
from vramlab.runspec import RunSpec
from workers import allocator
from workers.children import Child, SharedPool, reap, retire_idle
from workers.endings import Outcome, failure, outcome_of, wait
from workers.launch import preload, spawn
from workers.sharing import DeviceGate

PROBE_TIMEOUT_S = 120.0
SHARED_RUNS = 500  # experiments a shared process serves before it retires

log = logging.getLogger("vramlab.worker")


def _never() -> bool:
    return False


def _devices(spec: RunSpec) -> tuple[str, ...]:
    """Every device the spec's tensors live on: its own, another operand's, the plan's."""
    # The catalog's plan names every device (other operands, pinned memory, steps); a
    # distributed model's ranks take cuda:0 to cuda:N-1, and the run holds them all.
    plan = spec.model.parallel if spec.model is not None else None
    ranks = plan.devices(spec.device) if plan is not None else ()
    return (spec.device, spec.source_device, *spec.planned_devices, *ranks)


def _needs_cuda(spec: RunSpec) -> bool:
    """Whether any tensor of the spec lives on a GPU, or needs one (pinned host memory)."""
    return spec.pin_memory or any(d.startswith("cuda") for d in _devices(spec))


# A device's warm model children are kept apart from its spares, under this suffix.
_MODELS = "+models"
# Warm model children kept per device: each holds transformers' modules and, on a GPU, a
# CUDA context; one is made again while the trial that took the last one runs.
MODEL_SPARES = 1
# How long a model child may take to import what a trial imports and start its device
# before it is given up on (a bound on a hang: seconds on a quiet host).
MODEL_WARM_TIMEOUT_S = 300.0


def _models_pool(device: str) -> str:
    return device + _MODELS


def models_importable() -> bool:
    """Whether this environment can run model experiments (transformers is installed).
    Asked without importing it: the worker's own process stays torch-free."""
    return importlib.util.find_spec("transformers") is not None


# ``vramlab worker`` with no --concurrency: how many experiments a device runs at once
# (shared-isolation ones together, any other alone: workers/sharing.py). A GPU overlaps
# several tiny experiments' launches and host work. On the CPU two where the host has two
# cores (each loop is a worker of its own name): a shared experiment's child and its
# loop wait on each other, so one loop kept a 2-core host about half idle; two ran a
# 1,000-point sweep in 7.4 s against 10.0 (docs/gpu-measurements.md).
DEFAULT_CONCURRENCY = {"cuda": 4, "cpu": 2}
# Without --spares: warm spares kept per device. A spare's CUDA context takes a tenth of
# a second to make (with one hardware queue, workers/device.py; a quarter with the
# driver's default), so with clean experiments back to back one spare is not ready again
# by the next claim and a second one covers that gap (p50 0.138 s against 0.173 s on an
# H100 before the queue, docs/gpu-measurements.md). A CPU spare is a fork, ready at once.
DEFAULT_SPARES = {"cuda": 2, "cpu": 1}


def concurrency_for(device_types: list[str], cpus: int | None = None) -> int:
    """The default concurrency of a worker that offers ``device_types``."""
    if "cuda" in device_types:
        return DEFAULT_CONCURRENCY["cuda"]
    return max(1, min(DEFAULT_CONCURRENCY["cpu"], cpus or os.cpu_count() or 1))


def spares_for(device_types: list[str], concurrency: int = 1) -> int:
    """The default number of warm spares per device of a worker that offers
    ``device_types``: by device, or the concurrency given where it is more."""
    return max(concurrency, DEFAULT_SPARES["cuda" if "cuda" in device_types else "cpu"])


class Runner:
    """Runs experiments in clean children; thread-safe, up to ``concurrency`` at once.

    ``warm`` keeps ``spares`` ready per device (default: by device once the host is
    probed, 2 on a GPU and 1 on the CPU, or the concurrency given where it is more;
    ``DEFAULT_SPARES``); without it every experiment takes the cold path, as before
    spares existed. Where transformers is installed, it also keeps a warm model child
    per device from the start (``MODEL_SPARES``): the first model trial is warm too.

    Shared specs run in up to ``concurrency`` long-lived children per device, each
    retired after ``shared_runs`` experiments (or sooner: see the module's docstring).
    """

    def __init__(
        self,
        device: str = "auto",
        *,
        warm: bool = True,
        concurrency: int | None = 1,
        spares: int | None = None,
        shared_runs: int = SHARED_RUNS,
    ) -> None:
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if spares is not None and spares < 1:
            raise ValueError(f"spares must be at least 1, not {spares}")
        if shared_runs < 1:
            raise ValueError(f"shared_runs must be at least 1, not {shared_runs}")
        # None: chosen by device once the host is probed (``capabilities``), and then only
        # shared-isolation experiments share a device (``DeviceGate``).
        self.by_device = concurrency is None
        concurrency = concurrency or 1
        # None: by device once the host is probed (``capabilities``).
        self.spares_given = spares
        self.spare_count = spares or concurrency
        # Whether model children are made (transformers importable); False after one
        # failed to warm up, so that each trial does not try again.
        self.models = warm and models_importable()
        self.shared_runs = shared_runs
        self.device = device
        self.warm = warm
        self.concurrency = concurrency
        self._ctx: ForkServerContext | None = None
        self._capabilities: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._spares: dict[str, list[Child]] = {}
        self._shared = SharedPool(concurrency, shared_runs)
        self._gate = DeviceGate()
        self._exiting: list[ForkServerProcess | SpawnProcess] = []
        self._filling: dict[str, threading.Thread] = {}  # the latest fill per device
        self._starting: dict[str, int] = {}  # spares being started now, per device
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
            ctx.set_forkserver_preload(preload())
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

        With spares on, the first ones start now, on the device most experiments use,
        and, where the worker can run models, its first warm model child: this returns
        once that child has imported what a trial imports and started its device, so a
        worker registers (and takes work) only then. Nothing else runs meanwhile, so its
        start-up competes with no experiment, as the rule for a CPU spare is.
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
            if self.by_device:
                self.concurrency = concurrency_for(caps["device_types"])
                self._shared.size = self.concurrency
            if self.spares_given is None:
                # A concurrency chosen by device runs clean experiments alone: one spare
                # taken at a time, so the device's default is enough.
                given = 1 if self.by_device else self.concurrency
                self.spare_count = spares_for(caps["device_types"], given)
        if self.warm:  # outside the lock, which _fill takes (in two threads here)
            first = "cuda:0" if "cuda" in caps["device_types"] else "cpu"
            models = None
            if self.models:
                models = threading.Thread(
                    target=self._fill, args=(_models_pool(first),), daemon=True
                )
                models.start()
            self._fill(first)
            if models is not None:
                models.join()
        return caps

    def run(
        self,
        spec: RunSpec,
        *,
        should_cancel: Callable[[], bool] = _never,
        work_dir: Path | None = None,
    ) -> Outcome:
        # The API sends canonical devices ("cuda:0"); a caller may write "cuda".
        device = canonical_device(spec.device)
        spec = spec.replace(device=device)
        if self.device == "cpu" and _needs_cuda(spec):
            return Outcome(
                Status.FAILED,
                None,
                failure(
                    ErrorType.UNSUPPORTED_ON_DEVICE,
                    "this worker runs with --device cpu; the experiment needs CUDA",
                    "queue it for a worker that offers this device",
                ),
                None,
                0,
            )
        trace_path = None
        if spec.traced:
            folder = work_dir or Path(tempfile.gettempdir())
            trace_path = folder / f"vramlab-trace-{uuid.uuid4().hex}.ndjson.gz"
        timeout = spec.timeout_s
        settings = spec.allocator.settings()
        reuse = spec.shared
        if reuse and settings:
            # The API refuses this; a caller of the runner itself gets a clean process.
            reuse, spec = False, spec.replace(isolation=Isolation.CLEAN)
        if reuse and spec.is_model and device != "cpu":
            # A shared process on a GPU began as an op's spare, with one hardware queue
            # (workers/device.py); a model's step, whose streams may overlap, runs in a warm
            # model child instead (its result says isolation clean).
            reuse, spec = False, spec.replace(isolation=Isolation.CLEAN)
        with self._turn(spec, device, reuse), self._sharing(device) as at_once:
            # The spec crosses to the child as its wire form (JSON on the pipe).
            args = (spec.wire(), str(trace_path) if trace_path else None, time.time_ns())
            began = time.perf_counter()
            if reuse:
                child, start = self._shared_child(device, args)
            else:
                child, start = self._child_for(device, settings, args)
            pid = child.proc.pid
            launched = time.perf_counter()
            payload, ended, code = wait(child, timeout, should_cancel, keep=reuse)
        if reuse and ended == "finished":
            self._shared.give_back(device, child)
        if self.warm and device == "cpu":
            if not spec.is_model:
                self._fill_soon(device)
            elif self.models:
                self._fill_soon(_models_pool(device))
        driver = (self._capabilities or {}).get("driver")
        outcome = outcome_of(payload, ended, code, trace_path, timeout, driver)
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
        """Retire the spares and the idle shared children at once (they run nothing: EOF,
        a short grace, then a kill), and the spares still starting as they finish; a
        busy one retires when its experiment ends. The forkserver exits by itself once no
        process holds its "alive" pipe, that is when this process exits; the stdlib
        offers no public way to stop it sooner."""
        with self._lock:
            idle = [c for pool in self._spares.values() for c in pool]
            self._spares.clear()
            self._ctx = None
        retire_idle([*idle, *self._shared.close()])
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
        warm = self.warm and allocator.warm_safe(settings)
        model = args[0].get("op") == "model"
        spare = None
        if warm and model and self.models:
            spare = self._take_spare(_models_pool(device))
            if device != "cpu":
                # The next trial's warm child imports transformers while this one runs; on
                # the CPU it starts after the result instead (as a CPU spare does).
                self._fill_soon(_models_pool(device))
        if warm and spare is None and not (model and device != "cpu"):
            # An op's CUDA spare has one hardware queue (workers/device.py): a model's
            # trial, whose streams may overlap, forks a child of the driver's default.
            spare = self._take_spare(device)
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
        if spare is None:
            return child, "forked"
        return child, "warm_model" if spare.warmed else "warm_spare"

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
        with self._lock:
            if self._full(device):  # a shared experiment took no spare: nothing to start
                return
        thread = threading.Thread(target=self._fill, args=(device,), daemon=True)
        with self._lock:  # started before another loop can see it (and join it)
            thread.start()
            self._filling[device] = thread

    def _full(self, pool_key: str) -> bool:
        """Whether ``pool_key``'s spares, ready and starting, are as many as it keeps (the
        lock held)."""
        most = MODEL_SPARES if pool_key.endswith(_MODELS) else self.spare_count
        ready = len(self._spares.get(pool_key, []))
        return ready + self._starting.get(pool_key, 0) >= most

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

    def _fill(self, pool_key: str) -> None:
        """Start spares for ``pool_key`` (a device, or a device's model children) until it
        has ``spare_count`` (``MODEL_SPARES``). A model child joins its pool once it says
        it is warm, so taking one never waits for more than what is left of its start.
        The lock is not held while one starts (seconds on a loaded host), so that
        ``close`` never waits for it: a spare that comes up after ``close`` is retired at
        once."""
        device = pool_key.removesuffix(_MODELS)
        models = pool_key != device
        while True:
            with self._lock:
                ctx = self._ctx
                if ctx is None or (models and not self.models):
                    return
                if self._full(pool_key):
                    return
                self._starting[pool_key] = self._starting.get(pool_key, 0) + 1
            try:
                child = spawn(ctx, "spare", (device, True) if models else (device,))
                if models and not self._await_warm(child):
                    return
            except RuntimeError as exc:  # the experiments still run, on the cold path
                log.warning("could not start a spare child for %s: %s", pool_key, exc)
                return
            finally:
                with self._lock:
                    self._starting[pool_key] -= 1
            with self._lock:
                if self._ctx is not None:
                    self._spares.setdefault(pool_key, []).append(child)
                    continue
            retire_idle([child])  # closed meanwhile
            return

    def _await_warm(self, child: Child) -> bool:
        """Wait for a model child's word that it is warm. One that dies or hangs first is
        stopped, and no more are made (trials take plain spares, which import what they
        need): False."""
        why = child.warm(MODEL_WARM_TIMEOUT_S)
        if why is None:
            return True
        self._discard(child)
        with self._lock:
            if self._ctx is None:  # closed meanwhile: the worker is exiting
                return False
            self.models = False
        log.warning("a warm model child did not start (%s): model trials start cold", why)
        return False

    def _discard(self, child: Child) -> None:
        child.discard()

    def _settle(self) -> None:
        """Reap children that have sent their results; kill any that will not exit."""
        with self._lock:
            exiting, self._exiting = self._exiting, []
        for proc in exiting:
            reap(proc)

    def _turn(
        self, spec: RunSpec, device: str, reuse: bool
    ) -> contextlib.AbstractContextManager[None]:
        """With concurrency by device, a shared-isolation spec shares its device; any
        other waits until its devices are free and keeps them to itself."""
        if not self.by_device:
            return contextlib.nullcontext()
        # A model (a fit's trials are models too) keeps its GPU, whatever its isolation.
        if reuse and not spec.is_model:
            return self._gate.shared(device)
        devices = {device, *(canonical_device(d) for d in _devices(spec) if d.startswith("cuda"))}
        return self._gate.alone(devices)

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
                # By identity: counters are lists, and list.remove would take the first
                # one that merely holds the same number, another experiment's.
                running[:] = [other for other in running if other is not counter]

    def _launch(
        self,
        kind: str,
        args: tuple[Any, ...],
        timeout: float,
        should_cancel: Callable[[], bool],
    ) -> tuple[dict[str, Any] | None, str, int | None]:
        """Run one child; return its payload (or None), how it ended in words, its exit code."""
        return wait(self._spawn(kind, args), timeout, should_cancel)

    def _spawn(self, kind: str, args: tuple[Any, ...], fresh: bool = False) -> Child:
        ctx = multiprocessing.get_context("spawn") if fresh else self._ctx_or_start()
        return spawn(ctx, kind, args)

    def _ctx_or_start(self) -> ForkServerContext:
        if self._ctx is None:
            self.start()
        assert self._ctx is not None
        return self._ctx
