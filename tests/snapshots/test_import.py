"""Importing PyTorch memory snapshots over HTTP: stored beside experiments, explained,
exported back; on SQLite and PostgreSQL."""

import gzip
import json
import pickle
from typing import Any

import httpx
import pytest

from tests.snapshots.synthetic import MiB, dumps, training_snapshot


def post(client: httpx.Client, body: bytes, **params: Any) -> httpx.Response:
    return client.post(
        "/v1/snapshots",
        content=body,
        params=params,
        headers={"Content-Type": "application/octet-stream"},
    )


def imported(client: httpx.Client, body: bytes, **params: Any) -> dict[str, Any]:
    response = post(client, body, **params)
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()
    return data


def test_a_training_snapshot_is_explained(client: httpx.Client) -> None:
    snap = training_snapshot(iterations=3, layers=4)
    out = imported(client, gzip.compress(dumps(snap)), name="train", tag=["a", "b"])
    assert out["kind"] == "snapshot" and out["status"] == "succeeded"
    assert out["gzipped"] and out["name"] == "train" and out["tags"] == ["a", "b"]
    assert out["entries"] == len(snap["device_traces"][0]) == out["events"]
    # At the peak (second iteration's backward): 4 parameters, 8 optimizer state, the 4
    # activations not yet freed, one gradient and one backward temporary.
    assert out["peak"]["allocated"] == out["memory"]["allocated_peak"] == 22 * MiB
    cats = {c["category"]: c for c in out["categories"]}
    assert {k: cats[k]["bytes"] // MiB for k in cats} == {
        "parameters": 4,
        "gradients": 1,
        "optimizer_state": 8,
        "activations": 8,
        "temporaries": 1,
        "other": 0,
        "unknown": 0,
    }
    assert all(c["inference"] and c["rule"] for c in out["categories"])
    assert out["alive_count"] == 18
    top = out["alive_at_peak"][0]
    assert top["size"] == 2 * MiB and top["category"] == "activations"
    assert any(f["name"] == "forward" for f in top["frames"])
    # What the allocator held at the end: one segment, parameters and optimizer state.
    seg = out["segments"]
    assert seg["count"] == 1 and seg["allocated"] == 12 * MiB
    assert seg["free"] == seg["reserved"] - 12 * MiB
    assert out["memory"]["allocated_after"] == 12 * MiB


def test_listed_and_filtered_beside_experiments(client: httpx.Client) -> None:
    from tests.helpers import submit

    exp = submit(client)
    snap = imported(client, dumps(training_snapshot(iterations=1)), name="one", tag=["mine"])
    everything = client.get("/v1/experiments").json()["items"]
    assert {e["id"] for e in everything} == {exp["id"], snap["id"]}
    only = client.get("/v1/experiments", params={"kind": "snapshot"}).json()["items"]
    assert [(e["id"], e["kind"], e["name"]) for e in only] == [(snap["id"], "snapshot", "one")]
    tagged = client.get("/v1/snapshots", params={"tag": "mine"}).json()["items"]
    assert [s["id"] for s in tagged] == [snap["id"]]
    assert client.get(f"/v1/snapshots/{exp['id']}").status_code == 404
    # A snapshot is finished: cancelling it is a conflict, not a 5xx.
    assert client.post(f"/v1/experiments/{snap['id']}/cancel").status_code == 409


def test_views_of_an_experiment_work_on_a_snapshot(client: httpx.Client) -> None:
    snap = training_snapshot(iterations=2, layers=2)
    sid = imported(client, dumps(snap), name="views")["id"]
    peak = client.get(f"/v1/snapshots/{sid}/peak").json()
    replayed = client.get(f"/v1/experiments/{sid}/peak").json()
    # The summary made at import and a replay of the stored trace agree.
    assert peak["peak"]["allocated"] == replayed["peak"]["allocated"]
    assert peak["alive_count"] == replayed["alive_count"]
    page = client.get(f"/v1/snapshots/{sid}/trace", params={"limit": 5}).json()
    assert page["total"] == len(snap["device_traces"][0])
    assert page["events"][0]["action"] == "segment_alloc"
    assert page["events"][1]["frames"][0]["name"] == "convert"
    lines = client.get(f"/v1/snapshots/{sid}/trace", params={"format": "ndjson"}).text
    assert len(lines.splitlines()) == page["total"]
    chrome = client.get(f"/v1/snapshots/{sid}/trace", params={"format": "chrome"})
    assert chrome.status_code == 200 and json.loads(chrome.text)["traceEvents"]
    html = client.get(f"/v1/snapshots/{sid}/timeline")
    assert html.status_code == 200 and "<svg" in html.text
    # Bands, as an experiment's timeline draws them, named by their inferred category.
    assert 'class="vl-band"' in html.text and "parameters (inferred)" in html.text
    assert "peak 12.0 MiB" in html.text
    svg = client.get(f"/v1/snapshots/{sid}/timeline", params={"format": "svg"})
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert client.get(f"/ui/experiments/{sid}").status_code == 200


def test_memory_viz_round_trip(client: httpx.Client) -> None:
    snap = training_snapshot(iterations=2, layers=2)
    sid = imported(client, dumps(snap), name="round trip")["id"]
    response = client.get(f"/v1/snapshots/{sid}/trace", params={"format": "memory_viz"})
    assert response.status_code == 200
    back = pickle.loads(response.content)
    assert back["segments"] == json.loads(json.dumps(snap["segments"]))
    (trace,) = back["device_traces"]
    original = snap["device_traces"][0]
    t0 = original[0]["time_us"]
    keys = ("action", "addr", "size", "stream", "frames")
    assert [{k: e[k] for k in keys} for e in trace] == [{k: e[k] for k in keys} for e in original]
    assert [e["time_us"] for e in trace] == [e["time_us"] - t0 for e in original]
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "<html>" in memory_viz.trace_plot(back).lower()
    memory_viz.segsum(back)


def test_compare_a_snapshot_with_an_experiment_and_another_snapshot(
    client: httpx.Client,
) -> None:
    from tests.helpers import claim, register, submit, succeed

    exp = submit(client)
    worker = register(client)
    claimed = claim(client, worker)
    assert claimed is not None
    memory = {"allocated_peak": 4 * MiB, "allocated_after": 0}
    assert succeed(client, claimed, memory={**MEMORY_ZERO, **memory}).status_code == 200
    small = imported(client, dumps(training_snapshot(layers=2)), name="small")["id"]
    big = imported(client, dumps(training_snapshot(layers=4)), name="big")["id"]
    out = client.get("/v1/compare", params={"ids": f"{small},{big},{exp['id']}"}).json()
    assert [i["id"] for i in out["items"]] == [small, big, exp["id"]]
    assert out["differences"]["allocated_peak"][1] == 10 * MiB
    # Two more layers: 2 MiB more parameters, 4 more optimizer state, 4 more activations
    # (the first of the two largest is named).
    assert out["categories"]["optimizer_state"] == [4 * MiB, 8 * MiB, None]
    assert out["summary"][0] == (
        f"big (snapshot {big[:8]}) peaks 10.0 MiB higher than small (snapshot {small[:8]}),"
        " 4.0 MiB of it optimizer state (inferred)"
    )
    assert "peaks" in out["summary"][1]
    page = client.get("/ui/compare", params={"ids": f"{small},{big}"})
    assert page.status_code == 200
    assert "optimizer state (inferred)" in page.text and "compare-categories" in page.text


MEMORY_ZERO = {
    k: 0
    for k in (
        "allocated_before",
        "allocated_after",
        "allocated_peak",
        "reserved_before",
        "reserved_after",
        "reserved_peak",
        "delta_allocated",
        "host_rss_before",
        "host_rss_after",
    )
}


def test_metrics_count_snapshots_apart_from_experiments(client: httpx.Client) -> None:
    imported(client, dumps(training_snapshot(iterations=1)), name="m")
    text = client.get("/metrics").text
    assert 'vramlab_experiments{status="succeeded"} 0.0' in text
    assert "vramlab_snapshots 1.0" in text


def test_a_multipart_upload_is_imported(client: httpx.Client) -> None:
    """What `curl -F file=@snap.pickle` sends works as the raw body does."""
    body = gzip.compress(dumps(training_snapshot(iterations=1)))
    response = client.post(
        "/v1/snapshots",
        params={"name": "form"},
        files={"file": ("snap.pickle.gz", body, "application/octet-stream")},
    )
    assert response.status_code == 201, response.text
    out = response.json()
    assert out["name"] == "form" and out["gzipped"] and out["entries"] > 0
    # A file under another name is still the one file of the form.
    other = client.post("/v1/snapshots", files={"snapshot": ("s.pickle", dumps({"x": 1}))})
    assert other.status_code == 422 and "not a memory snapshot" in other.text
    # A form without a file says how to send one.
    empty = client.post("/v1/snapshots", files={"name": (None, "x")})
    assert empty.status_code == 422
    message = empty.json()["error"]["message"]
    assert "no `file` field" in message and "-F file=@snap.pickle" in message


def test_the_docs_show_how_to_upload(client: httpx.Client) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/snapshots"]["post"]
    assert set(operation["requestBody"]["content"]) == {
        "application/octet-stream",
        "multipart/form-data",
    }
    assert "-F file=@snap.pickle" in operation["description"]
