"""State changes as compare-and-set: cancel racing claim, expiry settled by the API
itself, requeued work behind the rest, workers that say they stop, on both engines.

Leases expire by moving the app's clock, not by sleeping."""

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.core.config import normalise_database_url
from app.queue import service as queue
from tests.conftest import Clock, LiveServer, make_settings
from tests.helpers import CUDA_CAPS, claim, register, submit

ROUNDS = 40
# A claim that waits for the reaper: the limit only stops a hang.
WAIT_S = 30.0


def _wait_until(check: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Wait for something the API does by itself; the limit only stops a hang."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def _worker(client: httpx.Client, worker_id: str) -> dict[str, Any]:
    found = [w for w in client.get("/v1/workers").json() if w["id"] == worker_id]
    assert len(found) == 1
    return found[0]


def _race(url: str, worker: str, exp_id: str) -> tuple[dict[str, Any] | None, httpx.Response]:
    """A claim and a cancel of one queued experiment, let go at the same moment."""
    start = threading.Barrier(2)
    got: list[dict[str, Any] | None] = []
    cancelled: list[httpx.Response] = []

    def claimer() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            start.wait()
            got.append(claim(c, worker))

    def canceller() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            start.wait()
            cancelled.append(c.post(f"/v1/experiments/{exp_id}/cancel"))

    threads = [threading.Thread(target=claimer), threading.Thread(target=canceller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got[0], cancelled[0]


def test_cancel_racing_claim_leaves_one_truth(database_url: str) -> None:
    # Before: cancel read `queued` unlocked, a claim committed, and cancel wrote
    # `cancelled` over the lease: the worker ran it and stayed busy with a cancelled row.
    settings = make_settings(database_url)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        worker = register(client)
        for _ in range(ROUNDS):
            exp = submit(client)
            got, cancelled = _race(live.url, worker, exp["id"])
            assert cancelled.status_code == 200, cancelled.text
            now = client.get(f"/v1/experiments/{exp['id']}").json()
            state = _worker(client, worker)
            if got is not None:
                # The claim won: the run goes on, and its worker is told to stop.
                assert now["status"] == "running" and now["cancel_requested"] is True
                assert (state["state"], state["current_experiment_id"]) == ("busy", exp["id"])
                token = got["lease_token"]
                beat = client.post(
                    f"/v1/worker/experiments/{exp['id']}/heartbeat", json={"lease_token": token}
                )
                assert beat.status_code == 200 and beat.json()["cancel_requested"] is True
                done = client.post(
                    f"/v1/worker/experiments/{exp['id']}/result",
                    json={"lease_token": token, "status": "cancelled"},
                )
                assert done.status_code == 200
            else:
                assert now["status"] == "cancelled" and now["worker_id"] is None
                assert (state["state"], state["current_experiment_id"]) == ("idle", None)
            assert client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "cancelled"
            assert _worker(client, worker)["state"] == "idle"


def test_an_expired_lease_is_settled_with_no_worker_polling(database_url: str) -> None:
    # Before: the row said `running` in GET, /metrics and the UI until some worker claimed.
    clock = Clock()
    settings = make_settings(database_url, lease_seconds=30, lease_check_seconds=0.05)
    with LiveServer(settings, clock) as live, httpx.Client(base_url=live.url) as client:
        exp = submit(client)
        got = claim(client, register(client))
        assert got is not None
        clock.advance(31)

        def requeued() -> bool:
            return bool(client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "queued")

        _wait_until(requeued, "the expired lease went back to the queue")
        assert 'vramlab_experiments{status="running"} 0.0' in client.get("/metrics").text
        late = client.post(
            f"/v1/worker/experiments/{exp['id']}/heartbeat",
            json={"lease_token": got["lease_token"]},
        )
        assert late.status_code == 409 and late.json()["error"]["type"] == "lease_lost"


def test_expired_lease_goes_back_then_fails_as_lost(database_url: str) -> None:
    clock = Clock()
    settings = make_settings(
        database_url, lease_seconds=30, max_attempts=2, claim_wait_seconds=WAIT_S
    )
    with LiveServer(settings, clock) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        exp = submit(client)
        worker = register(client)
        first = claim(client, worker)
        assert first is not None and first["attempt"] == 1
        clock.advance(31)
        # The claim finds nothing queued and nudges the reaper, which puts the experiment
        # back and wakes it (a claim never settles expired leases itself).
        second = claim(client, worker, wait_s=WAIT_S)
        assert second is not None and second["id"] == exp["id"] and second["attempt"] == 2
        body = {"lease_token": first["lease_token"], "status": "cancelled"}
        late = client.post(f"/v1/worker/experiments/{exp['id']}/result", json=body)
        assert late.status_code == 409  # the first lease is dead: the re-run stands
        clock.advance(31)
        assert claim(client, worker) is None  # nothing to take: it nudges the reaper

        def failed() -> bool:
            return bool(client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "failed")

        _wait_until(failed, "the expired lease used its last attempt")
        lost = client.get(f"/v1/experiments/{exp['id']}").json()
        assert lost["error"]["type"] == "lost"
        assert lost["attempts"] == 2
        assert _worker(client, worker)["state"] == "idle"


def test_a_requeued_experiment_waits_behind_the_queue(database_url: str) -> None:
    # Before: the claim's order (priority, created_at) gave the requeued one back first,
    # so an experiment that kills its worker used up its attempts at once.
    clock = Clock()
    settings = make_settings(database_url, lease_seconds=30, claim_wait_seconds=WAIT_S)
    with LiveServer(settings, clock) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        queued = []
        for _ in range(3):
            queued.append(submit(client)["id"])
            clock.advance(1)
        first, second, third = queued
        worker = register(client)
        got = claim(client, worker)
        assert got is not None and got["id"] == first
        clock.advance(31)  # its worker died
        # The third finds nothing queued, and waits while the reaper puts the first back.
        order = [claim(client, register(client), wait_s=WAIT_S) for _ in range(3)]
        assert [g["id"] for g in order if g is not None] == [second, third, first]
        urgent = submit(client, priority=5)["id"]
        assert claim(client, worker)["id"] == urgent  # type: ignore[index]


def test_a_stopped_worker_is_not_live_and_must_register_again(database_url: str) -> None:
    # Before: nothing set `stopped`; a worker that exited cleanly counted as live for 60 s.
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        worker = register(c)
        assert "vramlab_workers_live 1.0" in c.get("/metrics").text
        assert c.post("/v1/worker/stop", json={"worker_id": worker}).status_code == 204
        assert c.post("/v1/worker/stop", json={"worker_id": worker}).status_code == 204
        shown = _worker(c, worker)
        assert (shown["state"], shown["live"]) == ("stopped", False)
        assert "vramlab_workers_live 0.0" in c.get("/metrics").text
        submit(c)
        again = c.post("/v1/worker/claim", json={"worker_id": worker, "wait_s": 0})
        assert again.status_code == 404 and "register" in again.json()["error"]["message"]
        ghost = c.post("/v1/worker/stop", json={"worker_id": "ghost"})
        assert ghost.status_code == 404


def test_worker_state_follows_its_lease(client: httpx.Client) -> None:
    worker = register(client)
    exp = submit(client)
    got = claim(client, worker)
    assert got is not None
    shown = _worker(client, worker)
    assert (shown["state"], shown["current_experiment_id"]) == ("busy", exp["id"])
    client.post(
        f"/v1/worker/experiments/{exp['id']}/release", json={"lease_token": got["lease_token"]}
    )
    shown = _worker(client, worker)
    assert (shown["state"], shown["current_experiment_id"]) == ("idle", None)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_the_claim_order_is_read_from_an_index(database_url: str) -> None:
    engine = create_engine(normalise_database_url(database_url))
    query = queue.next_candidates(CUDA_CAPS).compile(engine, compile_kwargs={"literal_binds": True})
    try:
        with engine.connect() as conn:
            conn.execute(text("SET enable_seqscan = off"))  # an empty table: force the choice
            plan = "\n".join(row[0] for row in conn.execute(text(f"EXPLAIN {query}")))
    finally:
        engine.dispose()
    assert "ix_experiments_claim" in plan and "Sort" not in plan, plan


def test_the_reaper_wakes_when_the_earliest_lease_expires(database_url: str) -> None:
    """Its usual round is a minute here; an expired lease still goes back to the queue
    (or fails as `lost` on its last attempt) right after its expiry, no worker polling."""
    settings = make_settings(
        database_url, lease_seconds=1.0, lease_check_seconds=60, max_attempts=2
    )
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        worker = register(client)
        exp = submit(client)
        got = claim(client, worker)
        assert got is not None
        # Looked at until the lease and a generous margin have passed (not a bound: the
        # usual round, a minute away, is the failure this tells apart).
        assert _status_after_lease(client, exp["id"], "queued")["status"] == "queued"
        again = claim(client, worker)
        assert again is not None and again["attempt"] == 2
        lost = _status_after_lease(client, exp["id"], "failed")
        assert (lost["status"], lost["error"]["type"]) == ("failed", "lost")


def _status_after_lease(client: httpx.Client, exp_id: str, status: str) -> dict[str, Any]:
    """The experiment once it has `status`, else as it is when the 1 s lease and 4 s more
    have passed."""
    deadline = time.monotonic() + 1.0 + 4.0
    while True:
        exp: dict[str, Any] = client.get(f"/v1/experiments/{exp_id}").json()
        if exp["status"] == status or time.monotonic() > deadline:
            return exp
        time.sleep(0.1)
