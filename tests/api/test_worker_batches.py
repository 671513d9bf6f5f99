"""Batch claims and batch reports of the worker protocol, on both engines: each
experiment its own lease, claimed exactly once, and each outcome stored or refused on
its own (a refused one changes nothing)."""

import base64
import threading
from collections import Counter
from typing import Any

import httpx

from tests.api.test_auth import bearer, create_token
from tests.api.test_worker_protocol import _events, _gz
from tests.conftest import Clock, LiveServer, make_settings
from tests.helpers import MEMORY, claim, register, submit
from vramlab.contract import CLAIM_BATCH_PATH, MAX_CLAIM_BATCH, MAX_REPORT_BATCH, REPORT_BATCH_PATH


def claim_batch(
    client: httpx.Client, worker: str, most: int, wait_s: float = 0
) -> list[dict[str, Any]]:
    body = {"worker_id": worker, "wait_s": wait_s, "max": most}
    response = client.post(CLAIM_BATCH_PATH, json=body)
    if response.status_code == 204:  # nothing came within wait_s
        return []
    assert response.status_code == 200, response.text
    got: list[dict[str, Any]] = response.json()["experiments"]
    return got


def item(claimed: dict[str, Any], **outcome: Any) -> dict[str, Any]:
    return {
        "experiment_id": claimed["id"],
        "lease_token": claimed["lease_token"],
        **(outcome or {"status": "succeeded", "result": {"memory": MEMORY}}),
    }


def report(client: httpx.Client, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = client.post(REPORT_BATCH_PATH, json={"results": items})
    assert response.status_code == 200, response.text
    verdicts: list[dict[str, Any]] = response.json()["results"]
    return verdicts


def test_a_batch_claim_takes_the_queue_in_order_each_with_its_lease(client: httpx.Client) -> None:
    ids = [submit(client)["id"] for _ in range(5)]
    urgent = submit(client, priority=0)["id"]
    worker = register(client)
    got = claim_batch(client, worker, 3)
    assert [g["id"] for g in got] == ids[:3]
    assert all(g["attempt"] == 1 and g["spec"]["op"] == "add" for g in got)
    rest = claim_batch(client, worker, MAX_CLAIM_BATCH)
    assert [g["id"] for g in rest] == [*ids[3:], urgent]
    nothing = client.post(CLAIM_BATCH_PATH, json={"worker_id": worker, "wait_s": 0, "max": 4})
    assert nothing.status_code == 204  # nothing left: as the single claim answers
    for g in got + rest:
        shown = client.get(f"/v1/experiments/{g['id']}").json()
        assert (shown["status"], shown["worker_id"]) == ("running", worker)
    # The single claim and the single report still work beside them.
    single = submit(client)["id"]
    one = claim(client, worker)
    assert one is not None and one["id"] == single


def test_batch_claims_of_8_claimers_take_each_experiment_once(database_url: str) -> None:
    with LiveServer(make_settings(database_url)) as live:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            ids = {submit(c)["id"] for _ in range(120)}
        claimed: list[str] = []
        verdicts: Counter[str] = Counter()
        lock = threading.Lock()

        def claimer(n: int) -> None:
            with httpx.Client(base_url=live.url, timeout=60) as c:
                worker = register(c, name=f"claimer-{n}")
                while got := claim_batch(c, worker, 1 + n % 7):
                    answer = report(c, [item(g) for g in got])
                    with lock:
                        claimed.extend(g["id"] for g in got)
                        verdicts.update(v["verdict"] for v in answer)

        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert Counter(claimed).most_common(1)[0][1] == 1 and set(claimed) == ids
        assert verdicts == {"stored": len(ids)}


def test_a_batch_report_refuses_late_and_foreign_outcomes_one_by_one(database_url: str) -> None:
    clock = Clock()
    ours_token, theirs_token, admin = (
        create_token(database_url, s) for s in ("worker", "worker", "admin")
    )
    settings = make_settings(database_url, lease_seconds=30, lease_check_seconds=0.05)
    with (
        LiveServer(settings, clock) as live,
        httpx.Client(base_url=live.url, headers=bearer(ours_token), timeout=60) as ours,
        httpx.Client(base_url=live.url, headers=bearer(theirs_token), timeout=60) as theirs,
        httpx.Client(base_url=live.url, headers=bearer(admin), timeout=60) as user,
    ):
        late_id = submit(user)["id"]
        ours_worker = register(ours)
        [late] = claim_batch(ours, ours_worker, 1)
        clock.advance(31)  # its lease expires; the reaper puts it back, and it is re-run
        [rerun] = claim_batch(ours, ours_worker, 1, wait_s=30)
        assert rerun["id"] == late_id and rerun["attempt"] == 2
        theirs_id = submit(user)["id"]
        theirs_worker = register(theirs)
        [foreign] = claim_batch(theirs, theirs_worker, 1)
        assert foreign["id"] == theirs_id
        for _ in range(4):
            submit(user)
        fresh = claim_batch(ours, ours_worker, 4)
        assert len(fresh) == 4
        url = f"/v1/worker/experiments/{fresh[2]['id']}"
        headers = {"X-Lease-Token": fresh[2]["lease_token"], "Content-Type": "application/gzip"}
        assert ours.put(f"{url}/trace/0", content=_gz(_events(30)), headers=headers).is_success
        failure = {"type": "oom", "message": "out of memory"}
        verdicts = report(
            ours,
            [
                item(fresh[0]),
                item(late),  # late: its lease expired, and a later claim re-runs it
                item(foreign),  # foreign: another token's worker holds it
                item(fresh[1], status="failed", error=failure),
                # trace events that were never uploaded: refused, the lease stays
                item(fresh[2], status="succeeded", result={"memory": MEMORY}, trace_events=50),
                item(fresh[0]),  # the same outcome twice: the first stood
            ],
        )
        assert [(v["experiment_id"], v["verdict"]) for v in verdicts] == [
            (fresh[0]["id"], "stored"),
            (late_id, "lease_lost"),
            (theirs_id, "refused"),
            (fresh[1]["id"], "stored"),
            (fresh[2]["id"], "refused"),
            (fresh[0]["id"], "lease_lost"),
        ]
        assert verdicts[0]["status"] == "succeeded" and verdicts[3]["status"] == "failed"
        assert "another token" in verdicts[2]["error"] and "30" in verdicts[4]["error"]
        # The refused ones changed nothing: the re-run, theirs and the traced one still run.
        for exp_id in (late_id, theirs_id, fresh[2]["id"]):
            shown = user.get(f"/v1/experiments/{exp_id}").json()
            assert shown["status"] == "running" and shown["result"] is None
        assert user.get(f"/v1/experiments/{theirs_id}").json()["worker_id"] == theirs_worker
        # Their own report, the re-run's and the corrected one are stored.
        assert report(theirs, [item(foreign)])[0]["verdict"] == "stored"
        assert report(ours, [item(rerun)])[0]["verdict"] == "stored"
        fixed = item(fresh[2], status="succeeded", result={"memory": MEMORY}, trace_events=30)
        assert report(ours, [fixed, item(fresh[3])])[0]["verdict"] == "stored"
        statuses = [user.get(f"/v1/experiments/{g['id']}").json()["status"] for g in fresh]
        assert statuses == ["succeeded", "failed", "succeeded", "succeeded"]


def test_batches_are_bounded(client: httpx.Client) -> None:
    worker = register(client)
    for most in (0, MAX_CLAIM_BATCH + 1):
        body = {"worker_id": worker, "wait_s": 0, "max": most}
        assert client.post(CLAIM_BATCH_PATH, json=body).status_code == 422
    submit(client)
    [got] = claim_batch(client, worker, 1)
    # No outcome may name an id that is not one: an empty id, or one with a slash, would
    # make a path of another route (POST /v1/experiments//cancel answered 405).
    odd = [{**item(got), "experiment_id": bad} for bad in ("", "a/b", "ABC", " x")]
    for items in ([], [item(got)] * (MAX_REPORT_BATCH + 1), *([o] for o in odd)):
        refused = client.post(REPORT_BATCH_PATH, json={"results": items})
        assert refused.status_code == 422, refused.text
    assert client.get(f"/v1/experiments/{got['id']}").json()["status"] == "running"


def test_a_batch_report_carries_small_traces_with_their_outcomes(client: httpx.Client) -> None:
    """A trace inside its outcome (``trace_gz``) is stored as if uploaded, with the
    outcome; one that does not hold up is refused alone and changes nothing."""
    ids = [submit(client)["id"] for _ in range(5)]
    worker = register(client)
    got = claim_batch(client, worker, 5)
    assert [g["id"] for g in got] == ids
    sent = _events(6)

    def traced(claimed: dict[str, Any], trace: str, events: int) -> dict[str, Any]:
        outcome = {"status": "succeeded", "result": {"memory": MEMORY}, "trace_events": events}
        return item(claimed, **outcome, trace_gz=trace)

    inline = base64.b64encode(_gz(sent)).decode()
    headers = {"X-Lease-Token": got[3]["lease_token"], "Content-Type": "application/gzip"}
    uploaded = client.put(
        f"/v1/worker/experiments/{got[3]['id']}/trace/0", content=_gz(sent), headers=headers
    )
    assert uploaded.status_code == 200, uploaded.text
    verdicts = report(
        client,
        [
            traced(got[0], inline, 6),
            traced(got[1], "not base64!", 6),
            traced(got[2], inline, 5),  # says 5 events, sends 6
            traced(got[3], inline, 6),  # its chunk 0 was uploaded already
            traced(got[4], base64.b64encode(b"not gzip").decode(), 6),
        ],
    )
    assert [v["verdict"] for v in verdicts] == ["stored", *["refused"] * 4]
    assert "base64" in verdicts[1]["error"] and "trace_events" in verdicts[2]["error"]
    assert "uploaded already" in verdicts[3]["error"] and "gzip" in verdicts[4]["error"]
    trace = client.get(f"/v1/experiments/{ids[0]}/trace").json()
    assert [(e["action"], e["size"]) for e in trace["events"]] == [
        (e["action"], e["size"]) for e in sent
    ]
    for refused_id in ids[1:]:
        assert client.get(f"/v1/experiments/{refused_id}").json()["status"] == "running"
    # A refused one is reported again as it should have been.
    again = report(client, [traced(got[2], inline, 6)])
    assert again[0]["verdict"] == "stored"
    assert len(client.get(f"/v1/experiments/{ids[2]}/trace").json()["events"]) == 6
