"""The runner's children: a process and its pipe, and the pool of shared ones.

A shared child answers twice for each spec: its result, then, once it has emptied and
checked itself (workers/shared.py), whether it can serve another. The pool reads that
second answer when it hands the child its next spec, so the emptying stays off every
experiment's clock. Torch-free, like the runner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerProcess, SpawnProcess

EXIT_GRACE_S = 10.0  # after a result, how long a child may take to exit before a kill
# When the worker stops, how long its idle children (running nothing) may take to exit,
# all together, before they are killed: a busy host must not hold an exit for seconds.
IDLE_EXIT_GRACE_S = 0.5
# After a result, how long a shared child may take to empty itself before it is retired.
READY_TIMEOUT_S = 30.0

log = logging.getLogger("vramlab.worker")


@dataclass
class Child:
    proc: ForkServerProcess | SpawnProcess
    conn: Connection  # the parent's end: the result arrives on it (a spare's spec leaves on it)
    runs: int = 0  # specs handed to it (a shared child serves many)
    warmed: bool = False  # a model child that said it imported what a trial imports

    def warm(self, timeout: float) -> str | None:
        """A model child's first word, that it is warm: None once it came, else why not
        (it exited, or said nothing within ``timeout`` seconds)."""
        try:
            if not self.conn.poll(timeout):
                return f"it was not warm within {timeout:g} s"
            answer = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return "it exited"
        self.warmed = bool(answer.get("warm"))
        return None if self.warmed else str(answer.get("why"))

    def discard(self) -> None:
        """Stop it now, whatever it is doing."""
        self.conn.close()
        if self.proc.is_alive():
            self.proc.kill()
        reap(self.proc)

    def let_go(self) -> None:
        """Close its pipe (EOF: it exits once it has nothing left to do) and reap it in the
        background, off every experiment's clock."""
        self.conn.close()
        reap_soon(self.proc)

    def ready(self) -> str | None:
        """A shared child's second answer: None if it emptied itself after its last
        result and can serve again, else why not."""
        try:
            if not self.conn.poll(READY_TIMEOUT_S):
                return f"it did not empty itself within {READY_TIMEOUT_S:g} s"
            answer = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return "it exited"
        return None if answer.get("ready") else str(answer.get("why"))


class SharedPool:
    """Idle shared children, per device: at most ``size`` a device, each retired after
    ``max_runs`` specs. Thread-safe; a closed pool keeps nothing."""

    def __init__(self, size: int, max_runs: int) -> None:
        self.size = size
        self.max_runs = max_runs
        self._idle: dict[str, list[Child]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, device: str) -> Child | None:
        """An idle child that can serve again (the one used last), or None."""
        while True:
            with self._lock:
                pool = self._idle.get(device)
                if not pool:
                    return None
                child = pool.pop()
            why = child.ready()
            if why is None:
                return child
            log.info("retiring shared process %s: %s", child.proc.pid, why)
            child.discard()

    def give_back(self, device: str, child: Child) -> None:
        """After its result: keep it for the next shared spec, or let it go (it served its
        share, enough are idle, or the pool is closed)."""
        with self._lock:
            pool = self._idle.setdefault(device, [])
            if not self._closed and child.runs < self.max_runs and len(pool) < self.size:
                pool.append(child)
                return
        child.let_go()

    def idle(self, device: str) -> list[ForkServerProcess | SpawnProcess]:
        with self._lock:
            return [child.proc for child in self._idle.get(device, [])]

    def close(self) -> list[Child]:
        """Keep nothing from now on; the idle children, for the caller to retire."""
        with self._lock:
            self._closed = True
            idle = [child for pool in self._idle.values() for child in pool]
            self._idle.clear()
        return idle


def reap(proc: ForkServerProcess | SpawnProcess) -> None:
    proc.join(EXIT_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join(EXIT_GRACE_S)
    with contextlib.suppress(ValueError):
        proc.close()


def retire_idle(children: list[Child], grace_s: float = IDLE_EXIT_GRACE_S) -> None:
    """Stop children that run nothing (spares, idle shared ones): EOF to all at once, a
    shared ``grace_s`` to exit, then a kill for the rest. Bounded however loaded the host."""
    for child in children:
        child.conn.close()
    deadline = time.monotonic() + grace_s
    for child in children:
        child.proc.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.proc.is_alive():
            child.proc.kill()
    for child in children:
        child.proc.join(EXIT_GRACE_S)
        with contextlib.suppress(ValueError):
            child.proc.close()


def reap_soon(proc: ForkServerProcess | SpawnProcess) -> None:
    """Reap in a thread: a child that answered exits by itself (for CUDA, a context
    teardown of tens of milliseconds), off every experiment's clock."""
    threading.Thread(target=reap, args=(proc,), name="vramlab-reap", daemon=True).start()
