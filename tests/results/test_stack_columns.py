"""A chunk recorded with stacks keeps its columns, a table of its distinct stacks and a
stack an event when it is uploaded; the memory_viz export writes its entries' frames from
them and gives the very bytes its text gives (the text is what chunks stored before, or
not taken, are read from). The export is loaded here with the standard pickle."""

import pickle
import random
from typing import Any

import httpx
import pytest

from tests.helpers import MATMUL
from tests.results.test_event_columns import _export, _forget_columns, _stored
from tests.results.trace_data import churn, upload

Frames = list[dict[str, Any]]


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def _deep(n: int, rnd: random.Random) -> Frames:
    files = [f"/site-packages/torch/nn/modules/m{i}.py" for i in range(6)]
    names = ["forward", "_call_impl", "linear", "train_step"]
    return [_frame(rnd.choice(files), rnd.randint(1, 2000), rnd.choice(names)) for _ in range(n)]


def _odd_stacks(rnd: random.Random) -> list[Frames]:
    """Stacks of every shape the pickler writes differently."""
    return [
        _deep(8, rnd),
        _deep(24, rnd),
        [_frame("train.py", 7, "main")],  # one frame: APPEND, not APPENDS
        [_frame("/home/jö/模型/файл.py", 1, "naïve_λ"), _frame("🔥.py", 2, "<lambda>")],
        [_frame("", 0, ""), _frame("x", 1, "y"), _frame("é", 255, "€")],  # shared strings
        [_frame('a\\b"c.py', 256, "\t"), _frame("\x00", 65535, "\n")],
        [_frame("m.py", 65536, "n" * 70_000), _frame("m.py", -1, "neg")],
        [
            _frame("big.py", 2**31, "a"),
            _frame("big.py", -(2**40), "b"),
            _frame("big.py", -(2**39), "c"),  # LONG1 one byte shorter than the bits say
            _frame("z", 2**63 - 1, ""),
        ],
        _deep(1001, rnd),  # the frames list in two batches
        _deep(2000, rnd),
    ]


def _with_stacks(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """``rows`` (plain events) with frames: an allocation's from the stacks above or none,
    a free's its block's, null or empty, or none (then it takes its block's, which sends
    its block to the general path: only near the start of each 3,000 events)."""
    rnd = random.Random(seed)
    stacks = _odd_stacks(rnd)
    light, heavy = stacks[:6] + stacks[7:8], stacks[6:7] + stacks[8:]
    of: dict[Any, Frames] = {}
    out = [dict(row) for row in rows]
    for i, event in enumerate(out):
        action, addr = event["action"], event.get("addr")
        if action in ("alloc", "segment_alloc", "oom"):
            r = rnd.random()
            if r < 0.9:
                stack = rnd.choice(heavy if rnd.random() < 0.01 else light)
                of[addr] = event["frames"] = stack
            else:
                of.pop(addr, None)
                if r < 0.95:
                    event.pop("frames", None)
                else:
                    event["frames"] = rnd.choice([None, []])
        elif action in ("free_requested", "free_completed", "free"):
            if addr in of and (i % 3000 >= 300 or rnd.random() < 0.5):
                event["frames"] = of[addr]
            elif addr in of:  # near the start of each 3,000 events only: takes its block's
                if rnd.random() < 0.5:
                    event.pop("frames", None)
                else:
                    event["frames"] = rnd.choice([None, []])
            else:
                event["frames"] = rnd.choice([None, []])
            if action != "free_requested":
                of.pop(addr, None)
    return out


def _deep_batch(n: int) -> list[dict[str, Any]]:
    """A thousand entries of 24 frames in one batch: its memo passes 65,535 slots."""
    rnd = random.Random(9)
    stack = _deep(24, rnd)
    rows = []
    for i in range(n):
        addr = 0x7F0000000000 + 512 * i
        rows.append({"t_us": i, "action": "alloc", "addr": addr, "size": 512, "frames": stack})
    for i, row in enumerate(rows):
        row.update(seq=i, device="cuda:0", stream=0, phase="op")
    return rows


def _cpu_frees(n: int) -> list[dict[str, Any]]:
    """Frees with no request before them (the export adds one, sharing the free's frames),
    some frees without frames, taking their block's."""
    rows: list[dict[str, Any]] = []
    stack = [_frame("cpu.py", 3, "step"), _frame("cpu.py", 9, "main")]
    for i in range(n):
        rows.append(
            {"t_us": 2.0 * i, "action": "alloc", "addr": 1000 + i, "size": 8, "frames": stack}
        )
        if i:
            free = {"t_us": 2.0 * i + 1, "action": "free", "addr": 999 + i, "size": 8}
            if i % 3:
                free["frames"] = stack
            rows.append(free)
    for seq, row in enumerate(rows):
        row.update(seq=seq, device="cpu", stream=None, phase="op")
    return rows


def _odd_chunk(rows: list[dict[str, Any]], odd: Frames) -> list[dict[str, Any]]:
    """A frame the table does not take: the text is read."""
    rows = [dict(r) for r in rows]
    rows[len(rows) // 2]["frames"] = odd
    return rows


def _stacked_chunks() -> list[list[dict[str, Any]]]:
    plain = churn(9000, seed=5)
    stacked = _with_stacks(plain, seed=5)
    return [
        churn(1500, seed=6),
        stacked[:3000],
        # keys in another order; a lone surrogate (json reads it, msgspec does not)
        _odd_chunk(stacked[3000:5000], [{"line": 1, "filename": "f.py", "name": "g"}]),
        _odd_chunk(stacked[5000:6000], [_frame("a\ud800b.py", 1, "\udfff")]),
        stacked[6000:],
    ]


TRACES = {
    # plain, with stacks, one not taken, with stacks again (several blocks of text each)
    "odd stacks": (_stacked_chunks, [1, 1, 0, 0, 1]),
    "memo past 65535": (lambda: [_deep_batch(2500)], [1]),
    "cpu frees": (lambda: [_cpu_frees(1500)], [1]),
}


@pytest.mark.parametrize("name", TRACES)
def test_the_stacks_give_the_bytes_the_text_gives(
    client: httpx.Client, database_url: str, name: str
) -> None:
    chunks, with_columns = TRACES[name]
    exp_id = upload(client, MATMUL, chunks())
    assert [c is not None for c in _stored(database_url, exp_id)] == [bool(w) for w in with_columns]
    from_stacks = _export(client, exp_id)
    _forget_columns(database_url, exp_id)
    from_text = _export(client, exp_id)
    assert len(from_stacks) == len(from_text)
    assert from_stacks == from_text
    entries = pickle.loads(from_stacks)["device_traces"][0]
    assert any(len(e["frames"]) > 1000 for e in entries) == (name == "odd stacks")


def test_the_export_keeps_each_event_s_frames(client: httpx.Client) -> None:
    rows = _with_stacks(churn(3000, seed=7), seed=7)
    exp_id = upload(client, MATMUL, [rows])
    entries = pickle.loads(_export(client, exp_id))["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert [e["frames"] for e in allocs] == [
        r.get("frames") or [] for r in rows if r["action"] == "alloc"
    ]
    assert any(f["filename"] == "/home/jö/模型/файл.py" for e in allocs for f in e["frames"])


def test_a_chunk_of_stacks_each_its_own_is_read_from_its_text(
    client: httpx.Client, database_url: str
) -> None:
    """Past 8 MiB of distinct stacks a chunk keeps no columns (the export would hold its
    table whole): it is read from its text, a block at a time."""
    rows = _deep_batch(4500)
    for i, row in enumerate(rows):
        row["frames"] = [_frame("unique.py", i, f"{i:06d}" + "x" * 2000)]
    exp_id = upload(client, MATMUL, [rows[:100], rows])
    assert [c is not None for c in _stored(database_url, exp_id)] == [True, False]
    entries = pickle.loads(_export(client, exp_id))["device_traces"][0]
    assert entries[-1]["frames"][0]["line"] == 4499
