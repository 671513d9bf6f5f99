"""Predictions of model experiments: one interface, a fair pool, two back ends.

The API never imports torch; predicting a model's step needs torch and transformers (the
step is traced on fake tensors, workers/models/predict.py). Each API process has one
``Predictor`` (``shared(settings)``), whose answers come from one of two back ends
(app/experiments/predictor_backends.py): children of its own (``python -m
workers.models.predict``, as under ``vramlab up``: ``VRAMLAB_MODEL_PREDICTOR_CHILDREN`` of
them, at a lower CPU priority than the API), or a predictor service
(``VRAMLAB_PREDICTOR_URL``, ``vramlab predictor``) for deployments whose API image has no
torch. Without either, there is no prediction and the answer says so.

Entry points (for submits, fits and plans alike):

- ``predictor.predict(params, device_type, allocator=None, submitter=INTERNAL)`` blocks
  its thread until the answer: a ``ModelPrediction``; ``CatalogError`` for a spec the
  predictor refuses (it cannot be built, it is too costly to trace, or its prediction
  passed the limit); ``Busy`` (503) when the predictor cannot take it now.
- ``await predictor.apredict(...)``, the same without holding a thread while it waits.

Every spec is answered once: answers, refusals and time-outs are remembered by spec (a
time-out for ``TIMEOUT_MEMORY_S``), and a spec asked again while it is being predicted
waits for that answer. Specs waiting for a lane are served in turns across submitters
(a submitter is its token, or its address when auth is off), each with at most
``per_submitter`` waiting and, while others have asked in the last minute, on all lanes
but one while anyone else has a spec waiting (a lane nobody else needs is not left idle):
one submitter's flood delays its own specs, not others', by one prediction at most.

Within a submitter's turn, a lane takes a spec of a family it has answered before (the
same spec but for its batch size) rather than one of a family another idle lane answered:
a child answers a family's other batch sizes from its traces at three, without tracing
(workers/models/families.py). A spec whose family's lane is busy goes to any free lane.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import logging
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from app.catalog import CatalogError
from app.core.config import Settings
from app.core.db import Busy
from app.experiments.predictor_backends import (
    Backend,
    Children,
    Remote,
    TimedOut,
    Unavailable,
)

log = logging.getLogger(__name__)

CACHE_SIZE = 512
CACHE_LOG_BYTES = 64 * 2**20  # what the remembered answers' allocation logs may hold
TIMEOUT_MEMORY_S = 600.0  # a time-out is remembered this long (a busy machine heals)
SHARED_S = 60.0  # submitters heard from within this long share the lanes
FAMILIES = 256  # families whose lane the pool remembers
PASSED_LIMIT = "passed the limit"  # in a refusal for time (the predictor's and the service's)
INTERNAL = "vramlab"  # the submitter of the service's own predictions (fit searches)
EXTRA = ("log", "edges")  # what a request may add to the protocol's fields
UNAVAILABLE = (
    "no model predictor on this API host (torch and transformers are not installed "
    "beside it, and no VRAMLAB_PREDICTOR_URL is set): the peak is measured, not predicted"
)


@dataclass(frozen=True)
class ModelPrediction:
    """A predicted peak; ``None`` figures where the step could not be traced (the
    caveats say why: the spec still runs, measured only)."""

    peak_allocated: int | None
    peak_reserved: int | None
    categories: dict[str, int] | None
    caveats: tuple[str, ...] = ()
    seconds: float = 0.0
    # Asked for by a plan (``extra``): the allocation log replayed for reserved (packed
    # ints, int64 bytes), and cards' edges from the logs of a few values (one each).
    log: bytes | None = None
    edges: tuple[dict[str, int | None], ...] | None = None
    # The model's parameters and those its optimizer trains (LoRA: its adapters), at its
    # full depth; None from a predictor that does not count them.
    parameter_count: int | None = None
    trainable_parameter_count: int | None = None

    def log_ints(self) -> list[int] | None:
        return None if self.log is None else array("q", self.log).tolist()


def installed() -> bool:
    """Whether the predictor's child can start here: the worker's package, torch and
    transformers importable (checked without importing them)."""
    needed = ("workers", "torch", "transformers")
    return all(importlib.util.find_spec(name) is not None for name in needed)


@dataclass
class _Job:
    key: str
    request: dict[str, Any]
    deadline: float  # a lane must take it by then (monotonic), or it is answered Busy
    family: str | None = None  # the spec but for its batch size (None: no family)
    waiters: list[Future[ModelPrediction | CatalogError]] = field(default_factory=list)


class Predictor:
    """A pool of lanes (one back-end child or connection each), fair across submitters."""

    def __init__(
        self,
        backend: Backend,
        timeout_s: float,
        wait_s: float,
        per_submitter: int = 16,
    ) -> None:
        self.backend = backend
        self.timeout_s = timeout_s  # one prediction, once a lane has it
        self.wait_s = wait_s  # how long a spec may wait for a lane
        self.per_submitter = per_submitter
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Job]] = {}
        self._turns: deque[str] = deque()  # submitters with specs waiting, next first
        self._inflight: dict[str, _Job] = {}
        self._running: dict[str, int] = {}  # specs on a lane, by submitter
        self._seen: dict[str, float] = {}  # when each submitter last asked (monotonic)
        self._cache: OrderedDict[str, tuple[ModelPrediction | CatalogError, float]] = OrderedDict()
        self._log_bytes = 0  # held by the remembered answers' logs
        self._threads: list[threading.Thread] = []
        self._closed = False
        # When a lane was first ready: a spec's wait counts from then at the earliest (the
        # pool's first start, importing torch, is no queue; on a busy machine it is long).
        self._ready_at: float | None = None
        self._ready: set[int] = set()  # lanes whose child has started
        self._next = 0
        self._idle: set[int] = set()  # lanes waiting for a spec
        self._lane_of: OrderedDict[str, int] = OrderedDict()  # the lane that has a family

    # The interface.

    def predict(
        self,
        params: Mapping[str, Any],
        device_type: str,
        allocator: Mapping[str, Any] | None = None,
        submitter: str = INTERNAL,
        extra: Mapping[str, Any] | None = None,
    ) -> ModelPrediction:
        """The predicted peak of the spec's reported step (``allocator``: the spec's
        caching-allocator settings, which change what is reserved; ``extra``: more of the
        predictor's protocol, ``{"log": true}`` or ``{"edges": ...}``, for plans). Blocks
        its thread."""
        future = self.submit(params, device_type, allocator, submitter, extra)
        try:
            return _unwrap(future.result(timeout=self._patience()))
        except FutureTimeout:
            future.cancel()
            raise self._too_long() from None

    async def apredict(
        self,
        params: Mapping[str, Any],
        device_type: str,
        allocator: Mapping[str, Any] | None = None,
        submitter: str = INTERNAL,
        extra: Mapping[str, Any] | None = None,
    ) -> ModelPrediction:
        """``predict`` for a coroutine: it waits without holding a thread."""
        future = self.submit(params, device_type, allocator, submitter, extra)
        try:
            outcome = await asyncio.wait_for(asyncio.wrap_future(future), self._patience())
        except TimeoutError:
            raise self._too_long() from None
        return _unwrap(outcome)

    def submit(
        self,
        params: Mapping[str, Any],
        device_type: str,
        allocator: Mapping[str, Any] | None,
        submitter: str,
        extra: Mapping[str, Any] | None = None,
    ) -> Future[ModelPrediction | CatalogError]:
        """A future of the spec's answer (done at once if it is remembered); Busy when
        the submitter already has ``per_submitter`` specs waiting."""
        allocator = dict(allocator or {})
        extra = {k: v for k, v in (extra or {}).items() if k in EXTRA}
        key = json.dumps([params, device_type, allocator, extra], sort_keys=True)
        if len(key) > 1024:  # an edge request carries its logs: remembered by their digest
            key = hashlib.sha256(key.encode()).hexdigest()
        future: Future[ModelPrediction | CatalogError] = Future()
        with self._cond:
            if self._closed:
                raise Busy("the model predictor is stopping", retry_after=2)
            hit = self._remembered(key)
            if hit is not None:
                future.set_result(hit)
                return future
            self._seen[submitter] = time.monotonic()
            if len(self._seen) > 4 * CACHE_SIZE:  # forget those not heard from lately
                self._seen = {
                    k: t for k, t in self._seen.items() if time.monotonic() - t < SHARED_S
                }
            job = self._inflight.get(key)
            if job is None:
                waiting = self._queues.setdefault(submitter, deque())
                if len(waiting) >= self.per_submitter:
                    raise Busy(
                        f"you have {len(waiting)} model specs waiting for a prediction; "
                        f"submit more once they are answered",
                        retry_after=2,
                    )
                self._next += 1
                request = {
                    "id": self._next,
                    "params": dict(params),
                    "device": device_type,
                    "allocator": allocator,
                    "submitter": submitter,
                    "limit_s": self.timeout_s,
                    **extra,
                }
                job = _Job(key, request, time.monotonic() + self.wait_s, _family(request))
                waiting.append(job)
                if submitter not in self._turns:
                    self._turns.append(submitter)
                self._inflight[key] = job
                self._start_lanes()
                self._cond.notify_all()  # the lane of its family, if idle, takes it
            job.waiters.append(future)
        return future

    @property
    def ready_lanes(self) -> int:
        """Lanes whose child (or connection) has started and can take a spec."""
        with self._cond:
            return len(self._ready)

    def start(self) -> None:
        """Start every lane now (each warms its child) instead of at the first spec."""
        with self._cond:
            self._start_lanes()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.backend.close()

    # The lanes.

    def _start_lanes(self) -> None:
        if self._threads:
            return
        for lane in range(self.backend.lanes):
            thread = threading.Thread(target=self._lane, args=(lane,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _lane(self, lane: int) -> None:
        while not self._closed:
            try:
                self.backend.warm(lane)  # before it takes a spec: a start is not a prediction
            except Unavailable as exc:
                log.warning("%s", exc)
                with self._cond:
                    self._ready.discard(lane)
                time.sleep(1)
            else:
                with self._cond:
                    self._ready.add(lane)
                    if self._ready_at is None:
                        self._ready_at = time.monotonic()
            job = self._take(lane)
            if job is None:
                break
            if all(w.cancelled() for w in job.waiters):
                self._settle(job, None)
                continue
            ready_at = self._ready_at if self._ready_at is not None else time.monotonic()
            if time.monotonic() > max(job.deadline, ready_at + self.wait_s):
                self._settle(job, Busy("the model predictor is busy", retry_after=2))
                continue
            try:
                # The child stops at timeout_s of CPU time; the wall clock only backs it up
                # (a busy machine runs a nice'd child slowly, through no fault of the spec).
                wall = 4 * self.timeout_s + 20
                answer = self.backend.ask(lane, job.request, wall)
                outcome: ModelPrediction | CatalogError | Busy = _outcome(answer)
            except TimedOut:
                outcome = CatalogError(
                    "params",
                    f"predicting this spec {PASSED_LIMIT}: no answer in {wall:g} s; it is "
                    f"refused; a smaller model or config predicts in time",
                )
            except Unavailable as exc:
                outcome = Busy(str(exc), retry_after=5)
            except Exception as exc:  # a bug here must not stop the lane
                log.exception("model predictor lane %d failed", lane)
                outcome = Busy(f"the model predictor failed: {exc}", retry_after=5)
            self._settle(job, outcome)
        self.backend.close()  # a child started while the pool closed goes with it

    def _take(self, lane: int) -> _Job | None:
        """The next submitter's next spec, in turns; while others have asked lately, a
        submitter already running on all lanes but one comes after every submitter below
        that (and takes the last lane only when none of them has a spec waiting). Of a
        submitter's specs, the first this lane may take (``_mine``)."""
        with self._cond:
            self._idle.add(lane)
            try:
                while not self._closed:
                    now = time.monotonic()
                    recent = sum(1 for t in self._seen.values() if now - t < SHARED_S)
                    cap = max(1, self.backend.lanes - 1) if recent > 1 else self.backend.lanes
                    below = [who for who in self._turns if self._running.get(who, 0) < cap]
                    # Everyone waiting at the cap: nobody else needs this free lane now, so
                    # it is not left idle (a spec from another submitter waits at most for
                    # one prediction, which the per-prediction limit bounds).
                    for who in below or list(self._turns):
                        job = self._mine(lane, who)
                        if job is not None:
                            return self._taken(lane, who, job)
                    self._cond.wait()
                return None
            finally:
                self._idle.discard(lane)

    def _mine(self, lane: int, submitter: str) -> _Job | None:
        """The submitter's first spec whose family this lane has, has no lane, or has a
        busy one; None where each waits for another idle lane (which takes it now)."""
        for job in self._queues[submitter]:
            owner = None if job.family is None else self._lane_of.get(job.family)
            if owner is None or owner == lane or owner not in self._idle:
                return job
        return None

    def _taken(self, lane: int, submitter: str, job: _Job) -> _Job:
        self._turns.remove(submitter)
        waiting = self._queues[submitter]
        waiting.remove(job)
        if waiting:
            self._turns.append(submitter)  # its next spec waits for everyone else's turn
        else:
            del self._queues[submitter]
        self._running[submitter] = self._running.get(submitter, 0) + 1
        if job.family is not None:
            if job.family not in self._lane_of:
                self._lane_of[job.family] = lane
                while len(self._lane_of) > FAMILIES:
                    self._lane_of.popitem(last=False)
            self._lane_of.move_to_end(job.family)
        job.request["lane"] = lane  # which child answered (logs, tests)
        self._cond.notify_all()  # a lane that left this one a spec looks again
        return job

    def _settle(self, job: _Job, outcome: ModelPrediction | CatalogError | Busy | None) -> None:
        with self._cond:
            self._inflight.pop(job.key, None)
            who = job.request["submitter"]
            self._running[who] -= 1
            if not self._running[who]:
                del self._running[who]
            self._cond.notify_all()  # a submitter at its cap may go on
            if isinstance(outcome, ModelPrediction | CatalogError):
                timed_out = isinstance(outcome, CatalogError) and PASSED_LIMIT in outcome.message
                expires = time.monotonic() + TIMEOUT_MEMORY_S if timed_out else float("inf")
                self._cache[job.key] = (outcome, expires)
                self._log_bytes += _log_size(outcome)
                while len(self._cache) > CACHE_SIZE or self._log_bytes > CACHE_LOG_BYTES:
                    _, (gone, _) = self._cache.popitem(last=False)
                    self._log_bytes -= _log_size(gone)
            waiters = list(job.waiters)
        for waiter in waiters:
            if outcome is None or waiter.cancelled():
                continue
            if isinstance(outcome, Busy):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)

    def _remembered(self, key: str) -> ModelPrediction | CatalogError | None:
        hit = self._cache.get(key)
        if hit is None:
            return None
        outcome, expires = hit
        if time.monotonic() > expires:
            del self._cache[key]
            self._log_bytes -= _log_size(outcome)
            return None
        self._cache.move_to_end(key)
        return outcome

    def _patience(self) -> float:
        return self.wait_s + 5 * self.timeout_s + 30  # the lane's own limits settle it first

    def _too_long(self) -> Busy:
        return Busy("the model predictor did not answer in time", retry_after=5)


def _unwrap(outcome: ModelPrediction | CatalogError) -> ModelPrediction:
    if isinstance(outcome, CatalogError):
        raise outcome
    return outcome


def _log_size(outcome: ModelPrediction | CatalogError) -> int:
    return len(outcome.log) if isinstance(outcome, ModelPrediction) and outcome.log else 0


def _outcome(answer: Mapping[str, Any]) -> ModelPrediction | CatalogError:
    if "edges" in answer and "error" not in answer:  # cards' edges (a plan's), no peak
        found = tuple(
            {k: None if e.get(k) is None else int(e[k]) for k in ("edge", "reserved_at_value")}
            for e in answer["edges"] or ()
        )
        return ModelPrediction(None, None, None, edges=found)
    error = answer.get("error")
    if error is not None and error.get("unpredictable"):
        return ModelPrediction(None, None, None, (str(error.get("message")),))
    if error is not None:
        return CatalogError(str(error.get("field", "params")), str(error.get("message")))
    return ModelPrediction(
        peak_allocated=int(answer["peak_allocated"]),
        peak_reserved=int(answer["peak_reserved"]),
        categories={k: int(v) for k, v in answer.get("categories", {}).items()},
        caveats=tuple(answer.get("caveats", ())),
        seconds=float(answer.get("seconds", 0.0)),
        log=None if answer.get("log") is None else array("q", answer["log"]).tobytes(),
        parameter_count=_count(answer.get("parameter_count")),
        trainable_parameter_count=_count(answer.get("trainable_parameter_count")),
    )


def _family(request: Mapping[str, Any]) -> str | None:
    """What a spec's family is known by: the request but for its id and batch size (an
    edge request, a plan's search, has none)."""
    if "edges" in request:
        return None
    params = {k: v for k, v in request["params"].items() if k != "batch_size"}
    rest = {k: v for k, v in request.items() if k not in ("id", "params", "submitter")}
    return json.dumps([params, rest], sort_keys=True)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def make(settings: Settings) -> Predictor | None:
    """A predictor for these settings: the service at ``predictor_url``, else children
    of this process's own; None where neither is possible (or predictions are off)."""
    if not settings.model_predictions:
        return None
    backend: Backend
    if settings.predictor_url:
        backend = Remote(
            settings.predictor_url,
            settings.model_predictor_children,
            settings.predictor_token,
            settings.model_predict_wait_s,
        )
    elif installed():
        backend = Children(settings.model_predictor_children, settings.model_predictor_nice)
    else:
        return None
    return Predictor(
        backend,
        settings.model_predict_timeout_s,
        settings.model_predict_wait_s,
        settings.model_predict_per_submitter,
    )


_shared: dict[str, Predictor | None] = {}
_shared_lock = threading.Lock()


def shared(settings: Settings) -> Predictor | None:
    """This process's predictor for these settings (one per distinct back end and
    limits), or None where there is none."""
    key = json.dumps(
        [
            settings.model_predictions,
            settings.predictor_url,
            settings.predictor_token,
            settings.model_predictor_children,
            settings.model_predictor_nice,
            settings.model_predict_timeout_s,
            settings.model_predict_wait_s,
            settings.model_predict_per_submitter,
        ]
    )
    with _shared_lock:
        if key not in _shared:
            _shared[key] = make(settings)
        return _shared[key]


def ready_lanes() -> int:
    """Started lanes of this process's predictors (none is made by asking)."""
    with _shared_lock:
        return sum(p.ready_lanes for p in _shared.values() if p is not None)


def close_shared() -> None:
    with _shared_lock:
        for predictor in _shared.values():
            if predictor is not None:
                predictor.close()
        _shared.clear()
