"""The worker loop: register, claim, heartbeat, run, upload, report; stop on SIGTERM.

It talks to the API over HTTP only and never imports torch: the runner owns the
process that has torch. A first SIGTERM (or Ctrl-C) stops claiming and lets the
running experiment finish; a second one cancels it and gives the lease back. A signal
that arrives while the worker waits for work cuts the wait short: an idle worker exits
at once, and an experiment the API handed out after the signal goes back unrun. This
holds however the signal is handled (``install_signal_handlers`` here, or the crew's
for several loops): the handler only sets ``stopping``.

With ``batch`` above 1 the loop takes several experiments in one claim and reports
their outcomes several at a time (the protocol's batch calls): as many as the last
experiments suggest it runs in about ``BATCH_SECONDS`` (a run of tiny shared-process
experiments, dozens; a long one, one at a time), so that a batch holds no experiment back
for long. Each experiment still runs on its own, as it would alone, and keeps its own
lease (heartbeats for every one held until its outcome is stored); outcomes wait at most
``REPORT_EVERY_S`` to go together. A signal gives back what the batch has not started.

Nothing one experiment produces ends the loop: an outcome the API refuses (too large,
invalid) is replaced by a short ``report_refused`` failure, and the worker goes on.

Its pieces: the claim's thread (claim_poll.py), leases and heartbeats (leases.py), the
calls that carry an outcome (reporter.py), its sign of life for a liveness probe
(alive.py), and what it needs of a runner and a client (seams.py).
"""

import json
import logging
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vramlab.contract import MAX_REPORT_BATCH, Status
from vramlab.runspec import RunSpec
from vramlab.wire import WireError
from workers.alive import CALL_S, RUN_SLACK_S, Pulse
from workers.claim_poll import ClaimPoll
from workers.client import STOP_POLL_S, Refused, UnknownWorker, with_retry
from workers.leases import Lease, beat_many, beat_one
from workers.outcome import REPORT_OVERHEAD_BYTES, Limits, refused, unreadable_spec
from workers.pacing import PACE_BELOW_S, ClaimTurns, Pending, ReportGroup
from workers.quota import Quota
from workers.reporter import Reporter
from workers.seams import ClientLike, RunnerLike

log = logging.getLogger("vramlab.worker")
# A batch claim takes what the loop's last experiments suggest it runs in about this long.
BATCH_SECONDS = 0.5
# Outcomes of a batch wait at most this long to be reported together.
REPORT_EVERY_S = 0.25
# How quickly the estimate of an experiment's time follows the latest ones.
ESTIMATE_WEIGHT = 0.3


class WorkerLoop:
    def __init__(
        self,
        client: ClientLike,
        runner: RunnerLike,
        *,
        name: str | None = None,
        wait_s: float = 20.0,
        max_experiments: int | None = None,
        batch: int = 1,
        turns: ClaimTurns | None = None,
        group: ReportGroup | None = None,
        pulse: Pulse | None = None,
        quota: Quota | None = None,
    ) -> None:
        self.client = client
        self.runner = runner
        self.name = name or socket.gethostname()
        self.wait_s = wait_s
        # The worker's --max-experiments, shared by a crew's loops (None: no end).
        self.quota = quota or (Quota(max_experiments) if max_experiments is not None else None)
        # The most experiments one claim takes; 1: the single calls of the protocol.
        self.batch = batch
        # What one experiment takes this loop, claim to outcome (None: none ran yet).
        self.estimate_s: float | None = None
        # Set by the signal handler. The main thread only polls them (is_set): a handler
        # that set an Event the interrupted main thread was inside could deadlock.
        self.stopping = threading.Event()
        self.aborting = threading.Event()
        self.worker_id: str | None = None
        self.heartbeat_seconds = 10.0
        # The sign of life a liveness probe reads (workers/alive.py): each step says how
        # long it may take before the next.
        self.pulse = pulse or Pulse(None)
        self.run_slack_s = RUN_SLACK_S
        self.reporter = Reporter(client, on_try=lambda: self.pulse.due(self, CALL_S))
        self.capabilities: dict[str, Any] = {}
        # Shared by a crew's loops (workers/pacing.py): claims of short experiments take
        # turns, and outcomes ready together go in one report. None: each on its own.
        self.turns = turns
        self.group = group

    @property
    def limits(self) -> Limits:
        """The API's limits, as its registration reply gave them."""
        return self.reporter.limits

    # -- signals -----------------------------------------------------------------
    def on_signal(self, signum: int, _frame: object = None) -> None:
        name = signal.Signals(signum).name
        if self.stopping.is_set():
            log.warning("second %s: cancelling the running experiment", name)
            self.aborting.set()
        else:
            log.info("%s: finishing the current experiment, then exiting", name)
            self.stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    # -- main loop ---------------------------------------------------------------
    def register(self) -> bool:
        reply = with_retry(
            lambda: self.client.register(self.name, socket.gethostname(), self.capabilities),
            what="register",
            should_stop=self.stopping.is_set,
            on_try=lambda: self.pulse.due(self, CALL_S),
        )
        if reply is None:
            return False
        self.worker_id = reply["worker_id"]
        self.heartbeat_seconds = float(reply["heartbeat_seconds"])
        self.reporter.limits = Limits.from_reply(reply.get("limits"))
        log.info(
            "registered as %s (%s)", self.worker_id, ", ".join(self.capabilities["device_types"])
        )
        return True

    def run(self) -> int:
        if not self.capabilities:  # the command probes before it starts the loop
            self.runner.start()
            self.capabilities = self.runner.capabilities()
        if not self.register():
            return 0
        done = 0
        try:
            while not self.stopping.is_set():
                most = self._batch_size()
                if self.quota is not None:
                    most = self.quota.take(most)
                    if most == 0:
                        break
                claimed: list[dict[str, Any]] = []
                try:
                    claimed = self._claim(most)
                except UnknownWorker:
                    log.warning("the API forgot this worker; registering again")
                    if not self.register():
                        break
                    continue
                finally:
                    if self.quota is not None:
                        self.quota.give_back(most - len(claimed))
                if not claimed:
                    continue
                if self.stopping.is_set():
                    for one in claimed:
                        log.info("%s was claimed after the signal: giving it back", one["id"])
                        self.reporter.release(one["id"], one["lease_token"])
                    break
                if self.batch == 1:
                    self.execute(claimed[0])
                    done += 1
                else:
                    done += self.execute_batch(claimed)
        finally:
            self._leave()
            self.pulse.done(self)
        return done

    def _batch_size(self) -> int:
        if self.estimate_s is None:
            return 1
        return max(1, min(self.batch, int(BATCH_SECONDS / max(self.estimate_s, 1e-3))))

    def _took(self, seconds: float) -> None:
        last = self.estimate_s
        self.estimate_s = seconds if last is None else last + ESTIMATE_WEIGHT * (seconds - last)

    def _claim(self, most: int = 1) -> list[dict[str, Any]]:
        """One long-poll for work, which a signal cuts short: the loop stops waiting for
        the call at once, and gives back anything it still brings."""
        if self.stopping.is_set():
            return []
        worker_id = str(self.worker_id)

        def call() -> list[dict[str, Any]]:
            if self.batch == 1:
                one = self.client.claim(worker_id, self.wait_s)
                return [] if one is None else [one]
            turns = self.turns
            short = self.estimate_s is not None and self.estimate_s < PACE_BELOW_S
            if turns is not None and short:
                return turns.take(
                    lambda m: self.client.claim_many(worker_id, self.wait_s, m),
                    most,
                    self.stopping.is_set,
                )
            return self.client.claim_many(worker_id, self.wait_s, most)

        def late(claimed: list[dict[str, Any]]) -> None:
            for one in claimed:
                self.reporter.release(one["id"], one["lease_token"])

        def progress() -> None:
            self.pulse.due(self, self.wait_s + CALL_S)

        poll = ClaimPoll(
            lambda: (
                with_retry(call, what="claim", should_stop=self.stopping.is_set, on_try=progress)
                or []
            ),
            late=late,
        )
        threading.Thread(target=poll.run, name="vramlab-claim", daemon=True).start()
        # Waits on the call's own event, never on one a signal handler sets.
        while not poll.done.wait(STOP_POLL_S):
            if self.stopping.is_set() and poll.abandon():
                log.info("stopping: no longer waiting for work")
                return []
        if poll.error is not None:
            raise poll.error
        return poll.result

    def _leave(self) -> None:
        """Tell the API this worker is gone, so that it stops counting it as live."""
        if self.worker_id is None:
            return
        try:
            self.client.stop(self.worker_id)
        except Exception as exc:  # best effort: the API may be down or older
            log.info("could not tell the API this worker stopped: %s", exc)

    # -- one experiment ----------------------------------------------------------
    def execute(self, claimed: dict[str, Any]) -> None:
        lease = Lease(exp_id=claimed["id"], token=claimed["lease_token"])
        # Heartbeats run until the outcome is stored: a long upload keeps its lease.
        beat = threading.Thread(
            target=beat_one, args=(self.client, lease, self.heartbeat_seconds), daemon=True
        )
        beat.start()
        try:
            body = self._run(lease, claimed["spec"])
            if body is not None:
                self.reporter.report_body(lease, body)
        finally:
            lease.done.set()
            beat.join()

    def _run(
        self, lease: Lease, claimed_spec: dict[str, Any], *, inline: bool = False
    ) -> dict[str, Any] | None:
        """Run one claimed experiment and upload its trace: the report to send, or None
        when there is none (the lease was lost, or an abort gave the experiment back).
        ``inline``: the report goes in a batch, which carries a small trace itself."""
        try:
            spec = RunSpec.from_wire(claimed_spec)
        except WireError as exc:  # an API of another release: say so, run nothing
            log.error("%s: the claimed spec does not fit this worker's contract", lease.exp_id)
            return unreadable_spec(exc)
        log.info(
            "running %s: %s %s %s on %s",
            lease.exp_id,
            spec.op,
            list(spec.shape),
            spec.dtype,
            spec.device,
        )
        work_dir = Path(tempfile.mkdtemp(prefix="vramlab-"))
        # However long the experiment, the runner ends it at its time limit.
        limit = spec.timeout_s
        self.pulse.due(self, limit + self.run_slack_s)
        try:
            outcome = self.runner.run(
                spec,
                should_cancel=lambda: (
                    lease.cancel_requested or lease.lost or self.aborting.is_set()
                ),
                work_dir=work_dir,
            )
            if lease.lost:
                return None
            if (
                outcome.status == Status.CANCELLED
                and self.aborting.is_set()
                and not lease.cancel_requested
            ):
                self.reporter.release(lease.exp_id, lease.token)
                return None
            return self.reporter.upload(lease, outcome, inline=inline)
        except Refused as exc:  # the trace upload's refusals become a body; this is none
            log.error("%s: the API refused the outcome (%s)", lease.exp_id, exc)
            return refused("outcome", f"the API answered {exc}", self.limits)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)

    # -- a batch -----------------------------------------------------------------
    def _report(self, pending: Pending) -> None:
        if self.group is None:
            self.reporter.report_many(pending)
        else:
            self.group.send(self.reporter.report_many, pending, self.limits.max_body_bytes)

    def execute_batch(self, claimed: list[dict[str, Any]]) -> int:
        """Run a claim's experiments one after another, reporting their outcomes a few at
        a time; returns how many ran (a signal gives back those not started)."""
        leases = [Lease(exp_id=c["id"], token=c["lease_token"]) for c in claimed]
        over = threading.Event()
        beat = threading.Thread(
            target=beat_many,
            args=(self.client, leases, over, self.heartbeat_seconds),
            daemon=True,
        )
        beat.start()
        pending: list[tuple[Lease, dict[str, Any]]] = []
        size = 0
        since = time.monotonic()
        ran = 0
        try:
            for lease, one in zip(leases, claimed, strict=True):
                if self.stopping.is_set() or lease.lost:
                    if not lease.lost:
                        log.info("%s: stopping, giving it back unrun", lease.exp_id)
                        self.reporter.release(lease.exp_id, lease.token)
                    lease.done.set()
                    continue
                start = time.monotonic()
                body = self._run(lease, one["spec"], inline=True)
                ran += 1
                if body is None:
                    lease.done.set()
                    self._took(time.monotonic() - start)
                    continue
                body_size = len(json.dumps(body)) + REPORT_OVERHEAD_BYTES
                if pending and (
                    size + body_size > self.limits.max_body_bytes
                    or len(pending) >= MAX_REPORT_BATCH
                ):
                    self._report(pending)
                    pending, size = [], 0
                if not pending:
                    since = time.monotonic()
                pending.append((lease, body))
                size += body_size
                if time.monotonic() - since >= REPORT_EVERY_S:
                    self._report(pending)
                    pending, size = [], 0
                self._took(time.monotonic() - start)
            if pending:
                self._report(pending)
                pending = []
        finally:
            for lease, body in pending:  # an error left them unsent: one at a time
                self.reporter.report_body(lease, body)
            over.set()
            beat.join()
        return ran
