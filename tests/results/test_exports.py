"""Trace exports: PyTorch's snapshot pickle (checked with torch's own viewer code), Chrome
trace-event JSON, and the peak report; over HTTP against SQLite and PostgreSQL."""

import gzip
import io
import json
import pickle
import pickletools
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.snapshots import safe_pickle
from tests.helpers import ADD, MATMUL
from tests.results.trace_data import (
    OP_FRAMES,
    SEG,
    SETUP_FRAMES,
    A,
    B,
    C,
    D,
    events,
    many_events,
    upload,
    varied_chunks,
)

# What the memory_viz export gave for ``varied_chunks()`` before it wrote entries as
# fixed records (commit 8fcdccf, one pickle.dumps per thousand entries).
BEFORE = Path(__file__).with_name("memory_viz_before.pickle.gz")


def _viz(client: httpx.Client, exp_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert "attachment" in response.headers["content-disposition"]
    data: dict[str, Any] = pickle.loads(response.content)
    return data


def test_memory_viz_is_a_snapshot_torch_reads(client: httpx.Client) -> None:
    exp_id = upload(client, {**MATMUL, "device": "cuda:1"}, [events("cuda:1")])
    snap = _viz(client, exp_id)
    assert set(snap) >= {"segments", "device_traces"}
    # cuda:1's trace sits in slot 1, as torch.cuda.memory._snapshot() lays devices out.
    assert len(snap["device_traces"]) == 2 and snap["device_traces"][0] == []
    trace = snap["device_traces"][1]
    assert [e["action"] for e in trace] == [
        "segment_alloc",
        "alloc",
        "alloc",
        "alloc",
        "free_requested",
        "free_completed",
        "alloc",
        "free_requested",
        "free_completed",
    ]
    for entry in trace:
        assert set(entry) >= {"action", "addr", "size", "stream", "time_us", "frames"}
    assert trace[1]["frames"] == SETUP_FRAMES and trace[1]["addr"] == A
    # What the allocator held at the end: c and d alive in the one segment, gaps inactive.
    (segment,) = snap["segments"]
    assert segment["address"] == SEG and segment["total_size"] == 2**21
    assert segment["device"] == 1
    active = [
        (b["address"], b["size"]) for b in segment["blocks"] if b["state"] == "active_allocated"
    ]
    assert active == [(C, 8192), (D, 1024)]
    assert sum(b["size"] for b in segment["blocks"]) == 2**21

    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    for plot in (memory_viz.trace_plot, memory_viz.segment_plot):
        page = plot(snap)
        assert isinstance(page, str) and "<html>" in page.lower()
    # segsum checks that the segments' blocks add up; trace() reads every entry's keys.
    assert "total_allocated: 9.0KiB" in memory_viz.segsum(snap)
    printed = memory_viz.trace(snap)
    assert "cudaMalloc" in printed and "free completed" in printed


def test_memory_viz_means_what_it_meant_before(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, varied_chunks())
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
    assert response.status_code == 200
    # Plain data only: no class or function is resolved while loading either side.
    got = safe_pickle.load(io.BytesIO(response.content))
    want = safe_pickle.load(io.BytesIO(gzip.decompress(BEFORE.read_bytes())))
    assert got["segments"] == want["segments"]
    assert len(got["device_traces"][0]) == len(want["device_traces"][0]) == 2665
    for i, (g, w) in enumerate(zip(got["device_traces"][0], want["device_traces"][0], strict=True)):
        assert g == w and list(g) == list(w), i
        assert all(type(g[k]) is type(w[k]) for k in w), i
    assert got == want


# The opcodes that the unpickler of PyTorch's web viewer (MemoryViz.js) reads.
VIEWER_OPCODES = {
    *("PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET"),
    *("LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST"),
    *("APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE"),
    *("NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT"),
    *("BINUNICODE", "SHORT_BINUNICODE"),
}


def test_memory_viz_uses_only_opcodes_the_web_viewer_reads(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, varied_chunks())
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
    used = {op.name for op, _, _ in pickletools.genops(response.content)}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES


def test_memory_viz_of_a_cpu_trace_streams_in_batches(client: httpx.Client) -> None:
    rows = many_events(1500)  # 2999 events, over two chunks and several pickle batches
    exp_id = upload(client, ADD, [rows[:2000], rows[2000:]])
    snap = _viz(client, exp_id)
    (trace,) = snap["device_traces"]  # a CPU trace goes in slot 0
    # A CPU free has no free_requested of its own: the export adds one before each.
    assert sum(e["action"] == "alloc" for e in trace) == 1500
    assert sum(e["action"] == "free_requested" for e in trace) == 1499
    assert sum(e["action"] == "free_completed" for e in trace) == 1499
    # The last allocation is alive at the end: a segment of its own.
    assert [(s["address"], s["total_size"]) for s in snap["segments"]] == [(1000 + 1499, 1599)]
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "total_allocated: 1.6KiB" in memory_viz.segsum(snap)


def test_chrome_trace_has_counters_slices_and_phases(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, [events()])
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "chrome"})
    assert response.status_code == 200
    doc = json.loads(response.content)
    trace = doc["traceEvents"]
    counters = [e for e in trace if e["ph"] == "C"]
    assert max(e["args"]["allocated"] for e in counters) == 16384
    assert counters[0]["args"] == {"allocated": 0, "reserved": 2**21}
    begins = [e for e in trace if e["ph"] == "b"]
    ends = [e for e in trace if e["ph"] == "e"]
    assert len(begins) == 4 and len(ends) == 2
    assert {e["id"] for e in ends} <= {e["id"] for e in begins}
    phases = [(e["name"], e["ts"], e["dur"]) for e in trace if e["ph"] == "X"]
    assert phases == [("setup", 0, 4), ("op", 4, 3), ("after", 7, 2.5)]


def test_ndjson_streams_every_event(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, [events()[:5], events()[5:]])
    with client.stream("GET", f"/v1/experiments/{exp_id}/trace?format=ndjson") as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [e["seq"] for e in lines] == list(range(12))


def test_peak_names_what_was_alive(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, [events()], memory={"allocated_peak": 16384})
    peak = client.get(f"/v1/experiments/{exp_id}/peak").json()
    assert peak["events"] == 12
    assert peak["peak"] == {
        "seq": 5,
        "t_us": 5.0,
        "phase": "op",
        "allocated": 16384,
        "reserved": 2**21,
    }
    alive = [(b["addr"], b["size"], b["phase"]) for b in peak["alive_at_peak"]]
    assert alive == [(C, 8192, "op"), (A, 4096, "setup"), (B, 4096, "setup")]
    assert peak["alive_at_peak"][0]["frames"] == OP_FRAMES
    assert [b["size"] for b in peak["largest"]] == [8192, 4096, 4096, 1024]
    assert peak["measured_allocated_peak"] == 16384
    top1 = client.get(f"/v1/experiments/{exp_id}/peak", params={"top": 1}).json()
    assert len(top1["alive_at_peak"]) == 1 and top1["alive_count"] == 3


def test_exports_of_an_unknown_experiment_are_404(client: httpx.Client) -> None:
    for path in ("trace?format=memory_viz", "peak", "timeline?format=svg"):
        response = client.get(f"/v1/experiments/nope/{path}")
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
