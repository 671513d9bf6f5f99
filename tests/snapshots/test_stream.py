"""The parser streams a snapshot's trace (``app.snapshots.stream``) and stores exactly what
reading the file whole stored: the same summary, trace chunks and segments, on varied
snapshots (the real H100 ones, PyTorch's pickle protocols, a ``context="alloc"``
recording whose frees share their block's frames list, several devices, values that are
not plain integers); and what it refuses, it refuses as before."""

import copy
import gc
import gzip
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.snapshots import memo, parse, read
from app.snapshots.entries import Sink
from tests.snapshots import loops
from tests.snapshots.synthetic import training_snapshot
from tests.snapshots.test_real import CASES, DATA
from tests.snapshots.test_refused import RunsACommand


def _context_alloc() -> dict[str, Any]:
    """Frees that hold their allocation's very frames list, as PyTorch's
    context="alloc" records them, across batches of the pickle's APPENDS."""
    snap = training_snapshot(iterations=40, layers=4, stack_depth=8)
    held: dict[int, Any] = {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            held[e["addr"]] = e["frames"]
        elif e["addr"] in held:
            e["frames"] = held[e["addr"]]
    return snap


def _devices() -> dict[str, Any]:
    snap = training_snapshot(iterations=2, layers=2)
    trace = snap["device_traces"][0]
    return {**snap, "device_traces": [[], copy.deepcopy(trace[:7]), [], trace]}


def _odd() -> dict[str, Any]:
    snap = training_snapshot(iterations=1, layers=2)
    trace = snap["device_traces"][0]
    trace[3]["time_us"] = float(trace[3]["time_us"])
    trace[4]["addr"] = 2**70
    trace[5]["stream"] = None
    del trace[6]["size"]
    trace[7]["frames"] = None
    return snap


def _segments_last() -> dict[str, Any]:
    snap = training_snapshot(iterations=2, layers=2)
    return {"device_traces": snap["device_traces"], "segments": snap["segments"]}


def _entries(n: int) -> dict[str, Any]:
    snap = training_snapshot(iterations=40, layers=2)
    snap["device_traces"][0] = snap["device_traces"][0][:n]
    return snap


SNAPSHOTS: dict[str, Callable[[], Any]] = {
    "training": lambda: training_snapshot(iterations=20, layers=4, stack_depth=60),
    "adam": lambda: loops.adam_loop(steps=3)[0],
    "context alloc": lambda: loops.adam_loop(context="alloc", accumulate=2)[0],
    "checkpoint": lambda: loops.adam_loop(checkpoint=True)[0],
    "oom in backward": lambda: loops.oom_in_backward()[0],
    "frees share their block's list": _context_alloc,
    "several devices": _devices,
    "odd values": _odd,
    "segments after the trace": _segments_last,
    "1001 entries (a batch of one)": lambda: _entries(1001),
    "no entries": lambda: {"segments": [], "device_traces": [[]]},
    "no trace": lambda: {"segments": training_snapshot()["segments"]},
}


def _parse(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    """What the parser child leaves: its verdict, the trace's chunks, the segments."""
    out.mkdir()
    assert parse.main([str(src), str(out), *extra]) == 0
    stored: dict[str, Any] = {"result": json.loads((out / "result.json").read_text())}
    for path in sorted(out.glob("*.gz")):
        stored[path.name] = gzip.decompress(path.read_bytes())
    assert not list(out.glob("*.records"))
    return stored


def _same_both_ways(tmp_path: Path, body: bytes, streams: bool | None = True) -> dict[str, Any]:
    """Parsed both ways, the same; ``streams``: whether the stream reader read it (None:
    the file is refused either way)."""
    src = tmp_path / "snapshot.pickle"
    src.write_bytes(body)
    streamed = _parse(src, tmp_path / "streamed")
    whole = _parse(src, tmp_path / "whole", "--whole")
    assert streamed == whole
    if streams is not None:
        check = tmp_path / "check"
        check.mkdir()
        assert read.load(src, check, 2**31, False).streamed is streams
    result: dict[str, Any] = streamed["result"]
    return result


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_streamed_and_whole_file_reads_store_the_same(
    tmp_path: Path, name: str, protocol: int
) -> None:
    snap = SNAPSHOTS[name]()
    result = _same_both_ways(
        tmp_path, pickle.dumps(snap, protocol=protocol), streams="device_traces" in snap
    )
    assert result["ok"], result


@pytest.mark.skipif(not CASES, reason="run bench/make_snapshots.py on a GPU host")
@pytest.mark.parametrize("case", ["train_all", "train_python", "oom", "ring"])
def test_the_real_h100_snapshots_stream_to_the_same(tmp_path: Path, case: str) -> None:
    body = gzip.decompress((DATA / f"{case}.pickle.gz").read_bytes())
    result = _same_both_ways(tmp_path, body)
    assert result["ok"] and result["summary"]["entries"] == CASES[case]["entries"]


def test_an_entry_referred_to_again_is_read_whole(tmp_path: Path) -> None:
    """The stream reader lets go of an entry once written; a pickle that refers back to
    one (the same dict twice in a trace, far apart) is read whole, to the same result."""
    snap = training_snapshot(iterations=1, layers=1)
    trace = snap["device_traces"][0]
    snap["device_traces"][0] = trace + [trace[1]] * 1500
    result = _same_both_ways(tmp_path, pickle.dumps(snap, protocol=4), streams=False)
    assert result["ok"] and result["summary"]["entries"] == len(trace) + 1500


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_reduce_deep_in_the_trace_is_refused_and_does_not_run(
    tmp_path: Path, protocol: int
) -> None:
    marker = tmp_path / "pwned"
    snap = training_snapshot(iterations=40, layers=2)
    snap["device_traces"][0].append(RunsACommand(f"touch {marker}"))
    result = _same_both_ways(tmp_path, pickle.dumps(snap, protocol=protocol), streams=None)
    assert result["type"] == "refused" and "system" in result["message"]
    assert not marker.exists()


def test_a_truncated_snapshot_is_refused(tmp_path: Path) -> None:
    body = pickle.dumps(training_snapshot(iterations=40, layers=2), protocol=4)
    result = _same_both_ways(tmp_path, body[: len(body) * 2 // 3], streams=None)
    assert result["type"] == "invalid" and "truncated" in result["message"]


def test_nesting_where_frames_should_be_is_refused(tmp_path: Path) -> None:
    snap = training_snapshot(iterations=1, layers=1)
    snap["device_traces"][0][2]["frames"] = "HERE"
    depth = 200_000
    body = pickle.dumps(snap, protocol=2).replace(
        b"X\x04\x00\x00\x00HERE", b"]" * depth + b"a" * (depth - 1)
    )
    result = _same_both_ways(tmp_path, body)
    assert result["type"] == "invalid" and "a frame is not a dict" in result["message"]


@pytest.mark.parametrize("pattern", [b"e]", b"a]"])
def test_bytes_like_a_device_list_beginning_read_the_same(tmp_path: Path, pattern: bytes) -> None:
    """The unpickler gets the file a buffer at a time, but the bytes where a device's list
    may begin (a list's APPENDS or APPEND, then EMPTY_LIST) one read at a time, so that
    it is stopped exactly there. Here every entry has those bytes (the memo index of the
    key 'frames' is that of 'e' or 'a', and a frames list follows it), over several
    devices: streamed, the same as read whole."""
    snap = _devices()
    snap["device_traces"][3] = training_snapshot(iterations=30, layers=2)["device_traces"][0]

    def body(pad: int) -> bytes:
        return pickle.dumps({"pad": [f"s{i}" for i in range(pad)], **snap}, protocol=4)

    dense = body(max(range(300), key=lambda pad: body(pad).count(pattern)))
    assert dense.count(pattern) > sum(len(t) for t in snap["device_traces"])
    result = _same_both_ways(tmp_path, dense)
    assert result["ok"] and result["summary"]["entries"] == len(snap["device_traces"][3])


def _segments_after_sharing() -> dict[str, Any]:
    """Segments after the trace whose blocks hold lists and dicts of the trace's
    entries: the pickle refers back to them past the trace."""
    snap = _context_alloc()
    trace = snap["device_traces"][0]
    block = snap["segments"][0]["blocks"][0]
    block["frames"] = trace[5]["frames"]
    block["extra"] = trace[7]
    return {"device_traces": snap["device_traces"], "segments": snap["segments"]}


def _long(make: Callable[[], dict[str, Any]], times: int) -> Callable[[], dict[str, Any]]:
    """``make``'s snapshot with its longest trace ``times`` over (deep copies, so a
    pickle of it writes its entries anew), in several batches of the pickle's APPENDS."""

    def made() -> dict[str, Any]:
        snap = make()
        traces = snap["device_traces"]
        longest = max(range(len(traces)), key=lambda i: len(traces[i]))
        traces[longest] = [e for _ in range(times) for e in copy.deepcopy(traces[longest])]
        return snap

    return made


LET_GO = {
    "training": _long(lambda: training_snapshot(iterations=40, layers=4, stack_depth=8), 6),
    "context alloc": _long(lambda: loops.adam_loop(context="alloc", accumulate=2)[0], 60),
    "frees share their block's list": _long(_context_alloc, 6),
    "several devices": _long(_devices, 200),
    "odd values": _long(_odd, 300),
}


@pytest.mark.parametrize("name", sorted(LET_GO))
@pytest.mark.parametrize("protocol", [2, 4])
def test_what_the_memo_lets_go_of_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, protocol: int
) -> None:
    """The memo let go of every 50 entries (its slots put again with placeholders):
    the same as read whole, where later entries refer back to lists let go of too."""
    monkeypatch.setattr(memo, "EVERY", 50)
    result = _same_both_ways(tmp_path, pickle.dumps(LET_GO[name](), protocol=protocol))
    assert result["ok"], result


def test_what_refers_to_an_object_let_go_of_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memo, "EVERY", 50)
    body = pickle.dumps(_segments_after_sharing(), protocol=4)
    result = _same_both_ways(tmp_path, body, streams=False)
    assert result["ok"], result


def test_the_memo_keeps_no_entry_of_a_memoized_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's pickle memoizes each entry's dict, frames list and strings; the stream
    reader lets go of them every ``memo.EVERY`` entries, so the objects alive while it
    reads do not grow with the trace (counted at each batch, by the garbage collector's
    count of containers: dicts and lists)."""
    monkeypatch.setattr(memo, "EVERY", 2000)
    snap = training_snapshot(iterations=600, layers=4, stack_depth=8)
    entries = len(snap["device_traces"][0])
    assert entries > 20_000
    src = tmp_path / "snapshot.pickle"
    src.write_bytes(pickle.dumps(snap, protocol=4))
    del snap
    counts: list[int] = []
    batch = Sink.batch

    def counted(self: Sink, device: int, items: list[Any], outside: Any) -> None:
        batch(self, device, items, outside)
        counts.append(len(gc.get_objects()))

    monkeypatch.setattr(Sink, "batch", counted)
    loaded = read.load(src, tmp_path, 2**31, False)
    loaded.sink.remove()
    assert loaded.streamed and len(counts) > 20
    # Kept, each entry's dict and frames list (and its StackRef): 3 containers an entry
    # would be 3000 more each batch; let go of, they come and go (up to ``EVERY``
    # entries and the few batches before the reader can stop between two).
    assert max(counts[2:]) - min(counts[2:]) < 3 * (2000 + 4 * 1000) < 3 * entries // 3
