"""A crew's loops under a stream of tiny experiments submitted one at a time: claims take
turns and outcomes ready together go in one report (workers/pacing.py), so the API sees
far fewer calls than experiments; each experiment still runs once and is stored once."""

import re
import threading
import time
from typing import Any

import httpx

from tests.conftest import LiveServer, make_settings
from tests.helpers import submit
from tests.workers.test_loop import FakeRunner, succeeded
from vramlab.contract import Status
from workers.client import ApiClient
from workers.crew import run_all
from workers.leases import Lease
from workers.loop import WorkerLoop
from workers.pacing import ClaimTurns, ReportGroup


def _calls(http: httpx.Client) -> dict[str, tuple[float, float]]:
    """The API's claims that took work and its batch reports: (calls, experiments)."""
    text = http.get("/metrics").text
    found = {}
    for call in ("claim", "report"):
        calls = re.search(rf'^vramlab_batch_calls_total\{{call="{call}"\}} (\S+)$', text, re.M)
        carried = re.search(
            rf'^vramlab_batch_experiments_total\{{call="{call}"\}} (\S+)$', text, re.M
        )
        assert calls and carried, text
        found[call] = (float(calls.group(1)), float(carried.group(1)))
    return found


def test_experiments_submitted_one_by_one_are_claimed_and_reported_several_at_a_time(
    database_url: str,
) -> None:
    n = 40
    settings = make_settings(database_url, claim_wait_seconds=1.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        turns, group = ClaimTurns(0.3), ReportGroup(0.3)
        clients = [ApiClient(live.url) for _ in range(3)]
        loops = [
            WorkerLoop(
                client,
                FakeRunner(lambda **_: succeeded()),
                name=f"t/{i}",
                wait_s=1.0,
                batch=16,
                turns=turns,
                group=group,
            )
            for i, client in enumerate(clients)
        ]
        crew = threading.Thread(target=run_all, args=(loops,), daemon=True)
        crew.start()
        try:
            ids = []
            for _ in range(n):  # a trickle: one POST at a time
                ids.append(submit(http)["id"])
                time.sleep(0.01)
            deadline = time.monotonic() + 60
            while True:
                page = http.get(
                    "/v1/experiments", params={"status": ["queued", "running"], "limit": 1}
                ).json()
                if not page["items"]:
                    break
                assert time.monotonic() < deadline, "the crew did not finish the stream"
                time.sleep(0.05)
        finally:
            for loop in loops:
                loop.stopping.set()
            crew.join(30)
            for client in clients:
                client.close()
        assert not crew.is_alive()
        for exp_id in ids:
            exp = http.get(f"/v1/experiments/{exp_id}").json()
            assert (exp["status"], exp["attempts"]) == (Status.SUCCEEDED, 1), exp
        calls = _calls(http)
        assert calls["claim"][1] == n and calls["report"][1] == n, calls
        # Without turns, each loop's waiting claim took the one experiment a POST brought.
        assert calls["claim"][0] <= n / 2, calls
        assert calls["report"][0] <= n / 2, calls


def _lease(i: int) -> Lease:
    return Lease(exp_id=f"e{i}", token="t")


def test_reports_ready_while_one_is_sent_go_together_in_the_next() -> None:
    group = ReportGroup(0.0)
    sent: list[list[str]] = []
    first_in_flight, let_first_go = threading.Event(), threading.Event()

    def send(part: list[tuple[Lease, dict[str, Any]]]) -> None:
        sent.append([lease.exp_id for lease, _ in part])
        if len(sent) == 1:
            first_in_flight.set()
            assert let_first_go.wait(10)

    def report(i: int) -> None:
        group.send(send, [(_lease(i), {"status": "succeeded"})], 1 << 20)

    first = threading.Thread(target=report, args=(0,))
    first.start()
    assert first_in_flight.wait(10)
    others = [threading.Thread(target=report, args=(i,)) for i in (1, 2, 3)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 10
    while len(group._waiting) < 3:  # all three wait behind the first
        assert time.monotonic() < deadline
        time.sleep(0.01)
    let_first_go.set()
    for thread in [first, *others]:
        thread.join(10)
        assert not thread.is_alive()
    assert sent[0] == ["e0"] and sorted(sent[1]) == ["e1", "e2", "e3"] and len(sent) == 2


def test_a_gathered_report_that_fails_fails_for_each_loop_in_it_and_the_next_goes() -> None:
    group = ReportGroup(0.0)
    calls = []

    def send(part: list[tuple[Lease, dict[str, Any]]]) -> None:
        calls.append(len(part))
        if len(calls) == 1:
            raise ConnectionError("the API went away")

    try:
        group.send(send, [(_lease(0), {})], 1 << 20)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the failure did not reach the loop")
    group.send(send, [(_lease(1), {})], 1 << 20)  # the group is not left stuck
    assert calls == [1, 1]


def test_a_gathered_report_keeps_to_the_apis_body_limit() -> None:
    group = ReportGroup(0.0)
    parts: list[int] = []
    body = {"notes": ["x" * 1000]}
    gate = threading.Event()

    def send(part: list[tuple[Lease, dict[str, Any]]]) -> None:
        parts.append(len(part))
        gate.wait(10)

    threads = [
        threading.Thread(target=group.send, args=(send, [(_lease(i), body)], 3500))
        for i in range(7)
    ]
    threads[0].start()  # alone: its report is in flight, held at the gate
    deadline = time.monotonic() + 10
    while not parts:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for thread in threads[1:]:
        thread.start()
    while len(group._waiting) < 6:  # the other six wait behind it, to go together
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert sum(parts) == 7 and max(parts) <= 3  # three bodies of ~1 kB fit in 3.5 kB


def test_a_loop_that_stops_while_waiting_for_its_turn_claims_nothing() -> None:
    turns = ClaimTurns(0.0)
    held = threading.Event()
    release = threading.Event()

    def parked(most: int) -> list[dict[str, Any]]:  # another loop's long poll
        held.set()
        release.wait(10)
        return []

    other = threading.Thread(target=turns.take, args=(parked, 4, lambda: False))
    other.start()
    assert held.wait(10)
    called = []
    stopping = threading.Event()
    threading.Timer(0.3, stopping.set).start()
    got = turns.take(lambda most: called.append(most) or [], 4, stopping.is_set)
    release.set()
    other.join(10)
    assert got == [] and called == []


def test_after_a_claim_that_emptied_the_queue_the_next_waits_its_gap() -> None:
    turns = ClaimTurns(0.2)
    starts: list[float] = []

    def call(most: int) -> list[dict[str, Any]]:
        starts.append(time.monotonic())
        return [{}] * (most if len(starts) == 1 else 1)

    turns.take(call, 2, lambda: False)  # took all it asked for: the queue may hold more
    turns.take(call, 2, lambda: False)  # took fewer: the queue is empty
    turns.take(call, 2, lambda: False)
    assert starts[2] - starts[1] >= 0.2
