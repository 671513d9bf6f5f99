"""Connections and the write slot: one connection a request, bounded waits, 503 not 500;
listing by tag in pages; a sweep queued in one batch; one NOTIFY for a burst of submits."""

import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from app.core import signals
from app.core.db import IDLE_PING_SECONDS, Database
from tests.conftest import ENGINES, LiveServer, make_settings
from tests.helpers import ADD, claim, register, submit


@pytest.fixture
def one_connection(database_url: str) -> Iterator[LiveServer]:
    """The API with a pool of exactly one connection."""
    settings = make_settings(
        database_url,
        db_pool_size=1,
        db_max_overflow=0,
        db_wait_seconds=5,
        claim_wait_seconds=10,
        claim_poll_seconds=10,
    )
    with LiveServer(settings) as live:
        yield live


def test_every_request_needs_one_connection_and_a_waiting_claim_holds_none(
    one_connection: LiveServer,
) -> None:
    with httpx.Client(base_url=one_connection.url, timeout=30) as client:
        exp = submit(client)  # the caller's look-up and the insert share one connection
        assert client.get(f"/v1/experiments/{exp['id']}").status_code == 200
        worker = register(client)
        assert claim(client, worker)["id"] == exp["id"]  # type: ignore[index]
        got: dict[str, object] = {}

        def wait() -> None:
            with httpx.Client(base_url=one_connection.url, timeout=30) as c:
                got["claim"] = claim(c, worker, wait_s=10)

        waiter = threading.Thread(target=wait)
        waiter.start()
        # While the claim waits it holds no connection: reads and a submit go through.
        assert client.get("/v1/experiments").status_code == 200
        second = submit(client)
        waiter.join(timeout=30)
        claimed = got["claim"]
        assert isinstance(claimed, dict) and claimed["id"] == second["id"]


def test_a_saturated_database_answers_503_with_retry_after(database_url: str) -> None:
    settings = make_settings(database_url, db_pool_size=1, db_max_overflow=0, db_wait_seconds=0.2)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        db: Database = live.app.state.db
        # Hold the only connection (and, on SQLite, the write slot) as a long request would.
        with db.session() as held:
            held.connection()
            busy = client.post("/v1/experiments", json=ADD)
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["type"] == "unavailable"
        assert busy.headers["retry-after"].isdigit()
        assert client.post("/v1/experiments", json=ADD).status_code == 202


def _pages(client: httpx.Client, params: dict[str, str | int]) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = client.get(
            "/v1/experiments", params={**params, **({"cursor": cursor} if cursor else {})}
        )
        assert page.status_code == 200, page.text
        seen += [e["id"] for e in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return seen


def test_list_by_tag_newest_first_in_pages_with_other_filters(client: httpx.Client) -> None:
    ids = [
        submit(client, ADD, tags=["t", "all"] if i % 2 else ["u", "all"])["id"] for i in range(9)
    ]
    tagged = [ids[i] for i in range(9) if i % 2]
    assert _pages(client, {"tag": "t", "limit": 3}) == list(reversed(tagged))
    assert _pages(client, {"tag": "all", "limit": 4}) == list(reversed(ids))
    cancelled = tagged[1]
    assert client.post(f"/v1/experiments/{cancelled}/cancel").status_code == 200
    assert _pages(client, {"tag": "t", "status": "cancelled", "limit": 1}) == [cancelled]
    assert _pages(client, {"tag": "t", "status": "queued", "limit": 2}) == [
        i for i in reversed(tagged) if i != cancelled
    ]
    assert client.get("/v1/experiments", params={"tag": "none"}).json()["items"] == []


def test_a_sweep_is_queued_in_grid_order_with_its_tags(client: httpx.Client) -> None:
    body = {
        "spec": {"op": "add", "shape": [64], "dtype": "float32", "device": "cpu", "tags": ["sw"]},
        "grid": {"shape": [[k] for k in range(1, 51)], "repeat": [1, 2]},
    }
    created = client.post("/v1/sweeps", json=body)
    assert created.status_code == 202, created.text
    out = created.json()
    assert out["progress"]["queued"] == 100 and not out["done"]
    assert [r["values"] for r in out["rows"][:3]] == [
        {"shape": [1], "repeat": 1},
        {"shape": [1], "repeat": 2},
        {"shape": [2], "repeat": 1},
    ]
    assert all(r["status"] == "queued" and r["predicted_delta"] for r in out["rows"])
    # What the POST answered is what a GET reads back.
    again = client.get(f"/v1/sweeps/{out['id']}").json()
    assert again["rows"] == out["rows"] and again["progress"] == out["progress"]
    tagged = client.get("/v1/experiments", params={"tag": "sw", "limit": 200}).json()["items"]
    assert len(tagged) == 100


@pytest.mark.skipif("postgres" not in ENGINES, reason="LISTEN/NOTIFY is PostgreSQL's")
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_burst_of_submits_wakes_the_other_replicas_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: one NOTIFY for each submit that came after the last was sent, so one per
    # submit from a single client; each is work for PostgreSQL and every replica.
    monkeypatch.setattr(signals, "NOTIFY_GAP_SECONDS", 60.0, raising=False)
    with psycopg.connect(signals.libpq_url(database_url), autocommit=True) as other_replica:
        other_replica.execute(f"LISTEN {signals.CHANNEL}")
        with LiveServer(make_settings(database_url)) as live:
            with httpx.Client(base_url=live.url) as c:
                for _ in range(5):
                    submit(c)
            woken = list(other_replica.notifies(timeout=2.0))
    assert len(woken) == 1, woken


def _kill_the_apis_connections(database_url: str) -> int:
    with psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql")) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return len(rows)


def test_a_connection_is_pinged_only_after_it_sat_idle(database_url: str) -> None:
    """A connection just used is used again without a ping (each ping was a round trip of
    every request): one killed meanwhile fails that request with a 503, and the pool is
    renewed for the next. One idle past the window is pinged and replaced: no error."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's pool only (SQLite's connections are files)")
    url = database_url
    settings = make_settings(url, db_pool_size=1, db_max_overflow=0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.get("/v1/experiments").status_code == 200
        assert _kill_the_apis_connections(url) >= 1
        gone = client.get("/v1/experiments")
        assert gone.status_code == 503 and gone.headers["retry-after"]
        assert client.get("/v1/experiments").status_code == 200
        assert _kill_the_apis_connections(url) >= 1
        time.sleep(IDLE_PING_SECONDS + 0.3)
        assert client.get("/v1/experiments").status_code == 200
