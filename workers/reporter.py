"""Sending what an experiment produced over the worker protocol: its trace in chunks, its
report alone or in a batch, a short failure in place of one the API refuses; and a
lease given back. Fitting to the API's limits is workers/outcome.py's."""

import base64
import itertools
import logging
from collections.abc import Callable
from typing import Any

from vramlab.contract import MAX_INLINE_TRACE_CHARS, ReportVerdict
from workers.client import LeaseLost, Refused, with_retry
from workers.leases import Lease
from workers.outcome import Limits, OutOfLimits, refused, report_body, trace_chunks
from workers.seams import ClientLike, OutcomeLike

log = logging.getLogger("vramlab.worker")


class Reporter:
    """The protocol calls that carry an outcome, under the API's ``limits`` (which the
    loop sets from its registration)."""

    def __init__(self, client: ClientLike, on_try: Callable[[], None] | None = None) -> None:
        self.client = client
        self.limits = Limits()
        self.on_try = on_try  # before each attempt of a call: the loop's sign of life

    def report_many(self, pending: list[tuple[Lease, dict[str, Any]]]) -> None:
        items = [
            {"experiment_id": lease.exp_id, "lease_token": lease.token, **body}
            for lease, body in pending
        ]
        try:
            verdicts = with_retry(
                lambda: self.client.report_many(items),
                what="report",
                should_stop=lambda: False,
                on_try=self.on_try,
            )
        except Refused as exc:
            # The report as a whole (an outcome whose shape the API refuses): each on its
            # own, so that the one at fault becomes a short failure and the rest stand.
            log.warning("the API refused a batch report (%s): reporting one at a time", exc)
            verdicts = None
        if verdicts is None or len(verdicts) != len(pending):
            for lease, body in pending:
                self.report_body(lease, body)
                lease.done.set()
            return
        for (lease, body), verdict in zip(pending, verdicts, strict=True):
            kind = verdict.get("verdict")
            if kind == ReportVerdict.STORED:
                error = body["error"]
                log.info("%s: %s", lease.exp_id, body["status"] if error is None else error["type"])
            elif kind == ReportVerdict.LEASE_LOST:
                log.warning("report of %s refused: the lease was lost", lease.exp_id)
            else:
                log.error(
                    "%s: the API refused the outcome (%s)", lease.exp_id, verdict.get("error")
                )
                self.send_refused(lease, "outcome", f"the API answered {verdict.get('error')}")
            lease.done.set()

    def call(self, fn: Any, what: str) -> bool:
        """One protocol call, retried while the API is unreachable; False if the lease is
        lost. Refused goes to the caller."""
        try:
            with_retry(fn, what=what, should_stop=lambda: False, on_try=self.on_try)
        except LeaseLost:
            log.warning("%s refused: the lease was lost", what)
            return False
        return True

    def release(self, exp_id: str, token: str) -> None:
        try:
            self.call(lambda: self.client.release(exp_id, token), "release")
        except Refused as exc:  # the lease expires by itself
            log.warning("%s: release refused (%s)", exp_id, exc)

    def report_body(self, lease: Lease, body: dict[str, Any]) -> None:
        """Report one outcome alone; a trace it carries inline is uploaded first."""
        try:
            if "trace_gz" in body:
                body = dict(body)
                gz = base64.b64decode(body.pop("trace_gz"))
                if not self._upload_chunk(lease, 0, gz):
                    return
            if self._send(lease, body):
                error = body["error"]
                log.info("%s: %s", lease.exp_id, body["status"] if error is None else error["type"])
        except Refused as exc:
            log.error("%s: the API refused the outcome (%s)", lease.exp_id, exc)
            self.send_refused(lease, "outcome", f"the API answered {exc}")

    def upload(
        self, lease: Lease, outcome: OutcomeLike, *, inline: bool = False
    ) -> dict[str, Any] | None:
        """Upload the trace, then return the report to send (None if the lease is lost).
        ``inline`` (a batch report will carry it): a trace of one small chunk goes inside
        the report (``trace_gz``) instead, which saves a call an experiment."""
        events = 0
        sent_inline: str | None = None
        if outcome.trace_path is not None and outcome.trace_path.exists():
            try:
                chunks = trace_chunks(outcome.trace_path, self.limits)
                first = next(chunks, None)
                rest = next(chunks, None) if first is not None else None
                small = first is not None and 4 * (len(first) + 2) // 3 <= MAX_INLINE_TRACE_CHARS
                if inline and rest is None and small and first is not None:
                    sent_inline = base64.b64encode(first).decode()
                else:
                    pieces = [c for c in (first, rest) if c is not None]
                    for seq, gz in enumerate(itertools.chain(pieces, chunks)):
                        if not self._upload_chunk(lease, seq, gz):
                            return None
            except (OutOfLimits, Refused) as exc:
                log.error("%s: trace not stored: %s", lease.exp_id, exc)
                return refused("trace", str(exc), self.limits)
            events = outcome.trace_events
        body = report_body(outcome.status, outcome.result, outcome.error, events, self.limits)
        if sent_inline is not None:
            body["trace_gz"] = sent_inline
        return body

    def _upload_chunk(self, lease: Lease, seq: int, gz: bytes) -> bool:
        def upload() -> None:
            self.client.upload_trace(lease.exp_id, lease.token, seq, gz)

        return self.call(upload, f"trace upload {seq}")

    def _send(self, lease: Lease, body: dict[str, Any]) -> bool:
        return self.call(lambda: self.client.report(lease.exp_id, lease.token, body), "report")

    def send_refused(self, lease: Lease, what: str, why: str) -> None:
        hint = "the API's answer, quoted here, says what it refused; the worker's log has more"
        try:
            self._send(lease, refused(what, why, self.limits, hint))
        except Refused as exc:
            # Even the short failure: leave it to the lease, which ends it as `lost`.
            log.error("%s: the API refused the short failure too (%s)", lease.exp_id, exc)
