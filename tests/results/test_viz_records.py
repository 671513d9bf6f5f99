"""Which blocks of stored lines the memory_viz export writes as records, and which it
leaves to the general path (that both give the same snapshot is test_exports')."""

import json
import pickle
import random
from typing import Any

import pytest

from app.traces import memory_viz, viz_records
from tests.results.trace_data import events, many_events


def _plain() -> list[dict[str, Any]]:
    """The small CUDA trace without its frames."""
    return [{k: v for k, v in e.items() if k != "frames"} for e in events()]


def _block(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in rows)


def test_plain_cuda_and_cpu_traces_take_the_records_path() -> None:
    for rows in (_plain(), many_events(50)):
        columns = viz_records.decode(_block(rows))
        assert columns is not None and len(columns.code) == len(rows)


@pytest.mark.parametrize(
    "change",
    [
        {"frames": [{"filename": "x.py", "line": 1, "name": "f"}]},
        {"pre_trace": True},
        {"size": 4096.0},
        {"stream": "0"},
        {"action": "mystery"},
        {"action": "free", "addr": None},
        {"addr": 2**64},
        {"t_us": 2.0**60},
    ],
)
def test_other_blocks_go_the_general_way(change: dict[str, Any]) -> None:
    rows = _plain()
    assert viz_records.decode(_block(rows)) is not None
    rows[5] = {**rows[5], **change}
    assert viz_records.decode(_block(rows)) is None


def _churn(n: int) -> list[dict[str, Any]]:
    """Allocations and frees over a small pool of addresses, so an address lives, dies and
    lives again within a block of lines and across blocks; some frees come without their
    request (as a CPU trace's), a few segments come and go."""
    rnd = random.Random(0)
    live: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    for t in range(n):
        addr = 4096 * rnd.randrange(300)
        if rnd.random() < 0.05:
            action, size = rnd.choice(["segment_alloc", "segment_free"]), 2**21
        elif addr in live:
            size = live.pop(addr)
            if rnd.random() < 0.5:
                rows.append({"t_us": t, "action": "free_requested", "addr": addr, "size": size})
            action = "free_completed"
        else:
            action, size = "alloc", live.setdefault(addr, rnd.choice([512, 4096, 2**20]))
        rows.append({"t_us": t, "action": action, "addr": addr, "size": size, "stream": 0})
    return rows


def test_records_and_general_blocks_in_turn_give_the_general_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The live blocks pass between the records path's columns and the general path's
    dict: a block of lines in the middle that only the general path takes (a float
    size) leaves the snapshot what the general path alone makes of the whole trace."""
    rows = _churn(6000)
    rows[3001] = {**rows[3001], "size": float(rows[3001]["size"])}
    blocks = [_block(rows[i : i + 250]) for i in range(0, len(rows), 250)]
    assert sum(viz_records.decode(b) is None for b in blocks) == 1
    mixed = pickle.loads(b"".join(memory_viz.export(blocks, "cuda:0")))
    monkeypatch.setattr(viz_records, "decode", lambda block: None)
    general = pickle.loads(b"".join(memory_viz.export(blocks, "cuda:0")))
    assert mixed == general
    assert mixed["segments"] and mixed["device_traces"][0]


def test_segments_without_live_blocks_are_one_inactive_block() -> None:
    """Recorded segments left empty at the end are written column by column: they read
    as the segment with one inactive block, beside one that holds a live block."""
    a, b, c = 2**30, 2**30 + 2**22, 2**30 + 2**23
    rows = [
        {"t_us": 1, "action": "segment_alloc", "addr": a, "size": 2**21, "stream": 0},
        {"t_us": 2, "action": "segment_alloc", "addr": b, "size": 2**21, "stream": 7},
        {"t_us": 3, "action": "segment_alloc", "addr": c, "size": 4096, "stream": 0},
        {"t_us": 4, "action": "alloc", "addr": b, "size": 512, "stream": 7},
        {"t_us": 5, "action": "alloc", "addr": a, "size": 512, "stream": 0},
        {"t_us": 6, "action": "free_completed", "addr": a, "size": 512, "stream": 0},
    ]
    snap = pickle.loads(b"".join(memory_viz.export([_block(rows)], "cuda:0")))

    def empty(addr: int, size: int, stream: int, kind: str) -> dict[str, Any]:
        inactive = {"address": addr, "size": size, "requested_size": 0}
        return {
            **{"device": 0, "address": addr, "total_size": size, "allocated_size": 0},
            **{"active_size": 0, "requested_size": 0, "stream": stream, "segment_type": kind},
            **{"segment_pool_id": (0, 0), "is_expandable": False, "frames": []},
            "blocks": [{**inactive, "state": "inactive", "frames": []}],
        }

    assert [s["address"] for s in snap["segments"]] == [a, b, c]
    assert snap["segments"][0] == empty(a, 2**21, 0, "large")
    assert snap["segments"][2] == empty(c, 4096, 0, "small")
    assert snap["segments"][1]["allocated_size"] == 512
    assert snap["segments"][1]["blocks"][0]["state"] == "active_allocated"


def test_nulls_read_as_the_general_path_reads_them() -> None:
    """A null address (on an allocation), size, stream or time takes the records path:
    no address is marked, the others read 0."""
    rows = _plain()
    rows[1] = {**rows[1], "action": "alloc", "addr": None, "size": None}
    rows[2] = {**rows[2], "stream": None, "t_us": None}
    columns = viz_records.decode(_block(rows))
    assert columns is not None
    assert columns.no_addr.tolist() == [row.get("addr") is None for row in rows]
    assert columns.no_addr[1]
    assert (columns.addr[1], columns.size[1], columns.stream[2], columns.time[2]) == (0, 0, 0, 0)
