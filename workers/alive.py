"""The worker's sign of life for a liveness probe: a file whose modification time is the
moment by which the worker's loop will have made progress again.

Each step of the loop says how long it may take before the next: a call to the API (one
attempt, its time-out and a back-off), the long poll for work, an experiment (its own time
limit, which the runner enforces, and room to start and stop it). A probe that finds that
moment passed has found a loop that stalled: a long experiment never looks like one, and a
loop that keeps retrying an API that is down is not one either (restarting it would not
help). With several loops (``--concurrency``) the file holds the earliest of their moments.

The probe (Kubernetes' exec liveness probe, compose's healthcheck) needs a shell only:

    test "$(stat -c %Y FILE)" -ge "$(date +%s)"
"""

import os
import threading
import time
from pathlib import Path

# One call to the API: the client's 30 s time-out, a back-off of at most 10 s before the
# next attempt, and room to spare.
CALL_S = 60.0
# Before the first loop runs: the runner's start (the forkserver imports torch) and its
# probe of the device (at most workers.runner.PROBE_TIMEOUT_S, 120 s).
START_S = 300.0
# An experiment beyond its own time limit: its child's start (a fresh interpreter imports
# torch), the kill after a time-out, and its outcome.
RUN_SLACK_S = 120.0


class Pulse:
    """The moments by which each loop (by key) will have made progress again, written as
    the earliest of them to ``path``; with no path, nothing is written."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._due: dict[object, float] = {}
        self._lock = threading.Lock()

    def due(self, key: object, seconds: float) -> None:
        """The loop ``key`` will have made progress again within ``seconds`` from now."""
        with self._lock:
            self._due[key] = time.time() + seconds
            self._write()

    def done(self, key: object) -> None:
        """The loop ``key`` has ended: it no longer holds the others' moment back."""
        with self._lock:
            if self._due.pop(key, None) is not None and self._due:
                self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        moment = min(self._due.values())
        self.path.touch()
        os.utime(self.path, (moment, moment))
