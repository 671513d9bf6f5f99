"""The worker protocol over HTTP: claims only what a worker can run, leases, tokens,
trace upload, and expiry back into the queue."""

import gzip
import json
import threading
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.api.test_auth import bearer, create_token
from tests.api.test_claim_wakes import looks
from tests.conftest import LiveServer, make_settings
from tests.helpers import (
    ADD,
    CPU_CAPS,
    CUDA_CAPS,
    MATMUL,
    MEMORY,
    claim,
    register,
    submit,
    succeed,
)
from vramlab.contract import MIN_WORKER_VERSION
from vramlab.runspec import DEFAULT_SEQ_LEN, RunSpec


def test_claim_matches_capabilities(client: httpx.Client) -> None:
    cuda_exp = submit(client, MATMUL)
    cpu_exp = submit(client, ADD)
    cpu_worker = register(client, CPU_CAPS)
    got = claim(client, cpu_worker)
    assert got is not None and got["id"] == cpu_exp["id"]
    assert claim(client, cpu_worker) is None
    gpu_worker = register(client, CUDA_CAPS)
    got = claim(client, gpu_worker)
    assert got is not None and got["id"] == cuda_exp["id"]
    assert got["spec"]["device"] == "cuda:0"
    assert got["spec"]["prediction"]["delta_allocated"] == 2_000_384


def test_requirements_gpu_name_and_second_gpu(client: httpx.Client) -> None:
    h200 = submit(client, MATMUL, requirements={"gpu_name": "H200"})
    second = submit(client, MATMUL, device="cuda:1")
    h100 = register(client, CUDA_CAPS)
    assert claim(client, h100) is None
    assert "H200" in client.get(f"/v1/experiments/{h200['id']}").json()["queue"]["reason"]
    two_h200 = {
        "device_types": ["cpu", "cuda"],
        "gpus": [{"index": i, "name": "NVIDIA H200", "total_memory": 141 * 2**30} for i in (0, 1)],
    }
    worker = register(client, two_h200)
    claimed = {claim(client, worker)["id"], claim(client, worker)["id"]}  # type: ignore[index]
    assert claimed == {h200["id"], second["id"]}


def test_result_is_stored_and_stale_tokens_refused(client: httpx.Client) -> None:
    exp = submit(client)
    worker = register(client)
    got = claim(client, worker)
    assert got is not None and got["attempt"] == 1
    running = client.get(f"/v1/experiments/{exp['id']}").json()
    assert running["status"] == "running" and running["worker_id"] == worker
    beat = client.post(
        f"/v1/worker/experiments/{exp['id']}/heartbeat",
        json={"lease_token": got["lease_token"], "progress": {"phase": "op"}},
    )
    assert beat.status_code == 200 and beat.json()["cancel_requested"] is False
    wrong = succeed(client, {**got, "lease_token": "0" * 32})
    assert wrong.status_code == 409 and wrong.json()["error"]["type"] == "lease_lost"
    assert succeed(client, got, notes=["hello"]).status_code == 200
    done = client.get(f"/v1/experiments/{exp['id']}").json()
    assert done["status"] == "succeeded"
    assert done["result"]["notes"] == ["hello"]
    assert done["result"]["memory"]["delta_allocated"] == 0
    assert succeed(client, got).status_code == 409  # finished: the token owns nothing now


def test_succeeded_needs_the_contract_memory_figures(client: httpx.Client) -> None:
    submit(client)
    got = claim(client, register(client))
    assert got is not None
    body = {
        "lease_token": got["lease_token"],
        "status": "succeeded",
        "result": {"memory": {"allocated_before": 1}},
    }
    response = client.post(f"/v1/worker/experiments/{got['id']}/result", json=body)
    assert response.status_code == 422
    assert "allocated_after" in response.text


def test_failure_is_recorded_with_its_type(client: httpx.Client) -> None:
    exp = submit(client)
    got = claim(client, register(client))
    assert got is not None
    body = {
        "lease_token": got["lease_token"],
        "status": "failed",
        "error": {"type": "oom", "message": "CUDA out of memory", "hint": "smaller shape"},
        "result": {"memory": {**MEMORY, "allocated_before": 5}},
    }
    assert client.post(f"/v1/worker/experiments/{got['id']}/result", json=body).status_code == 200
    done = client.get(f"/v1/experiments/{exp['id']}").json()
    assert done["status"] == "failed"
    assert done["result"]["memory"]["allocated_before"] == 5
    assert done["error"] == {
        "type": "oom",
        "message": "CUDA out of memory",
        "hint": "smaller shape",
        "details": None,
    }


def test_a_claim_carries_the_byte_cap_and_memory_limit_is_recorded(database_url: str) -> None:
    with LiveServer(make_settings(database_url, max_experiment_bytes=64 * 2**20)) as live:
        with httpx.Client(base_url=live.url) as c:
            exp = submit(c)
            got = claim(c, register(c))
            assert got is not None
            # The worker holds the run to the cap, not only the plan (workers/limits.py).
            assert got["spec"]["memory_limit_bytes"] == 64 * 2**20
            error = {
                "type": "memory_limit",
                "message": "the run asked for 961.0 MiB on the CPU",
                "details": {"limit_bytes": 64 * 2**20, "requested_bytes": 1_007_681_536},
            }
            body = {"lease_token": got["lease_token"], "status": "failed", "error": error}
            posted = c.post(f"/v1/worker/experiments/{got['id']}/result", json=body)
            assert posted.status_code == 200, posted.text
            done = c.get(f"/v1/experiments/{exp['id']}").json()
            assert done["error"]["type"] == "memory_limit"
            assert done["error"]["details"]["limit_bytes"] == 64 * 2**20


def _events(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "seq": start + i,
            "action": "alloc" if i % 2 == 0 else "free",
            "size": 512 * (i + 1),
            "t_us": float(i),
        }
        for i in range(n)
    ]


def _gz(events: list[dict[str, Any]]) -> bytes:
    return gzip.compress(b"".join(json.dumps(e).encode() + b"\n" for e in events))


def test_trace_upload_and_read_back(client: httpx.Client) -> None:
    exp = submit(client)
    got = claim(client, register(client))
    assert got is not None
    headers = {"X-Lease-Token": got["lease_token"], "Content-Type": "application/gzip"}
    url = f"/v1/worker/experiments/{exp['id']}/trace"
    assert client.put(f"{url}/0", content=_gz(_events(30)), headers=headers).json()["events"] == 30
    assert client.put(f"{url}/1", content=_gz(_events(20, 30)), headers=headers).status_code == 200
    assert client.put(f"{url}/5", content=_gz(_events(1)), headers=headers).status_code == 409
    bad = client.put(f"{url}/2", content=b"not gzip", headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "bad_request"
    stale = client.put(
        f"{url}/2", content=_gz(_events(1)), headers={**headers, "X-Lease-Token": "x"}
    )
    assert stale.status_code == 409
    assert succeed(client, got).status_code == 200

    trace = f"/v1/experiments/{exp['id']}/trace"
    page = client.get(trace, params={"limit": 20, "offset": 25}).json()
    assert page["total"] == 50 and page["next_offset"] == 45
    assert [e["seq"] for e in page["events"]] == list(range(25, 45))
    # Event i of a chunk is a free when i is odd and has size 512 * (i + 1).
    frees = client.get(trace, params={"action": "free", "min_size": 512 * 20}).json()["events"]
    assert [e["seq"] for e in frees] == [19, 21, 23, 25, 27, 29, 49]
    streamed = client.get(trace, params={"format": "ndjson"})
    assert streamed.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["seq"] for line in streamed.text.splitlines()] == list(range(50))


def test_release_puts_it_back_without_an_attempt(client: httpx.Client) -> None:
    exp = submit(client)
    worker = register(client)
    got = claim(client, worker)
    assert got is not None
    client.post(
        f"/v1/worker/experiments/{exp['id']}/release", json={"lease_token": got["lease_token"]}
    )
    back = client.get(f"/v1/experiments/{exp['id']}").json()
    assert back["status"] == "queued" and back["attempts"] == 0
    assert claim(client, worker)["attempt"] == 1  # type: ignore[index]


def test_cancel_a_running_experiment_reaches_the_worker(client: httpx.Client) -> None:
    exp = submit(client)
    got = claim(client, register(client))
    assert got is not None
    assert client.post(f"/v1/experiments/{exp['id']}/cancel").json()["cancel_requested"] is True
    beat = client.post(
        f"/v1/worker/experiments/{exp['id']}/heartbeat", json={"lease_token": got["lease_token"]}
    )
    assert beat.json()["cancel_requested"] is True
    body = {"lease_token": got["lease_token"], "status": "cancelled"}
    client.post(f"/v1/worker/experiments/{exp['id']}/result", json=body)
    assert client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "cancelled"


def test_a_new_experiment_wakes_a_waiting_claim(database_url: str) -> None:
    # Without the wake-up this claim would only look again after 30 s and answer 204 at 8 s.
    settings = make_settings(database_url, claim_wait_seconds=8.0, claim_poll_seconds=30.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        worker = register(client)
        got: list[dict[str, Any] | None] = []
        waiter = threading.Thread(target=lambda: got.append(claim(client, worker, wait_s=8)))
        waiter.start()
        deadline = time.monotonic() + 10
        while looks(client).get("false", 0) < 1:  # the claim looked, found nothing, waits
            assert time.monotonic() < deadline, looks(client)
            time.sleep(0.02)
        exp = submit(client)
        waiter.join()
        assert got[0] is not None and got[0]["id"] == exp["id"]


def test_unknown_worker_must_register(client: httpx.Client) -> None:
    response = client.post("/v1/worker/claim", json={"worker_id": "ghost", "wait_s": 0})
    assert response.status_code == 404 and "register" in response.json()["error"]["message"]


def test_workers_are_listed_with_capabilities(client: httpx.Client) -> None:
    worker = register(client, CUDA_CAPS, name="gpu-box")
    listed = client.get("/v1/workers").json()
    assert [(w["id"], w["name"], w["live"]) for w in listed] == [(worker, "gpu-box", True)]
    assert listed[0]["capabilities"]["gpus"][0]["name"].startswith("NVIDIA H100")


def test_worker_token_is_required_when_configured(database_url: str) -> None:
    settings = make_settings(database_url, worker_token="s3cret")
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:
        body = {"name": "w", "capabilities": CPU_CAPS}
        denied = client.post("/v1/worker/register", json=body)
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "unauthorized"
        auth = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/worker/register", json=body, headers=auth).status_code == 200


def test_a_worker_id_belongs_to_the_token_that_registered_it(database_url: str) -> None:
    first, second, admin = (create_token(database_url, s) for s in ("worker", "worker", "admin"))
    with LiveServer(make_settings(database_url)) as live:
        ours = httpx.Client(base_url=live.url, headers=bearer(first))
        theirs = httpx.Client(base_url=live.url, headers=bearer(second))
        exp = submit(httpx.Client(base_url=live.url, headers=bearer(admin)))
        worker = register(ours)
        # Claiming as a worker that another token registered: no such worker, for them.
        stolen = theirs.post("/v1/worker/claim", json={"worker_id": worker, "wait_s": 0})
        assert stolen.status_code == 404, stolen.text
        assert "register again" in stolen.json()["error"]["message"]
        got = claim(ours, worker)
        assert got is not None and got["id"] == exp["id"]
        # Even with the lease token, the other token cannot act on the claimed experiment.
        lease = {"lease_token": got["lease_token"]}
        for call in ("heartbeat", "release"):
            refused = theirs.post(f"/v1/worker/experiments/{exp['id']}/{call}", json=lease)
            assert refused.status_code == 403, (call, refused.text)
        assert succeed(theirs, got).status_code == 403
        assert ours.post(f"/v1/worker/experiments/{exp['id']}/heartbeat", json=lease).is_success
        assert succeed(ours, got).status_code == 200


def test_every_field_a_worker_sends_is_bounded(client: httpx.Client) -> None:
    h200 = {"name": "NVIDIA H200", "total_memory": 141 * 2**30}
    fake = {"index": 0, "name": "NVIDIA H200", "total_memory": 2**50}
    refused_caps: list[dict[str, Any]] = [
        {"device_types": ["cpu", "cuda"], "gpus": [{**fake, "index": i} for i in range(8)]},
        {"device_types": ["cuda"], "gpus": [{**h200, "index": i} for i in range(17)]},
        {"device_types": ["cuda"], "gpus": [{**h200, "index": 0}, {**h200, "index": 0}]},
        {"device_types": ["cpu"], "gpus": [{**h200, "index": 0}]},
        {"device_types": ["cuda", "cuda", "cuda"]},
        {"device_types": ["cpu"], "torch": "x" * 65},
        {"device_types": ["cpu"], **{f"extra{i}": 1 for i in range(17)}},
        {"device_types": ["cpu"], "notes": "x" * 5000},
        {"device_types": ["cpu"], "nested": {"a": "\x00"}},
    ]
    for caps in refused_caps:
        response = client.post("/v1/worker/register", json={"name": "w", "capabilities": caps})
        assert response.status_code == 422, (str(caps)[:80], response.text[:200])
        assert response.json()["error"]["type"] == "validation_error"
    for name in ("w\x00", "w\x1b[31m"):
        body = {"name": name, "capabilities": CPU_CAPS}
        assert client.post("/v1/worker/register", json=body).status_code == 422
    # A real host's capabilities, with extras the probe may add, still register.
    caps = {**CUDA_CAPS, "gpus": [{**h200, "index": i} for i in range(8)], "arch": "sm_90"}
    worker = register(client, caps)

    exp = submit(client)
    got = claim(client, worker)
    assert got is not None and got["id"] == exp["id"]
    url = f"/v1/worker/experiments/{exp['id']}/heartbeat"
    for progress in (
        {"log": "x" * 500_000},
        {"nested": {"deep": [1, 2, 3]}},
        {f"k{i}": i for i in range(17)},
        {"at": "\x00"},
    ):
        beat = client.post(url, json={"lease_token": got["lease_token"], "progress": progress})
        assert beat.status_code == 422, (str(progress)[:60], beat.text[:200])
    fine = {"state": "running", "repeat": 2, "of": 3}
    beat = client.post(url, json={"lease_token": got["lease_token"], "progress": fine})
    assert beat.status_code == 200  # checked, then not kept: nothing reads it
    nan = b'{"lease_token": "%s", "progress": {"at": NaN}}' % got["lease_token"].encode()
    beat = client.post(url, content=nan, headers={"Content-Type": "application/json"})
    assert beat.status_code == 422


def test_an_outcome_must_count_the_trace_it_uploaded(client: httpx.Client) -> None:
    exp = submit(client)
    got = claim(client, register(client))
    assert got is not None
    headers = {"X-Lease-Token": got["lease_token"], "Content-Type": "application/gzip"}
    url = f"/v1/worker/experiments/{exp['id']}"
    assert client.put(f"{url}/trace/0", content=_gz(_events(30)), headers=headers).is_success
    body = {"lease_token": got["lease_token"], "status": "succeeded", "result": {"memory": MEMORY}}
    short = client.post(f"{url}/result", json={**body, "trace_events": 50})
    assert short.status_code == 400 and "30" in short.json()["error"]["message"]
    assert client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "running"
    assert client.post(f"{url}/result", json={**body, "trace_events": 30}).status_code == 200


def test_a_claim_whose_worker_left_gives_the_experiment_back(database_url: str) -> None:
    """A worker cut its poll short (it is stopping) while the claim waited for the
    database: the claim that then succeeds is given back, not left running unseen."""
    settings = make_settings(database_url, claim_wait_seconds=5.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        exp = submit(client)
        worker_id = register(client)
        (registered,) = client.get("/v1/workers").json()
        engine = create_engine(database_url)
        try:
            with engine.connect() as holder:
                # Another writer holds the queue, so the claim waits inside the database.
                if engine.dialect.name == "sqlite":
                    holder.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    holder.execute(text("LOCK TABLE experiments IN ACCESS EXCLUSIVE MODE"))
                with pytest.raises(httpx.ReadTimeout):  # the worker gives up and goes
                    client.post(
                        "/v1/worker/claim",
                        json={"worker_id": worker_id, "wait_s": 5},
                        timeout=httpx.Timeout(30, read=1.0),
                    )
                holder.rollback()
        finally:
            engine.dispose()
        deadline = time.monotonic() + 30
        # The claim has run once the worker was seen again (a claim touches its worker).
        while client.get("/v1/workers").json()[0]["last_seen_at"] == registered["last_seen_at"]:
            assert time.monotonic() < deadline, "the claim never ran"
            time.sleep(0.05)
        while (got := client.get(f"/v1/experiments/{exp['id']}").json())["status"] == "running":
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        assert got["status"] == "queued" and got["attempts"] == 0, got


# The claim's spec as workers of the release before the typed run spec read it: its keys
# and the model params flat in ``params``. An old worker keeps working against this API.
WIRE_SPEC_KEYS = {
    "op",
    "shape",
    "params",
    "dtype",
    "device",
    "warmup",
    "repeat",
    "timeout_s",
    "allocator",
    "trace",
    "isolation",
    "steps",
    "prediction",
    "memory_limit_bytes",
}


def test_a_claimed_spec_keeps_the_wire_form_older_workers_read(client: httpx.Client) -> None:
    submit(client, {**ADD, "allocator": {"expandable_segments": True}})
    got = claim(client, register(client))
    assert got is not None
    spec = got["spec"]
    assert set(spec) == WIRE_SPEC_KEYS
    assert spec["allocator"] == {"expandable_segments": True}
    assert (
        spec["prediction"]["delta_allocated"]
        == spec["prediction"]["allocated_after"] - (spec["prediction"]["allocated_before"])
    )
    # The worker of this release reads it typed, and writes it back the same.
    run = RunSpec.from_wire(spec)
    assert run.allocator.expandable_segments is True and run.model is None
    assert run.wire() == spec


def test_a_claimed_model_spec_has_its_params_flat_and_typed(database_url: str) -> None:
    body = {
        "op": "model",
        "shape": [],
        "params": {"model": "gpt2", "batch_size": 2},
        "device": "cpu",
    }
    # The spec's wire form is the question here, not its prediction (measured elsewhere).
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        submit(client, body)
        got = claim(client, register(client))
    assert got is not None
    spec = got["spec"]
    assert set(spec) == WIRE_SPEC_KEYS
    assert spec["params"]["model"] == "gpt2" and spec["params"]["batch_size"] == 2
    run = RunSpec.from_wire(spec)
    assert run.model is not None and run.model.batch_size == 2
    assert run.model.seq_len_or_default == DEFAULT_SEQ_LEN
    assert run.wire() == spec


def test_a_worker_older_than_the_api_speaks_to_is_refused_at_register(
    client: httpx.Client,
) -> None:
    """A worker says its version at register; one older than the contract's minimum is
    refused in the one error shape, naming both versions and what to install. One that
    says none (before versioned registers) still registers, for this release."""
    body = {"name": "old", "capabilities": CPU_CAPS}
    old = client.post("/v1/worker/register", json={**body, "version": "0.0.9"})
    assert old.status_code == 400, old.text
    error = old.json()["error"]
    assert error["type"] == "worker_too_old"
    assert "vramlab-worker 0.0.9" in error["message"]
    assert f"vramlab-worker {MIN_WORKER_VERSION}" in error["message"]
    assert f"pip install -U 'vramlab-worker>={MIN_WORKER_VERSION}'" in error["message"]
    assert error["details"] == [
        {"field": "version", "message": f"0.0.9 is older than {MIN_WORKER_VERSION}"}
    ]
    assert client.get("/v1/workers").json() == []  # nothing registered
    for version in (MIN_WORKER_VERSION, "0.1", "0.10.0", "1.0.0rc1+cu126", None):
        sent = body if version is None else {**body, "version": version}
        ok = client.post("/v1/worker/register", json=sent)
        assert ok.status_code == 200, (version, ok.text)
    bad = client.post("/v1/worker/register", json={**body, "version": "latest"})
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "version"
