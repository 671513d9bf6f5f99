"""The worker loop alone, against an in-memory API and a scripted runner.

Like procrastinate's in-memory connector: no HTTP, no torch, no sleeps. Signals are
delivered by calling the loop's handler where a real one would land; an empty queue
delivers a SIGTERM from inside a claim that then never answers, as an operator stopping
an idle worker whose long-poll is waiting.
"""

import gzip
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CPU_CAPS, MEMORY
from vramlab import contract
from vramlab.contract import ErrorType, Status
from workers.client import LeaseLost, Refused
from workers.endings import Outcome
from workers.loop import WorkerLoop

GUARD_S = 10.0  # how long a test waits for an event before it calls the loop stuck


def spec() -> dict[str, Any]:
    return {"op": "add", "shape": [4], "dtype": "float32", "device": "cpu"}


class FakeApi:
    """The worker protocol in memory. Hooks let a test refuse, lose or cancel a lease."""

    def __init__(self, n: int = 1, **limits: int) -> None:
        self.queue = [
            {"id": f"e{i}", "lease_token": f"t{i}", "attempt": 1, "spec": spec()} for i in range(n)
        ]
        self.limits = limits
        self.loop: WorkerLoop | None = None
        self.reports: dict[str, list[dict[str, Any]]] = {}
        self.chunks: dict[str, list[int]] = {}
        self.released: list[str] = []
        self.stopped: list[str] = []
        self.beats: dict[str, int] = {}
        self.beat = threading.Condition()
        self.hang = threading.Event()
        self.cancelled: set[str] = set()
        self.lost: set[str] = set()
        self.refuse_reports = 0  # refuse this many report calls with 413
        self.refuse_chunk: tuple[str, int] | None = None  # refuse this chunk with 422
        self.on_claim: Callable[[dict[str, Any]], None] | None = None
        self.on_upload: Callable[[str], None] | None = None

    # -- the protocol -------------------------------------------------------------
    def register(self, name: str, hostname: str, capabilities: dict[str, Any]) -> dict[str, Any]:
        return {
            "worker_id": "w1",
            "lease_seconds": 30.0,
            "heartbeat_seconds": 0.005,
            "limits": self.limits,
        }

    def claim(self, worker_id: str, wait_s: float) -> dict[str, Any] | None:
        assert self.loop is not None
        if not self.queue:  # idle: the operator stops the worker while it waits
            self.loop.on_signal(signal.SIGTERM)
            # A long-poll that never answers: the loop must not wait for it.
            self.hang.wait(GUARD_S)
            return None
        claimed = self.queue.pop(0)
        if self.on_claim is not None:
            self.on_claim(claimed)
        return claimed

    def heartbeat(self, exp_id: str, token: str) -> dict[str, Any]:
        if exp_id in self.lost:
            raise LeaseLost("409")
        with self.beat:
            self.beats[exp_id] = self.beats.get(exp_id, 0) + 1
            self.beat.notify_all()
        return {"lease_expires_at": "later", "cancel_requested": exp_id in self.cancelled}

    def upload_trace(self, exp_id: str, token: str, seq: int, gz: bytes) -> None:
        if self.on_upload is not None:
            self.on_upload(exp_id)
        if (exp_id, seq) == self.refuse_chunk:
            raise Refused(422, "bad_request: trace chunk line 3 is not JSON")
        assert gzip.decompress(gz)
        self.chunks.setdefault(exp_id, []).append(seq)

    def report(self, exp_id: str, token: str, outcome: dict[str, Any]) -> None:
        if self.refuse_reports:
            self.refuse_reports -= 1
            raise Refused(413, "payload_too_large: request body over 1048576 bytes")
        # What the API validates: lengths, a type it knows, JSON that parses.
        json.loads(json.dumps(outcome, allow_nan=False))
        error = outcome["error"]
        if error is not None:
            assert ErrorType(error["type"])
            assert len(error["message"]) <= contract.MAX_ERROR_MESSAGE_CHARS
            assert "\x00" not in error["message"]  # the API refuses NUL in text
        self.reports.setdefault(exp_id, []).append(outcome)

    def release(self, exp_id: str, token: str) -> None:
        self.released.append(exp_id)

    def stop(self, worker_id: str) -> None:
        self.stopped.append(worker_id)

    # -- for the tests --------------------------------------------------------------
    def wait_beats(self, exp_id: str, more_than: int) -> int:
        with self.beat:
            seen = self.beat.wait_for(lambda: self.beats.get(exp_id, 0) > more_than, GUARD_S)
        assert seen, f"no heartbeat for {exp_id} after {more_than}"
        return self.beats[exp_id]

    def outcome(self, exp_id: str) -> dict[str, Any]:
        (only,) = self.reports[exp_id]
        return only


class FakeRunner:
    """Runs nothing: each run calls the test's script, which returns an Outcome."""

    def __init__(self, script: Callable[..., Outcome] | None = None) -> None:
        self.script = script or (lambda **_: succeeded())
        self.ran: list[dict[str, Any]] = []

    def start(self) -> None:
        pass

    def capabilities(self) -> dict[str, Any]:
        return CPU_CAPS

    def run(
        self,
        spec: dict[str, Any],
        *,
        should_cancel: Callable[[], bool] = lambda: False,
        work_dir: Path | None = None,
    ) -> Outcome:
        self.ran.append(spec)
        assert work_dir is not None
        return self.script(should_cancel=should_cancel, work_dir=work_dir)

    def close(self) -> None:
        pass


def succeeded(**extra: Any) -> Outcome:
    return Outcome("succeeded", {"memory": dict(MEMORY), **extra}, None, None, 0)


def with_trace(work_dir: Path, events: int) -> Outcome:
    path = work_dir / "trace.ndjson.gz"
    lines = (json.dumps({"action": "alloc", "size": i}) + "\n" for i in range(events))
    path.write_bytes(gzip.compress("".join(lines).encode()))
    return Outcome("succeeded", {"memory": dict(MEMORY)}, None, path, events)


def until(condition: Callable[[], bool]) -> None:
    """Block like a running child until the condition holds (the runner polls the same)."""
    pause = threading.Event()
    for _ in range(int(GUARD_S / 0.001)):
        if condition():
            return
        pause.wait(0.001)
    raise AssertionError("the loop never asked the run to stop")


def make(api: FakeApi, runner: FakeRunner, **kwargs: Any) -> WorkerLoop:
    loop = WorkerLoop(api, runner, name="test", **kwargs)
    api.loop = loop
    return loop


def test_a_refused_report_becomes_a_short_failure_and_the_loop_goes_on() -> None:
    api, runner = FakeApi(n=2), FakeRunner()
    api.refuse_reports = 1
    loop = make(api, runner)
    assert loop.run() == 2
    refused = api.outcome("e0")
    assert refused["status"] == Status.FAILED and refused["result"] is None
    assert refused["error"]["type"] == ErrorType.REPORT_REFUSED
    assert "413" in refused["error"]["message"]
    assert api.outcome("e1")["status"] == Status.SUCCEEDED
    assert api.stopped == ["w1"]


def test_a_refused_trace_chunk_becomes_a_short_failure() -> None:
    api = FakeApi(n=2, max_trace_chunk_events=10)
    api.refuse_chunk = ("e0", 1)
    runner = FakeRunner(lambda work_dir, **_: with_trace(work_dir, 25))
    assert make(api, runner).run() == 2
    first = api.outcome("e0")
    assert first["error"]["type"] == ErrorType.REPORT_REFUSED
    assert "trace" in first["error"]["message"] and "line 3" in first["error"]["message"]
    assert api.chunks["e1"] == [0, 1, 2]  # cut at the API's limit of 10 events
    assert api.outcome("e1")["trace_events"] == 25


def test_an_outcome_past_the_apis_limits_is_fitted_before_it_is_sent() -> None:
    long = "x\x00" + "x" * contract.MAX_ERROR_MESSAGE_CHARS
    failures = iter(
        [
            Outcome("failed", None, {"type": "crashed", "message": long, "hint": "h"}, None, 0),
            succeeded(notes=["y" * 2**20]),  # over the 1 MiB body limit
            succeeded(timing={"method": "perf_counter", "median_s": float("nan")}),  # not JSON
        ]
    )
    api, runner = FakeApi(n=3), FakeRunner(lambda **_: next(failures))
    assert make(api, runner).run() == 3
    crashed = api.outcome("e0")["error"]
    assert crashed["type"] == ErrorType.CRASHED and crashed["message"].startswith("x\\x00xx")
    assert "cut" in crashed["message"] and "\x00" not in crashed["message"]
    for exp_id, why in (("e1", "over the API's limit"), ("e2", "not valid JSON")):
        error = api.outcome(exp_id)["error"]
        assert error["type"] == ErrorType.REPORT_REFUSED and why in error["message"]


def test_a_short_failure_that_is_refused_too_leaves_the_loop_running() -> None:
    api, runner = FakeApi(n=2), FakeRunner()
    api.refuse_reports = 2
    assert make(api, runner).run() == 2
    assert "e0" not in api.reports  # left to the lease, which ends it as `lost`
    assert api.outcome("e1")["status"] == Status.SUCCEEDED


def test_heartbeats_keep_the_lease_while_the_trace_uploads() -> None:
    api = FakeApi(n=1, max_trace_chunk_events=5)
    runner = FakeRunner(lambda work_dir, **_: with_trace(work_dir, 10))
    # Each chunk waits for a fresh heartbeat: the upload outlasts several beats.
    api.on_upload = lambda exp_id: api.wait_beats(exp_id, api.beats.get(exp_id, 0))
    assert make(api, runner).run() == 1
    assert api.outcome("e0")["status"] == Status.SUCCEEDED
    assert api.chunks["e0"] == [0, 1]


def test_a_lost_lease_stops_the_run_and_reports_nothing() -> None:
    api = FakeApi(n=2)

    def run(should_cancel: Callable[[], bool], **_: Any) -> Outcome:
        if not runner.ran[1:]:  # the first experiment loses its lease while it runs
            api.lost.add("e0")
            until(should_cancel)
            return Outcome("cancelled", None, None, None, 0)
        return succeeded()

    runner = FakeRunner(run)
    assert make(api, runner).run() == 2
    assert "e0" not in api.reports and api.released == []
    assert api.outcome("e1")["status"] == Status.SUCCEEDED


def test_a_cancel_reaches_the_running_experiment_through_heartbeats() -> None:
    api = FakeApi(n=1)
    api.on_claim = lambda claimed: api.cancelled.add(claimed["id"])

    def run(should_cancel: Callable[[], bool], **_: Any) -> Outcome:
        until(should_cancel)
        return Outcome("cancelled", None, None, None, 0)

    assert make(api, FakeRunner(run)).run() == 1
    assert api.outcome("e0")["status"] == Status.CANCELLED
    assert api.released == []


def test_sigterm_while_idle_cuts_the_claim_and_says_goodbye() -> None:
    api, runner = FakeApi(n=0), FakeRunner()
    loop = make(api, runner)
    assert loop.run() == 0  # long before the hanging claim's guard
    assert loop.stopping.is_set() and runner.ran == []
    assert api.stopped == ["w1"]
    api.hang.set()


def test_work_claimed_after_the_signal_goes_back_unrun() -> None:
    api, runner = FakeApi(n=2), FakeRunner()
    loop = make(api, runner)
    # The signal lands as the claim's answer arrives: the handler sees no waiting claim.
    api.on_claim = lambda _: loop.stopping.set()
    assert loop.run() == 0
    until(lambda: bool(api.released))  # the loop, or the abandoned call, gives it back
    assert runner.ran == [] and api.released == ["e0"] and api.reports == {}
    assert api.queue and api.stopped == ["w1"]


def test_sigterm_while_running_finishes_reports_and_exits() -> None:
    api = FakeApi(n=2)

    def run(**_: Any) -> Outcome:
        assert api.loop is not None
        api.loop.on_signal(signal.SIGTERM)  # does not raise: nothing is waiting to be cut
        return succeeded()

    runner = FakeRunner(run)
    assert make(api, runner).run() == 1
    assert api.outcome("e0")["status"] == Status.SUCCEEDED
    assert len(runner.ran) == 1 and [e["id"] for e in api.queue] == ["e1"]
    assert api.stopped == ["w1"]


def test_a_second_sigterm_cancels_the_run_and_gives_it_back() -> None:
    api = FakeApi(n=2)

    def run(should_cancel: Callable[[], bool], **_: Any) -> Outcome:
        assert api.loop is not None
        api.loop.on_signal(signal.SIGTERM)
        assert not should_cancel()
        api.loop.on_signal(signal.SIGINT)
        assert should_cancel()
        return Outcome("cancelled", None, None, None, 0)

    assert make(api, FakeRunner(run)).run() == 1
    assert api.released == ["e0"] and api.reports == {}
    assert api.stopped == ["w1"]


@pytest.mark.parametrize("code", [400, 404, 413, 422])
def test_no_refusal_ends_the_loop(code: int) -> None:
    api, runner = FakeApi(n=2), FakeRunner()
    seen: list[str] = []

    def report(exp_id: str, token: str, outcome: dict[str, Any]) -> None:
        seen.append(exp_id)
        if len(seen) == 1:
            raise Refused(code, "no")
        api.reports.setdefault(exp_id, []).append(outcome)

    api.report = report  # type: ignore[method-assign]
    assert make(api, runner).run() == 2
    assert api.outcome("e0")["error"]["type"] == ErrorType.REPORT_REFUSED
    assert api.outcome("e1")["status"] == Status.SUCCEEDED
