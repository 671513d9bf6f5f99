"""Trace streams read the stored chunks as they are: NDJSON byte for byte, memory_viz
segments placed by address over long traces, over HTTP on SQLite and PostgreSQL."""

import json
import pickle
from typing import Any

import httpx

from tests.helpers import ADD, MATMUL
from tests.results.trace_data import events, many_events, upload


def _stored(chunks: list[list[dict[str, Any]]]) -> bytes:
    # What the worker uploaded (tests/results/trace_data.gz): json.dumps with its spaces.
    return b"".join(json.dumps(e).encode() + b"\n" for chunk in chunks for e in chunk)


def test_ndjson_streams_the_stored_lines_unchanged(client: httpx.Client) -> None:
    chunks = [events()[:5], events()[5:]]
    exp_id = upload(client, MATMUL, chunks)
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "ndjson"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.content == _stored(chunks)


def test_filtered_ndjson_keeps_the_matching_lines(client: httpx.Client) -> None:
    chunks = [events()[:5], events()[5:]]
    exp_id = upload(client, MATMUL, chunks)
    response = client.get(
        f"/v1/experiments/{exp_id}/trace",
        params={"format": "ndjson", "action": ["alloc", "free"], "min_size": 4096},
    )
    rows = [e for chunk in chunks for e in chunk]
    wanted = [e for e in rows if e["action"] in ("alloc", "free") and e["size"] >= 4096]
    assert [e["seq"] for e in wanted] == [2, 3, 5, 7, 11]
    assert response.content == _stored([wanted])


def test_filtered_streams_read_values_only_python_json_reads(client: httpx.Client) -> None:
    """A stored event may hold NaN (the upload's check reads JSON as Python does): the
    filtered NDJSON and the Chrome trace read it as before."""
    rows = events()
    rows[3] = {**rows[3], "t_us": float("nan"), "note": float("inf")}
    exp_id = upload(client, MATMUL, [rows])
    response = client.get(
        f"/v1/experiments/{exp_id}/trace", params={"format": "ndjson", "min_size": 1}
    )
    assert response.status_code == 200
    assert json.dumps(rows[3]).encode() + b"\n" in response.content
    chrome = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "chrome"})
    assert chrome.status_code == 200 and b"NaN" in chrome.content


def test_memory_viz_places_live_blocks_in_their_segments(client: httpx.Client) -> None:
    # Many segments, each with a live block at its start and one freed: every segment
    # must hold exactly its own block, and a block outside all segments gets its own.
    rows: list[dict[str, Any]] = []
    n_segments = 300
    for i in range(n_segments):
        base = 2**32 + i * 2**21
        rows.append({"t_us": i, "action": "segment_alloc", "addr": base, "size": 2**21})
        rows.append({"t_us": i, "action": "alloc", "addr": base, "size": 512 * (i + 1)})
        rows.append({"t_us": i, "action": "alloc", "addr": base + 2**20, "size": 4096})
        rows.append({"t_us": i, "action": "free", "addr": base + 2**20, "size": 4096})
    rows.append({"t_us": 1e6, "action": "alloc", "addr": 2**40, "size": 1000})
    for seq, row in enumerate(rows):
        row.update(seq=seq, device="cuda:0", stream=0, phase="op")
    exp_id = upload(client, ADD, [rows[:700], rows[700:]])
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
    snap = pickle.loads(response.content)
    segments = snap["segments"]
    assert len(segments) == n_segments + 1
    for i, segment in enumerate(segments[:n_segments]):
        active = [b for b in segment["blocks"] if b["state"] == "active_allocated"]
        assert [(b["address"], b["size"]) for b in active] == [(2**32 + i * 2**21, 512 * (i + 1))]
        assert sum(b["size"] for b in segment["blocks"]) == 2**21
    assert (segments[-1]["address"], segments[-1]["total_size"]) == (2**40, 1000)
    (trace,) = snap["device_traces"]
    assert [e["action"] for e in trace].count("free_requested") == n_segments


def test_chrome_streams_a_long_trace_in_order(client: httpx.Client) -> None:
    rows = many_events(3000)
    exp_id = upload(client, ADD, [rows[:2500], rows[2500:4000], rows[4000:]])
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "chrome"})
    trace = json.loads(response.content)["traceEvents"]
    counters = [e["args"]["allocated"] for e in trace if e["ph"] == "C"]
    # Alloc i then free i - 1: allocated climbs to two blocks alive and ends with one.
    assert len(counters) == len(rows)
    assert counters[-1] == 100 + 2999
    assert max(counters) == (100 + 2998) + (100 + 2999)
    begins = {e["id"] for e in trace if e["ph"] == "b"}
    ends = {e["id"] for e in trace if e["ph"] == "e"}
    assert len(begins) == 3000 and len(ends) == 2999 and ends <= begins
