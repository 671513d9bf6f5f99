"""Submitting, reading, listing and cancelling experiments over HTTP."""

import sqlite3
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

from tests.conftest import Clock, LiveServer, make_settings
from tests.helpers import ADD, CPU_CAPS, CUDA_CAPS, MATMUL, claim, register, submit


def test_submit_queues_and_reads_back(client: httpx.Client) -> None:
    exp = submit(client, MATMUL, tags=["demo"])
    assert exp["status"] == "queued"
    assert exp["spec"]["device"] == "cuda:0"
    # Params come back complete: the catalog fills defaults (requires_grad: False).
    assert exp["spec"]["params"] == {"other_shape": [2000, 500], "requires_grad": False}
    assert exp["attempts"] == 0
    # 1000x500 float32 output, rounded up to the allocator's 512-byte blocks.
    assert exp["prediction"]["delta_allocated"] == 2_000_384
    again = client.get(f"/v1/experiments/{exp['id']}").json()
    assert again["id"] == exp["id"] and again["spec"]["tags"] == ["demo"]


def test_queued_experiment_says_why_no_worker_runs_it(client: httpx.Client) -> None:
    exp = submit(client, MATMUL)
    assert exp["queue"]["runnable"] is False
    assert "no live worker" in exp["queue"]["reason"]
    register(client, CPU_CAPS)
    queue = client.get(f"/v1/experiments/{exp['id']}").json()["queue"]
    assert queue == {
        "runnable": False,
        "live_workers": 1,
        "reason": "no live worker can run it: it needs a cuda worker",
    }
    cpu = submit(client, ADD)
    assert client.get(f"/v1/experiments/{cpu['id']}").json()["queue"]["runnable"] is True


def test_a_submit_answers_what_reading_it_back_gives(client: httpx.Client) -> None:
    # The answer is built from the row inserted, not read back: it must not drift.
    register(client, CUDA_CAPS)
    spec = {
        **MATMUL,
        "tags": ["a", "b", "a"],
        "requirements": {"gpu_name": "H100", "min_memory_bytes": 2**30},
        "allocator": {"expandable_segments": True},
        "priority": -3,
        "warmup": 2,
        "trace": "stacks",
    }
    posted = submit(client, spec)
    assert posted == client.get(f"/v1/experiments/{posted['id']}").json()
    assert posted["spec"]["tags"] == ["a", "b"] and posted["queue"]["runnable"] is True
    keyed = client.post("/v1/experiments", json=ADD, headers={"Idempotency-Key": "k"}).json()
    assert keyed == client.get(f"/v1/experiments/{keyed['id']}").json()


def test_the_live_workers_a_submit_sees_follow_each_change_at_once(database_url: str) -> None:
    # What submits read of the live workers is kept for a second: each change this API
    # makes must still show in the very next submit.
    clock = Clock()
    with LiveServer(make_settings(database_url), clock) as live:
        with httpx.Client(base_url=live.url) as c:
            assert submit(c)["queue"]["live_workers"] == 0
            worker = register(c)
            assert submit(c)["queue"] == {"runnable": True, "live_workers": 1, "reason": None}
            clock.advance(61)  # silent for longer than VRAMLAB_WORKER_LIVE_SECONDS
            assert submit(c)["queue"]["live_workers"] == 0
            assert claim(c, worker) is not None  # heard from again
            assert submit(c)["queue"]["live_workers"] == 1
            assert c.post("/v1/worker/stop", json={"worker_id": worker}).status_code == 204
            assert submit(c)["queue"]["live_workers"] == 0


def test_a_worker_that_misses_its_heartbeats_stops_counting_as_live(database_url: str) -> None:
    # A worker container SIGKILLed mid-experiment still counted as live for a minute: the
    # queue said `runnable: true` with nothing to run the work. It counts until it misses
    # its heartbeats; a busy one that beats on time counts however long it runs.
    clock = Clock()
    with LiveServer(make_settings(database_url), clock) as live:
        with httpx.Client(base_url=live.url) as c:
            reply = c.post("/v1/worker/register", json={"name": "w", "capabilities": CPU_CAPS})
            worker, beat = reply.json()["worker_id"], reply.json()["heartbeat_seconds"]

            def counted() -> tuple[int, bool]:
                listed = {w["id"]: w["live"] for w in c.get("/v1/workers").json()}
                # A CUDA spec: this CPU worker never claims it, but counts it as live.
                return submit(c, MATMUL)["queue"]["live_workers"], listed[worker]

            exp = submit(c)
            claimed = claim(c, worker)
            assert claimed is not None and claimed["id"] == exp["id"]
            for _ in range(40):  # 80 s of a running experiment, heard from on time
                clock.advance(beat)
                lease = {"lease_token": claimed["lease_token"]}
                assert c.post(f"/v1/worker/experiments/{exp['id']}/heartbeat", json=lease)
                assert counted() == (1, True)
            clock.advance(2 * beat)  # killed: its next beat is late, not yet missed
            assert counted() == (1, True)
            clock.advance(3 * beat)  # five beats unheard
            assert counted() == (0, False)
            assert claim(c, worker) is None  # an idle worker's claim: heard from again
            assert counted() == (1, True)
            clock.advance(5 * beat)
            assert counted() == (0, False)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_submit_reads_none_of_the_queue(database_url: str) -> None:
    # Before: counting a submitter's queued experiments looked up every one of their rows
    # (the id is not in the index it walks), up to 10,000 of them on each submit; then it
    # walked the index alone, still one entry per queued experiment.
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        for _ in range(3):
            submit(c)
        statements: list[tuple[str, Any]] = []

        def record(*args: Any) -> None:
            statements.append((args[2], args[3]))

        engine = live.app.state.db.engine
        event.listen(engine, "before_cursor_execute", record)
        try:
            submit(c)
        finally:
            event.remove(engine, "before_cursor_execute", record)
    # The quota is the submitter's one row of counts, read by its key by the INSERT
    # itself (INSERT … SELECT … WHERE under the cap).
    reads = [(sql, params) for sql, params in statements if "SELECT" in sql]
    assert any("FROM submitter_queues" in sql for sql, _ in reads), statements
    with sqlite3.connect(str(make_url(database_url).database)) as raw:
        for sql, params in reads:
            plan = [row[3] for row in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            for step in plan:
                assert "experiments " not in step + " ", (sql, plan)
                if "submitter_queues" in step:
                    assert step.startswith("SEARCH"), (sql, plan)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"op": "explode"}, "op", "allowed: empty"),
        ({"dtype": "float128"}, "dtype", "allowed: float64"),
        ({"device": "tpu"}, "device", "allowed: 'cpu'"),
        ({"device": "cuda:99"}, "device", "out of range"),
        ({"shape": [10, -1]}, "shape[1]", "greater than or equal to 0"),
        ({"shape": [1] * 9}, "shape", "at most 8"),
        ({"shape": [1_000_000, 1_000_000]}, "shape", "VRAMLAB_MAX_EXPERIMENT_BYTES"),
        ({"params": {"bogus": 1}}, "params.bogus", "unknown parameter"),
        ({"colour": "red"}, "colour", "Extra inputs"),
        ({"repeat": 0}, "repeat", "greater than or equal to 1"),
        ({"trace": "everything"}, "trace", "'none', 'events' or 'stacks'"),
        (
            {"op": "matmul", "params": {"other_shape": [7, 3]}},
            "params.other_shape",
            "inner dims differ",
        ),
        ({"op": "matmul"}, "params.other_shape", "is required"),
        ({"op": "randn", "dtype": "int32"}, "dtype", "does not take 'int32'"),
        ({"allocator": {"backend": "magic"}}, "allocator.backend", "native"),
        ({"isolation": "pooled"}, "isolation", "'clean' or 'shared'"),
        (
            {"isolation": "shared", "allocator": {"expandable_segments": True}},
            "isolation",
            "sets allocator.expandable_segments",
        ),
    ],
)
def test_bad_specs_are_422_naming_the_field(
    client: httpx.Client, change: dict[str, object], field: str, words: str
) -> None:
    response = client.post("/v1/experiments", json={**ADD, **change})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error"
    fields = {d["field"]: d["message"] for d in error["details"]}
    assert field in fields, fields
    assert words in fields[field]
    assert client.get("/v1/experiments").json()["items"] == []


def test_malformed_json_is_422_in_the_one_shape(client: httpx.Client) -> None:
    response = client.post(
        "/v1/experiments", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "validation_error"


def test_unknown_id_is_404(client: httpx.Client) -> None:
    response = client.get("/v1/experiments/nope")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_list_filters_and_cursor(client: httpx.Client) -> None:
    ids = [submit(client, ADD, tags=["t" if i % 2 else "u"])["id"] for i in range(7)]
    submit(client, MATMUL)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"op": "add", "limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/experiments", params=params).json()
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    tagged = client.get("/v1/experiments", params={"tag": "t"}).json()["items"]
    assert {e["id"] for e in tagged} == {ids[i] for i in (1, 3, 5)}
    cuda = client.get("/v1/experiments", params={"device": "cuda:0"}).json()["items"]
    assert [e["spec"]["op"] for e in cuda] == ["matmul"]
    bad = client.get("/v1/experiments", params={"cursor": "garbage!"})
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "cursor"


def test_cancel_a_queued_experiment(client: httpx.Client) -> None:
    exp = submit(client)
    response = client.post(f"/v1/experiments/{exp['id']}/cancel")
    assert response.json()["status"] == "cancelled"
    again = client.post(f"/v1/experiments/{exp['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict"
    listed = client.get("/v1/experiments", params={"status": "cancelled"}).json()["items"]
    assert [e["id"] for e in listed] == [exp["id"]]


def test_catalog_lists_ops_with_params(client: httpx.Client) -> None:
    catalog = client.get("/v1/catalog").json()
    ops = {op["name"]: op for op in catalog["ops"]}
    assert {"empty", "randn", "add", "matmul", "to"} <= set(ops)
    to_params = {p["name"] for p in ops["to"]["params"]}
    assert {"pin_memory", "non_blocking", "source_device"} <= to_params
    assert {"name": "bfloat16", "itemsize": 2} in catalog["dtypes"]


def test_health_and_docs(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["schema"]
    assert client.get("/docs").status_code == 200
    assert "/v1/experiments" in client.get("/openapi.json").json()["paths"]


def test_metrics_count_the_queue_for_prometheus(client: httpx.Client) -> None:
    submit(client)
    cancelled = submit(client)
    client.post(f"/v1/experiments/{cancelled['id']}/cancel")
    register(client, CPU_CAPS)
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'vramlab_experiments{status="queued"} 1.0' in text
    assert 'vramlab_experiments{status="cancelled"} 1.0' in text
    assert "vramlab_workers_live 1.0" in text


def test_isolation_is_kept_and_handed_to_the_worker(client: httpx.Client) -> None:
    clean = submit(client)
    shared = submit(client, isolation="shared")
    assert clean["spec"]["isolation"] == "clean"
    assert shared["spec"]["isolation"] == "shared"
    assert client.get(f"/v1/experiments/{shared['id']}").json()["spec"]["isolation"] == "shared"
    worker = register(client)
    claimed = [claim(client, worker) for _ in range(2)]
    handed = {c["id"]: c["spec"]["isolation"] for c in claimed if c is not None}
    assert handed == {clean["id"]: "clean", shared["id"]: "shared"}


def test_a_sweep_and_a_preset_carry_isolation(client: httpx.Client) -> None:
    body = {"spec": {**ADD, "isolation": "shared"}, "grid": {"shape": [[8], [16]]}}
    sweep = client.post("/v1/sweeps", json=body)
    assert sweep.status_code == 202, sweep.text
    for row in sweep.json()["rows"]:
        exp = client.get(f"/v1/experiments/{row['experiment_id']}").json()
        assert exp["spec"]["isolation"] == "shared"
    grid = {"spec": ADD, "grid": {"isolation": ["clean", "shared"]}}
    rows = client.post("/v1/sweeps", json=grid).json()["rows"]
    assert [r["values"] for r in rows] == [{"isolation": "clean"}, {"isolation": "shared"}]
    run = client.post(
        "/v1/presets/cpu_copy_stays_alive/runs",
        json={"device": "cpu", "size": "small", "isolation": "shared"},
    )
    assert run.status_code == 202, run.text
    assert run.json()["spec"]["isolation"] == "shared"
