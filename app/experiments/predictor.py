"""Predictions of model experiments, from a warm child process beside the API.

The API never imports torch; predicting a model's step needs torch and transformers (the
step is traced on fake tensors, workers/models/predict.py). So each API process keeps one
child, ``python -m workers.models.predict``, and talks to it in JSON lines: one request,
one answer, one at a time. Answers are cached by spec. Without torch or transformers on
the API's host (the API image has neither) there is no prediction and the answer says so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from app.catalog import CatalogError
from app.core.db import Busy

log = logging.getLogger(__name__)

CACHE_SIZE = 512
UNAVAILABLE = (
    "no model predictor on this API host (torch and transformers are not installed "
    "beside it): the peak is measured, not predicted"
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


def installed() -> bool:
    """Whether the predictor's child can start here: the worker's package, torch and
    transformers importable (checked without importing them)."""
    needed = ("workers", "torch", "transformers")
    return all(importlib.util.find_spec(name) is not None for name in needed)


class Predictor:
    """One warm ``workers.models.predict`` child; thread-safe, one request at a time."""

    def __init__(self, timeout_s: float, wait_s: float) -> None:
        self.timeout_s = timeout_s  # one answer (the first includes importing torch)
        self.wait_s = wait_s  # how long a request waits for the child to be free
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._cache: OrderedDict[str, ModelPrediction | CatalogError] = OrderedDict()
        self._next = 0
        self._cache_lock = threading.Lock()

    def predict(
        self,
        params: Mapping[str, Any],
        device_type: str,
        allocator: Mapping[str, Any] | None = None,
    ) -> ModelPrediction:
        """The predicted peak of the spec's reported step (``allocator``: the spec's
        caching-allocator settings, which change what is reserved); CatalogError for a
        spec the predictor refuses; Busy (503) when it is taken or too slow."""
        allocator = dict(allocator or {})
        key = json.dumps([params, device_type, allocator], sort_keys=True)
        hit = self._cached(key)
        if hit is None:
            if not self._lock.acquire(timeout=self.wait_s):
                raise Busy("the model predictor is busy with other specs", retry_after=2)
            try:
                hit = self._cached(key)
                if hit is None:
                    hit = self._ask(dict(params), device_type, allocator)
                    with self._cache_lock:
                        self._cache[key] = hit
                        while len(self._cache) > CACHE_SIZE:
                            self._cache.popitem(last=False)
            finally:
                self._lock.release()
        if isinstance(hit, CatalogError):
            raise hit
        return hit

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()

    # Internals.

    def _cached(self, key: str) -> ModelPrediction | CatalogError | None:
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _start(self) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",  # it predicts; it never touches a GPU
            "PYTHONUNBUFFERED": "1",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.models.predict"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self._lines = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, self._lines), daemon=True).start()
        return proc

    def _ask(
        self, params: dict[str, Any], device_type: str, allocator: dict[str, Any]
    ) -> ModelPrediction | CatalogError:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        self._next += 1
        ident = self._next
        request = {"id": ident, "params": params, "device": device_type, "allocator": allocator}
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            while True:
                line = self._lines.get(timeout=self.timeout_s)
                if line is None:
                    raise EOFError("the predictor exited")
                answer = json.loads(line)
                if answer.get("id") == ident:
                    break
        except (OSError, EOFError, ValueError, queue.Empty) as exc:
            log.warning("model predictor failed (%s); it restarts on the next request", exc)
            self.close()
            raise Busy(
                f"the model predictor did not answer within {self.timeout_s:g} s", retry_after=5
            ) from None
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
        )


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    assert stream is not None
    for line in stream:
        if line.strip():
            lines.put(line)
    lines.put(None)


_shared: Predictor | None = None
_shared_lock = threading.Lock()


def shared(timeout_s: float, wait_s: float) -> Predictor | None:
    """This process's predictor, or None where torch and transformers are missing."""
    global _shared
    if not installed():
        return None
    with _shared_lock:
        if _shared is None:
            _shared = Predictor(timeout_s, wait_s)
        return _shared


def close_shared() -> None:
    with _shared_lock:
        if _shared is not None:
            _shared.close()
