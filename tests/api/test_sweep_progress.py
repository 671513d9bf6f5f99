"""A sweep's progress: counts kept by the database, read by key, followed by long-poll."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from alembic import command

from app.core.config import normalise_database_url
from app.core.migrate import alembic_config
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, claim, register, succeed


def _sweep(client: httpx.Client, n: int) -> dict[str, Any]:
    body = {"spec": {**ADD, "shape": [8]}, "grid": {"repeat": list(range(1, n + 1))}}
    response = client.post("/v1/sweeps", json=body)
    assert response.status_code == 202, response.text
    sweep: dict[str, Any] = response.json()
    return sweep


def _progress(client: httpx.Client, sweep_id: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/sweeps/{sweep_id}/progress", params=params)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def _counted(client: httpx.Client, sweep_id: str) -> dict[str, int]:
    """The counts as the sweep's rows give them."""
    rows = client.get(f"/v1/sweeps/{sweep_id}").json()["rows"]
    counts = dict.fromkeys(("queued", "running", "succeeded", "failed", "cancelled"), 0)
    for r in rows:
        counts[r["status"]] += 1
    return counts


def test_progress_follows_every_change_of_status(client: httpx.Client) -> None:
    sweep = _sweep(client, 6)
    other = _sweep(client, 2)  # another sweep's changes never show in this one's counts
    first = _progress(client, sweep["id"])
    assert first["progress"] == {**_counted(client, sweep["id"]), "queued": 6}
    assert (first["n_points"], first["finished"], first["done"]) == (6, 0, False)
    worker = register(client)
    taken = [got for _ in range(4) if (got := claim(client, worker)) is not None]
    assert len(taken) == 4
    assert succeed(client, taken[0]).status_code == 200
    fail = {
        "lease_token": taken[1]["lease_token"],
        "status": "failed",
        "error": {"type": "oom", "message": "out of memory"},
    }
    url = f"/v1/worker/experiments/{taken[1]['id']}"
    assert client.post(f"{url}/result", json=fail).status_code == 200
    url = f"/v1/worker/experiments/{taken[2]['id']}"
    released = client.post(f"{url}/release", json={"lease_token": taken[2]["lease_token"]})
    assert released.status_code == 200  # back in the queue
    ids = {t["id"] for t in taken}
    queued = [r["experiment_id"] for r in sweep["rows"] if r["experiment_id"] not in ids]
    assert client.post(f"/v1/experiments/{queued[0]}/cancel").status_code == 200
    now = _progress(client, sweep["id"])
    assert now["progress"] == _counted(client, sweep["id"])
    assert sum(now["progress"].values()) == 6
    assert now["progress"]["cancelled"] == 1 and now["progress"]["succeeded"] == 1
    assert now["finished"] == sum(now["progress"][k] for k in ("succeeded", "failed", "cancelled"))
    assert now["version"] != first["version"]
    assert _progress(client, other["id"])["progress"] == _counted(client, other["id"])


def test_a_finished_sweep_is_done(client: httpx.Client) -> None:
    sweep = _sweep(client, 2)
    worker = register(client)
    while (got := claim(client, worker)) is not None:
        assert succeed(client, got).status_code == 200
    out = _progress(client, sweep["id"], seen="anything", wait=30)
    assert out["done"] is True and out["finished"] == 2
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["done"] is True


def test_a_long_poll_answers_at_the_next_change(client: httpx.Client) -> None:
    sweep = _sweep(client, 3)
    before = _progress(client, sweep["id"])
    # Unchanged: the answer comes when the wait is over, as it stands.
    assert _progress(client, sweep["id"], seen=before["version"], wait=0.2) == before
    worker = register(client)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_progress, client, sweep["id"], seen=before["version"], wait=30)
        got = claim(client, worker)
        assert got is not None
        after = waiting.result(timeout=60)
    assert after["version"] != before["version"]
    assert after["progress"]["running"] + after["progress"]["queued"] == 3


def test_waiting_long_polls_hold_no_thread(server: LiveServer) -> None:
    """More waiters than the API's thread pool has threads (40), and the API still
    answers other requests while they wait."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        sweep = _sweep(client, 2)
        version = _progress(client, sweep["id"])["version"]
    started = threading.Barrier(61)

    def wait() -> dict[str, Any]:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            started.wait()
            return _progress(c, sweep["id"], seen=version, wait=20)

    with ThreadPoolExecutor(60) as pool, httpx.Client(base_url=server.url, timeout=60) as c:
        waits = [pool.submit(wait) for _ in range(60)]
        started.wait()
        time.sleep(1.0)  # for their requests to reach the API (no bound is asserted)
        # Answered while the 60 wait: a submit, a read, a claim (which ends their wait).
        assert c.post("/v1/experiments", json=ADD).status_code == 202
        assert c.get(f"/v1/sweeps/{sweep['id']}").status_code == 200
        pending = [w for w in waits if not w.done()]
        got = claim(c, register(c))
        assert got is not None
        answers = [w.result(timeout=60) for w in waits]
    assert pending, "the long-polls answered before anything changed"
    assert all(a["version"] != version for a in answers)


def test_rows_come_in_pages(client: httpx.Client) -> None:
    sweep = _sweep(client, 5)
    whole = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert [r["index"] for r in whole["rows"]] == [0, 1, 2, 3, 4]
    assert whole["next_offset"] is None
    rows, offset = [], 0
    while offset is not None:
        page = client.get(f"/v1/sweeps/{sweep['id']}", params={"offset": offset, "limit": 2})
        assert page.status_code == 200, page.text
        rows += page.json()["rows"]
        offset = page.json()["next_offset"]
    assert rows == whole["rows"]
    bad = client.get(f"/v1/sweeps/{sweep['id']}", params={"limit": 0})
    assert bad.status_code == 422


def test_progress_of_an_unknown_sweep_is_a_404(client: httpx.Client) -> None:
    assert client.get("/v1/sweeps/nope/progress").status_code == 404


def test_counts_of_sweeps_made_before_the_migration(database_url: str) -> None:
    """0014 counts the experiments of sweeps that were already stored."""
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        sweep = _sweep(c, 4)
        got = claim(c, register(c))
        assert got is not None and succeed(c, got).status_code == 200
    url = normalise_database_url(database_url)
    command.downgrade(alembic_config(url), "0013")
    command.upgrade(alembic_config(url), "head")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        assert _progress(c, sweep["id"])["progress"] == _counted(c, sweep["id"])
        assert _progress(c, sweep["id"])["finished"] == 1
