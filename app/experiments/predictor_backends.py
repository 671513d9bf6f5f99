"""Where the model predictor's answers come from: children of the API's own, or a service.

Both answer one request ``{"id", "params", "device", "allocator"}`` with the answer of
``workers.models.predict.answer`` (a prediction, or ``{"error": ...}``), one per lane at a
time; the pool in app/experiments/predictor.py runs one lane per thread.

- ``Children``: one ``python -m workers.models.predict`` child per lane (JSON lines on its
  stdin and stdout), at a lower CPU priority than the API (``nice``), started ahead and
  kept warm; a child that passes the limit of one prediction is killed and started again
  (its start, importing torch, is not counted in the limit).
- ``Remote``: a predictor service (``vramlab predictor``, app/experiments/predictor_service.py),
  for deployments whose API image has no torch: one HTTP request per prediction. The
  service applies the limit and answers a spec past it as refused; a service that does
  not answer at all is unavailable (503), never the spec's fault.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from typing import IO, Any, Protocol

import httpx

log = logging.getLogger(__name__)

START_S = 180.0  # a child's start (importing torch and transformers) on a busy machine


class TimedOut(Exception):
    """The prediction passed its limit (the lane's child was stopped with it)."""


class Unavailable(Exception):
    """The back end could not answer (a child that would not start, a service away)."""


class Backend(Protocol):
    lanes: int

    def ask(self, lane: int, request: dict[str, Any], timeout_s: float) -> dict[str, Any]: ...

    def warm(self, lane: int) -> None: ...

    def close(self) -> None: ...


class _Child:
    def __init__(self, nice: int) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",  # it predicts; it never touches a GPU
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",  # fake tensors compute nothing: no thread pools
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.models.predict", "--nice", str(nice)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        self.ready = False

    def read(self, timeout_s: float) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout_s)
        if line is None:
            raise EOFError("the predictor child exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def wait_ready(self) -> None:
        while not self.ready:
            self.ready = bool(self.read(START_S).get("ready"))

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()


class Children:
    """One warm child per lane."""

    def __init__(self, lanes: int, nice: int = 10) -> None:
        self.lanes = lanes
        self.nice = nice
        self._children: list[_Child | None] = [None] * lanes

    def warm(self, lane: int) -> None:
        """Start the lane's child and wait until it has imported torch."""
        child = self._children[lane]
        if child is None or child.proc.poll() is not None:
            child = self._children[lane] = _Child(self.nice)
        try:
            child.wait_ready()
        except (OSError, EOFError, ValueError, queue.Empty) as exc:
            self._stop(lane)
            raise Unavailable(f"the model predictor did not start: {exc}") from None

    def ask(self, lane: int, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.warm(lane)
        child = self._children[lane]
        assert child is not None and child.proc.stdin is not None
        try:
            child.proc.stdin.write(json.dumps(request) + "\n")
            child.proc.stdin.flush()
            while True:
                answer = child.read(timeout_s)
                if answer.get("id") == request["id"]:
                    return answer
        except queue.Empty:
            self._stop(lane)
            raise TimedOut() from None
        except (OSError, EOFError, ValueError) as exc:
            self._stop(lane)
            raise Unavailable(f"the model predictor failed: {exc}") from None

    def close(self) -> None:
        for lane in range(self.lanes):
            self._stop(lane)

    def _stop(self, lane: int) -> None:
        child, self._children[lane] = self._children[lane], None
        if child is not None:
            child.kill()


class Remote:
    """A predictor service at ``url``; ``lanes`` requests in flight at most."""

    def __init__(self, url: str, lanes: int, token: str | None = None, wait_s: float = 30) -> None:
        self.lanes = lanes
        self.wait_s = wait_s  # the service's own wait for a lane
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers)

    def warm(self, lane: int) -> None:
        return None

    def ask(self, lane: int, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # The service applies the limit itself (a spec past it is answered as refused);
        # this waits longer than the service waits for its own answer.
        patience = self.wait_s + 2 * timeout_s + 30
        try:
            response = self._http.post("/v1/predict", json=request, timeout=patience)
        except httpx.HTTPError as exc:
            raise Unavailable(f"the predictor service did not answer: {exc!r}") from None
        if response.status_code != 200:
            raise Unavailable(f"the predictor service answered {response.status_code}")
        answer: dict[str, Any] = response.json()
        return answer

    def close(self) -> None:
        self._http.close()


def _pump(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    assert stream is not None
    for line in stream:
        if line.strip():
            lines.put(line)
    lines.put(None)
