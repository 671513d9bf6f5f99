"""The per-submitter queue cap (VRAMLAB_MAX_QUEUED_PER_TOKEN) through every path that
queues or dequeues, and the count the database keeps for it (``submitter_queues``)."""

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.api.test_auth import bearer, create_token
from tests.conftest import Clock, LiveServer, make_settings
from tests.helpers import ADD, register, succeed

CAP = 6
CAP_MANY = 40


def _queued_says(response: httpx.Response) -> int:
    """How many queued experiments a 429 says the submitter has."""
    assert response.status_code == 429, response.text
    return int(response.json()["error"]["message"].split(" experiments of yours")[0])


def _claims(c: httpx.Client, worker: str, n: int) -> list[dict[str, Any]]:
    got = c.post("/v1/worker/claims", json={"worker_id": worker, "max": n, "wait_s": 0})
    if got.status_code == 204:
        return []
    assert got.status_code == 200, got.text
    claimed: list[dict[str, Any]] = got.json()["experiments"]
    return claimed


def _wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"

        time.sleep(0.05)


def _counts(database_url: str) -> tuple[dict[str, int], dict[str, int]]:
    """The counts the database keeps, beside a count of the experiments themselves."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT submitter, queued FROM submitter_queues"))
            counted = conn.execute(
                text(
                    "SELECT coalesce(submitted_by, ''), count(*) FROM experiments "
                    "WHERE status = 'queued' GROUP BY coalesce(submitted_by, '')"
                )
            )
            return {k: n for k, n in kept if n}, {k: n for k, n in counted}
    finally:
        engine.dispose()


def test_the_cap_holds_exactly_through_claims_cancels_and_requeues(database_url: str) -> None:
    mine = bearer(create_token(database_url, "submit"))
    admin = bearer(create_token(database_url, "admin"))  # another submitter, and the worker
    clock = Clock()
    settings = make_settings(
        database_url, max_queued_per_token=CAP, lease_seconds=30, lease_check_seconds=0.05
    )
    with (
        LiveServer(settings, clock) as live,
        httpx.Client(base_url=live.url, timeout=60, headers=admin) as c,
    ):

        def refused() -> httpx.Response:
            return c.post("/v1/experiments", json=ADD, headers=mine)

        mine_ids: list[str] = []

        def fill() -> None:
            while (r := refused()).status_code == 202:
                mine_ids.append(r.json()["id"])
            assert _queued_says(r) == CAP

        grid = {"shape": [[8, 8], [16, 16], [32, 32]]}
        assert (
            c.post("/v1/sweeps", json={"spec": ADD, "grid": grid}, headers=mine).status_code == 202
        )
        fill()  # the sweep's three and three submits
        worker = register(c)
        taken = _claims(c, worker, 4)  # a batch claim: four leave the queue
        assert len(taken) == 4
        assert c.post("/v1/experiments", json=ADD).status_code == 202  # another's queue
        fill()
        taken_ids = {t["id"] for t in taken}
        queued_one = next(i for i in mine_ids if i not in taken_ids)
        cancelled = c.post(f"/v1/experiments/{queued_one}/cancel", headers=mine)
        assert cancelled.status_code == 200, cancelled.text
        fill()  # a cancel frees one place

        back = taken.pop()
        released = c.post(
            f"/v1/worker/experiments/{back['id']}/release",
            json={"lease_token": back["lease_token"]},
        )
        assert released.status_code == 200, released.text
        assert _queued_says(refused()) == CAP + 1  # a release queues it again: over the cap
        assert succeed(c, taken.pop()).status_code == 200
        assert _queued_says(refused()) == CAP + 1  # a finish moves nothing

        clock.advance(31)  # the two leases left expire: the reaper queues them again
        _wait_until(lambda: _queued_says(refused()) == CAP + 3, "the expired leases came back")
        on_list = c.get("/v1/experiments", params={"status": "queued", "limit": 200}).json()
        assert len(on_list["items"]) == CAP + 3 + 1  # and the other submitter's one
    kept, counted = _counts(database_url)
    assert kept == counted


def test_the_counts_cannot_drift_under_concurrent_queue_changes(database_url: str) -> None:
    tokens = [bearer(create_token(database_url, "submit")) for _ in range(3)]
    admin = bearer(create_token(database_url, "admin"))
    settings = make_settings(database_url, max_queued_per_token=CAP_MANY)
    errors: list[str] = []
    with LiveServer(settings) as live:

        def submitter(who: dict[str, str], seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(base_url=live.url, timeout=60) as c:
                for _ in range(40):
                    if rng.random() < 0.2:
                        grid = {"shape": [[8, 8], [16, 16]]}
                        r = c.post("/v1/sweeps", json={"spec": ADD, "grid": grid}, headers=who)
                    else:
                        r = c.post("/v1/experiments", json=ADD, headers=who)
                        if r.status_code == 202 and rng.random() < 0.3:
                            path = f"/v1/experiments/{r.json()['id']}/cancel"
                            r = c.post(path, headers=who)
                    if r.status_code not in (200, 202, 409, 429):
                        errors.append(r.text)

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            with httpx.Client(base_url=live.url, timeout=60, headers=admin) as c:
                me = register(c, name=f"w{seed}")
                for _ in range(25):
                    try:
                        batch = _claims(c, me, 5)
                    except AssertionError as exc:
                        errors.append(str(exc))
                        return
                    for got in batch:
                        if rng.random() < 0.5:
                            path = f"/v1/worker/experiments/{got['id']}/release"
                            r = c.post(path, json={"lease_token": got["lease_token"]})
                        else:
                            r = succeed(c, got)
                        if r.status_code != 200:
                            errors.append(r.text)

        threads = [threading.Thread(target=submitter, args=(w, i)) for i, w in enumerate(tokens)]
        threads += [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with httpx.Client(base_url=live.url, timeout=60) as c:
            for who in tokens:  # what the churn left queued is what the cap counts
                while (r := c.post("/v1/experiments", json=ADD, headers=who)).status_code == 202:
                    pass
                assert _queued_says(r) == CAP_MANY
    kept, counted = _counts(database_url)
    assert kept == counted and sorted(counted.values()) == [CAP_MANY] * len(tokens)


def test_a_submit_reads_no_more_rows_for_a_longer_queue(database_url: str) -> None:
    # Before: the quota check counted the submitter's queued rows, a heap look-up each on
    # PostgreSQL, so a submit read as many rows as were queued (up to the cap).
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's statistics count the rows a statement reads")
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))

    def rows_read(inserted: int) -> int:
        """Experiments' rows and index entries read so far, once the server's backends
        have reported the ``inserted`` rows."""
        sql = text(
            "SELECT n_tup_ins, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
            "+ (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "WHERE relname = 'experiments') FROM pg_stat_user_tables WHERE relname = 'experiments'"
        )
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                ins, read = conn.execute(sql).one()
            if ins >= inserted or time.monotonic() > deadline:
                assert ins == inserted
                return int(read)
            time.sleep(0.2)

    settings = make_settings(database_url, max_queued_per_token=10_000)
    try:
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as c:
            grid = {"shape": [[n, n] for n in range(8, 208)], "repeat": [1, 2]}  # 400 queued
            assert c.post("/v1/sweeps", json={"spec": ADD, "grid": grid}).status_code == 202
            before = rows_read(400)
            for _ in range(20):
                assert c.post("/v1/experiments", json=ADD).status_code == 202
            per_submit = (rows_read(420) - before) / 20
    finally:
        engine.dispose()
    assert per_submit < 10, f"a submit read {per_submit} experiments' rows with 400 queued"
