"""Reading a PyTorch memory snapshot as data (the file itself: ``read``): its shape
checked, the device chosen, what was alive before its first entry, and the fields of its
entries read as the types they must be."""

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from vramlab.contract import MEMORY_VIZ_ACTIONS

MAX_FRAMES = 256
ACTIONS = frozenset(MEMORY_VIZ_ACTIONS)
FREE_ACTIONS = ("free_requested", "free_completed")
GROWS = ("segment_alloc", "segment_map")
SHRINKS = ("segment_free", "segment_unmap")


class Invalid(Exception):
    """The data is a pickle of plain values but not a memory snapshot."""


def block_size(n: int) -> int:
    """The caching allocator's block for a request of ``n`` bytes: rounded up to 512.

    Trace entries carry the size asked for; ``torch.cuda.memory_allocated`` counts blocks,
    so vramlab's figures count them too (a block the allocator did not split is larger
    still: ``app.snapshots.blocks`` tells it from the segments)."""
    return (n + 511) & ~511 if n > 0 else 0


def as_int(value: Any, what: str) -> int:
    if type(value) is int or type(value) is bool:
        return int(value)
    raise Invalid(f"{what} is {type(value).__name__}, not an integer")


def frame_json(frame: Any) -> str:
    if type(frame) is not dict:
        raise Invalid("a frame is not a dict")
    filename = frame.get("filename", "")
    name = frame.get("name", "")
    line = frame.get("line", 0)
    if type(filename) is not str or type(name) is not str or type(line) is not int:
        raise Invalid("a frame needs a string filename and name and an integer line")
    return json.dumps({"filename": filename, "line": line, "name": name}, ensure_ascii=False)


def frames_json(frames: Any) -> Iterator[str]:
    for frame in (frames or [])[:MAX_FRAMES]:
        yield frame_json(frame)


def num(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    raise Invalid("a number in a trace entry is not a finite number")


def check_entry(e: Any) -> str:
    if type(e) is not dict:
        raise Invalid("a trace entry is not a dict")
    action = e.get("action")
    if action not in ACTIONS:
        raise Invalid(f"unknown trace action {str(action)[:40]!r}")
    return str(action)


def pick_device(lengths: list[int], segments: list[Any], asked: int | None) -> int:
    """``lengths``: each device's trace entries."""
    if asked is not None:
        return asked
    if any(lengths):
        return max(range(len(lengths)), key=lambda i: lengths[i])
    counts: dict[int, int] = {}
    for s in segments:
        d = s.get("device", 0) if type(s) is dict else 0
        if type(d) is int:
            counts[d] = counts.get(d, 0) + 1
    return max(counts, key=lambda d: counts[d]) if counts else 0


def validate_top(data: Any) -> tuple[list[Any], list[Any]]:
    if type(data) is not dict:
        raise Invalid("a memory snapshot is a dict with 'segments' and 'device_traces'")
    traces = data.get("device_traces", [])
    segments = data.get("segments", [])
    if type(traces) is not list or any(type(t) is not list for t in traces):
        raise Invalid("'device_traces' must be a list of lists")
    if type(segments) is not list or any(type(s) is not dict for s in segments):
        raise Invalid("'segments' must be a list of dicts")
    if "device_traces" not in data and "segments" not in data:
        raise Invalid("a memory snapshot has 'segments' or 'device_traces'")
    return traces, segments


class Interns(Protocol):
    """What ``pre_trace`` needs of the entries' sink (``entries.Sink``): a stack's id."""

    def intern(self, frames: Any) -> int: ...


def pre_trace(
    trace: Iterable[tuple[Any, ...]], segments: list[dict[str, Any]], sink: Interns
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Segments and blocks that existed before the first entry: freed without an alloc in
    the trace, or alive at the end (in the segments) with none. A block's ``stack`` is its
    frames' stack id in ``sink``; ``token`` the identity of its frames list (None: a list
    of its own that no entry holds)."""
    known: dict[Any, int] = {}
    seg_known: dict[Any, int] = {}
    blocks: dict[Any, dict[str, Any]] = {}
    segs: dict[Any, dict[str, Any]] = {}
    for action, addr, size, _, _, _, _, _ in trace:
        if action == "alloc":
            known[addr] = 1
        elif action == "free_completed":
            if known.pop(addr, None) is None and addr not in blocks:
                size = block_size(as_int(size, "size"))
                blocks[addr] = {"addr": addr, "size": size, "stack": 0, "token": None}
        elif action in GROWS:
            seg_known[addr] = 1
        elif action in SHRINKS and seg_known.pop(addr, None) is None and addr not in segs:
            segs[addr] = {"addr": addr, "size": as_int(size, "size")}
    for s in segments:
        addr = s.get("address")
        if addr not in seg_known and addr not in segs and not s.get("is_expandable"):
            segs[addr] = {"addr": addr, "size": as_int(s.get("total_size", 0), "total_size")}
        for b in s.get("blocks") or ():
            if type(b) is not dict or not str(b.get("state", "")).startswith("active"):
                continue
            baddr = b.get("address")
            if baddr not in known and baddr not in blocks:
                frames = b.get("frames") or []
                own = type(frames) is list and bool(frames)
                blocks[baddr] = {
                    "addr": baddr,
                    "size": as_int(b.get("size", 0), "block size"),
                    "stack": sink.intern(frames) if own else 0,
                    "token": id(frames) if own else None,
                }
    return list(segs.values()), list(blocks.values())
