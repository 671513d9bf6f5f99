"""The worker loop: register, claim, heartbeat, run, upload, report; stop on SIGTERM.

It talks to the API over HTTP only and never imports torch: the runner owns the
process that has torch. A first SIGTERM (or Ctrl-C) stops claiming and lets the
running experiment finish; a second one cancels it and gives the lease back.
"""

import gzip
import itertools
import logging
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.contract import Status
from workers.client import ApiClient, LeaseLost, UnknownWorker, with_retry

log = logging.getLogger("vramlab.worker")
TRACE_CHUNK_EVENTS = 50_000


class OutcomeLike(Protocol):
    status: str
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    trace_path: Path | None
    trace_events: int


class RunnerLike(Protocol):
    def start(self) -> None: ...
    def capabilities(self) -> dict[str, Any]: ...
    def run(
        self, spec: dict[str, Any], *, should_cancel: Any = ..., work_dir: Path | None = None
    ) -> Any: ...
    def close(self) -> None: ...


@dataclass
class Lease:
    """One claimed experiment while it runs: what the heartbeat thread learned."""

    exp_id: str
    token: str
    cancel_requested: bool = False
    lost: bool = False
    done: threading.Event = field(default_factory=threading.Event)


def trace_chunks(path: Path, size: int = TRACE_CHUNK_EVENTS) -> Iterator[bytes]:
    """The runner's gzip NDJSON trace, re-cut into gzip chunks of ``size`` events."""
    with gzip.open(path, "rb") as f:
        lines = (line for line in f if line.strip())
        while batch := list(itertools.islice(lines, size)):
            yield gzip.compress(b"".join(batch), compresslevel=6)


class WorkerLoop:
    def __init__(
        self,
        client: ApiClient,
        runner: RunnerLike,
        *,
        name: str | None = None,
        wait_s: float = 20.0,
        max_experiments: int | None = None,
    ) -> None:
        self.client = client
        self.runner = runner
        self.name = name or socket.gethostname()
        self.wait_s = wait_s
        self.max_experiments = max_experiments
        self.stopping = threading.Event()
        self.aborting = threading.Event()
        self.worker_id: str | None = None
        self.heartbeat_seconds = 10.0
        self.capabilities: dict[str, Any] = {}

    # -- signals -----------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: object) -> None:
            if self.stopping.is_set():
                log.warning(
                    "second %s: cancelling the running experiment", signal.Signals(signum).name
                )
                self.aborting.set()
            else:
                log.info(
                    "%s: finishing the current experiment, then exiting",
                    signal.Signals(signum).name,
                )
                self.stopping.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- main loop ---------------------------------------------------------------
    def register(self) -> bool:
        reply = with_retry(
            lambda: self.client.register(self.name, socket.gethostname(), self.capabilities),
            what="register",
            should_stop=self.stopping.is_set,
        )
        if reply is None:
            return False
        self.worker_id = reply["worker_id"]
        self.heartbeat_seconds = float(reply["heartbeat_seconds"])
        log.info(
            "registered as %s (%s)", self.worker_id, ", ".join(self.capabilities["device_types"])
        )
        return True

    def run(self) -> int:
        self.runner.start()
        self.capabilities = self.runner.capabilities()
        if not self.register():
            return 0
        done = 0
        while not self.stopping.is_set():
            if self.max_experiments is not None and done >= self.max_experiments:
                break
            try:
                claimed = with_retry(
                    lambda: self.client.claim(str(self.worker_id), self.wait_s),
                    what="claim",
                    should_stop=self.stopping.is_set,
                )
            except UnknownWorker:
                log.warning("the API forgot this worker; registering again")
                if not self.register():
                    break
                continue
            if claimed is None:
                continue
            self.execute(claimed)
            done += 1
        return done

    # -- one experiment ----------------------------------------------------------
    def _heartbeats(self, lease: Lease) -> None:
        while not lease.done.wait(self.heartbeat_seconds):
            try:
                reply = self.client.heartbeat(lease.exp_id, lease.token)
                lease.cancel_requested = bool(reply.get("cancel_requested"))
            except LeaseLost:
                log.warning("lease on %s lost: stopping it", lease.exp_id)
                lease.lost = True
                return
            except Exception as exc:  # the API may be down for a while: keep trying
                log.warning("heartbeat for %s failed: %s", lease.exp_id, exc)

    def execute(self, claimed: dict[str, Any]) -> None:
        lease = Lease(exp_id=claimed["id"], token=claimed["lease_token"])
        spec = claimed["spec"]
        log.info(
            "running %s: %s %s %s on %s",
            lease.exp_id,
            spec["op"],
            spec["shape"],
            spec["dtype"],
            spec["device"],
        )
        beat = threading.Thread(target=self._heartbeats, args=(lease,), daemon=True)
        beat.start()
        work_dir = Path(tempfile.mkdtemp(prefix="vramlab-"))
        try:
            outcome = self.runner.run(
                spec,
                should_cancel=lambda: (
                    lease.cancel_requested or lease.lost or self.aborting.is_set()
                ),
                work_dir=work_dir,
            )
            lease.done.set()
            beat.join()
            if lease.lost:
                return
            if (
                outcome.status == Status.CANCELLED
                and self.aborting.is_set()
                and not lease.cancel_requested
            ):
                self._call(lambda: self.client.release(lease.exp_id, lease.token), "release")
                return
            self._report(lease, outcome)
        finally:
            lease.done.set()
            shutil.rmtree(work_dir, ignore_errors=True)

    def _call(self, fn: Any, what: str) -> bool:
        try:
            with_retry(fn, what=what, should_stop=lambda: False)
        except LeaseLost:
            log.warning("%s refused: the lease was lost", what)
            return False
        return True

    def _report(self, lease: Lease, outcome: OutcomeLike) -> None:
        events = 0
        if outcome.trace_path is not None and outcome.trace_path.exists():
            for seq, gz in enumerate(trace_chunks(outcome.trace_path)):

                def upload(seq: int = seq, gz: bytes = gz) -> None:
                    self.client.upload_trace(lease.exp_id, lease.token, seq, gz)

                if not self._call(upload, "trace upload"):
                    return
            events = outcome.trace_events
        body = {
            "status": outcome.status,
            "result": outcome.result,
            "error": outcome.error,
            "trace_events": events,
        }
        if self._call(lambda: self.client.report(lease.exp_id, lease.token, body), "report"):
            log.info(
                "%s: %s",
                lease.exp_id,
                outcome.status if outcome.error is None else outcome.error["type"],
            )
