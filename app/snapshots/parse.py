"""Turn a PyTorch memory snapshot file into vramlab's trace and a summary, in a child.

Run as ``python -m app.snapshots.parse SRC OUT [--max-expanded N] [--chunk-events N]
[--device N]`` by ``app.services.snapshots`` under memory and CPU limits, so a hostile or
huge input can only kill this process. It never imports torch and never resolves a
global (``safe_pickle``). It writes into OUT:

- ``result.json``: ``{"ok": true, "summary": {...}}`` or ``{"ok": false, "type", "message"}``
- ``chunk-NNNNN.ndjson.gz``: the chosen device's trace in vramlab's event schema, cut in
  chunks ready for the trace table;
- ``segments.json.gz``: that device's segments as PyTorch wrote them (for the round trip).

Two passes over the entries in memory: the first finds the peak, the largest blocks and
what was alive before the trace began (a ring buffer that filled up drops its oldest
entries); the second writes the events and follows the blocks alive at the peak to
their end, which their categories need.
"""

import argparse
import gzip
import heapq
import json
import math
import queue
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vramlab.contract import MEMORY_VIZ_ACTIONS, Figure, SnapshotFigures

from app.snapshots import categories as cat
from app.snapshots import safe_pickle
from app.snapshots.evidence import Timeline
from app.snapshots.segments import summarise_segments

MAX_FRAMES = 256
TOP = 20
MAX_OOMS = 50
MAX_REASONS = 10
ACTIONS = frozenset(MEMORY_VIZ_ACTIONS)
# PyTorch names the completion of a free "free_completed"; vramlab's schema says "free".
RENAME = {"free_completed": "free"}
FREE_ACTIONS = ("free_requested", "free_completed")
GROWS = ("segment_alloc", "segment_map")
# Entries that change neither allocated nor reserved bytes.
SILENT = frozenset({"free_requested", "snapshot", "oom"})
TIMELINE_POINTS = 2000
SHRINKS = ("segment_free", "segment_unmap")


Live = tuple[int, int, int, Any, float, tuple[int, ...]]


class Invalid(Exception):
    """The data is a pickle of plain values but not a memory snapshot."""


def block_size(n: int) -> int:
    """The caching allocator's block for a request of ``n`` bytes: rounded up to 512.

    Trace entries carry the size asked for; ``torch.cuda.memory_allocated`` counts blocks,
    so vramlab's figures count them too (a block the allocator did not split can be larger
    still; the trace cannot show that)."""
    return (n + 511) & ~511 if n > 0 else 0


def _int(value: Any, what: str) -> int:
    if type(value) is int or type(value) is bool:
        return int(value)
    raise Invalid(f"{what} is {type(value).__name__}, not an integer")


def _frame_json(frame: Any) -> str:
    if type(frame) is not dict:
        raise Invalid("a frame is not a dict")
    filename = frame.get("filename", "")
    name = frame.get("name", "")
    line = frame.get("line", 0)
    if type(filename) is not str or type(name) is not str or type(line) is not int:
        raise Invalid("a frame needs a string filename and name and an integer line")
    return json.dumps({"filename": filename, "line": line, "name": name}, ensure_ascii=False)


class Stacks:
    """Frames to JSON and to a site, computed once per distinct stack."""

    def __init__(self) -> None:
        self._frame: dict[int, str] = {}
        self._json: dict[tuple[int, ...], str] = {}
        self._site: dict[tuple[int, ...], int] = {}
        self._zero: dict[tuple[int, ...], bool] = {}

    def key(self, frames: Any) -> tuple[int, ...]:
        if not frames:
            return ()
        if type(frames) is not list and type(frames) is not tuple:
            raise Invalid("frames is not a list")
        return tuple(map(id, frames))

    def json(self, key: tuple[int, ...], frames: Any) -> str:
        text = self._json.get(key)
        if text is None:
            parts = []
            for frame in frames[:MAX_FRAMES]:
                part = self._frame.get(id(frame))
                if part is None:
                    part = self._frame[id(frame)] = _frame_json(frame)
                parts.append(part)
            text = self._json[key] = "[" + ",".join(parts) + "]"
        return text

    def site(self, key: tuple[int, ...], frames: Any) -> int:
        where = self._site.get(key)
        if where is None:
            where = self._site[key] = cat.site(frames)
        return where

    def zero_grad(self, key: tuple[int, ...], frames: Any) -> bool:
        found = self._zero.get(key)
        if found is None:
            found = self._zero[key] = cat.has_zero_grad(frames)
        return found


def _check_entry(e: Any) -> str:
    if type(e) is not dict:
        raise Invalid("a trace entry is not a dict")
    action = e.get("action")
    if action not in ACTIONS:
        raise Invalid(f"unknown trace action {str(action)[:40]!r}")
    return str(action)


def _pick_device(traces: list[Any], segments: list[Any], asked: int | None) -> int:
    if asked is not None:
        return asked
    if any(traces):
        return max(range(len(traces)), key=lambda i: len(traces[i]))
    counts: dict[int, int] = {}
    for s in segments:
        d = s.get("device", 0) if type(s) is dict else 0
        if type(d) is int:
            counts[d] = counts.get(d, 0) + 1
    return max(counts, key=lambda d: counts[d]) if counts else 0


def _validate_top(data: Any) -> tuple[list[Any], list[Any]]:
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


def _pre_trace(
    trace: list[Any], segments: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Segments and blocks that existed before the first entry: freed without an alloc in
    the trace, or alive at the end (in the segments) with none."""
    known: dict[Any, int] = {}
    seg_known: dict[Any, int] = {}
    blocks: dict[Any, dict[str, Any]] = {}
    segs: dict[Any, dict[str, Any]] = {}
    for e in trace:
        action = e["action"]
        addr = e.get("addr")
        if action == "alloc":
            known[addr] = 1
        elif action == "free_completed":
            if known.pop(addr, None) is None and addr not in blocks:
                size = block_size(_int(e.get("size", 0), "size"))
                blocks[addr] = {"addr": addr, "size": size, "frames": []}
        elif action in GROWS:
            seg_known[addr] = 1
        elif action in SHRINKS and seg_known.pop(addr, None) is None and addr not in segs:
            segs[addr] = {"addr": addr, "size": _int(e.get("size", 0), "size")}
    for s in segments:
        addr = s.get("address")
        if addr not in seg_known and addr not in segs and not s.get("is_expandable"):
            segs[addr] = {"addr": addr, "size": _int(s.get("total_size", 0), "total_size")}
        for b in s.get("blocks") or ():
            if type(b) is not dict or not str(b.get("state", "")).startswith("active"):
                continue
            baddr = b.get("address")
            if baddr not in known and baddr not in blocks:
                frames = b.get("frames") or []
                blocks[baddr] = {
                    "addr": baddr,
                    "size": _int(b.get("size", 0), "block size"),
                    "frames": frames if type(frames) is list else [],
                }
    return list(segs.values()), list(blocks.values())


class Replay:
    """Pass one: allocated and reserved after each entry, the peak, the largest blocks."""

    def __init__(self, baseline: int, reserved: int) -> None:
        self.allocated = baseline
        self.reserved = reserved
        self.peak = baseline
        self.peak_index = -1
        self.peak_reserved = reserved
        self.reserved_peak = reserved
        self.live: dict[Any, int] = {}
        self.largest: list[tuple[int, int]] = []  # min-heap of (size, -index)
        self.points: list[tuple[float, int, int]] = []  # (t, allocated, reserved)

    def run(self, trace: list[Any], pre_blocks: list[dict[str, Any]], t0: float | None) -> None:
        """Replay; with ``t0`` (the first entry's time_us) times are microseconds from it,
        else entry numbers. Keeps about ``TIMELINE_POINTS`` points for the timeline:
        each bucket's lowest and highest moment, so peaks and dips survive."""
        live = self.live
        for b in pre_blocks:
            live[b["addr"]] = b["size"]
        per = max(1, -(-len(trace) // (TIMELINE_POINTS // 2)))
        points = self.points
        points.append((0.0, self.allocated, self.reserved))
        lo: tuple[float, int, int] | None = None
        hi: tuple[float, int, int] | None = None
        n = 0
        t = 0.0
        for i, e in enumerate(trace):
            action = e["action"]
            if action in SILENT:
                continue
            if t0 is None:
                t = float(i)
            elif type(e.get("time_us")) in (int, float):
                t = e["time_us"] - t0
            self._apply(i, e, action)
            point = (t, self.allocated, self.reserved)
            if lo is None or point[1] < lo[1]:
                lo = point
            if hi is None or point[1] > hi[1]:
                hi = point
            n += 1
            if n >= per:
                points.extend(sorted({lo, hi}, key=lambda p: p[0]))
                lo = hi = None
                n = 0
        if lo is not None and hi is not None:
            points.extend(sorted({lo, hi}, key=lambda p: p[0]))

    def _apply(self, i: int, e: dict[str, Any], action: str) -> None:
        live = self.live
        if action == "alloc":
            size = block_size(_int(e.get("size", 0), "size"))
            live[e.get("addr")] = size
            self.allocated += size
            if self.allocated > self.peak:
                self.peak = self.allocated
                self.peak_index = i
                self.peak_reserved = self.reserved
            item = (size, -i)
            if len(self.largest) < TOP:
                heapq.heappush(self.largest, item)
            elif item > self.largest[0]:
                heapq.heapreplace(self.largest, item)
        elif action == "free_completed":
            freed = live.pop(e.get("addr"), None)
            if freed is not None:
                self.allocated -= freed
        elif action in GROWS:
            self.reserved += _int(e.get("size", 0), "size")
            self.reserved_peak = max(self.reserved_peak, self.reserved)
        elif action in SHRINKS:
            self.reserved = max(0, self.reserved - _int(e.get("size", 0), "size"))


class ChunkWriter:
    """gzip NDJSON chunks of ``per_chunk`` events, compressed as they are written.

    Lines go to a compressing thread in batches (zlib lets go of the GIL), through a
    short queue: the text of a whole chunk is never held at once.
    """

    BATCH = 2000

    def __init__(self, out: Path, per_chunk: int) -> None:
        self.out = out
        self.per_chunk = per_chunk
        self.chunks: list[dict[str, int]] = []
        self._lines: list[str] = []
        self._in_chunk = 0
        self._first = 0
        self._queue: queue.Queue[tuple[int, bytes | None]] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._compress, daemon=True)
        self._thread.start()

    def _compress(self) -> None:
        comp: Any = None
        f: Any = None
        try:
            while True:
                n, data = self._queue.get()
                if n < 0:
                    return
                if comp is None:
                    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
                    f = (self.out / f"chunk-{n:05d}.ndjson.gz").open("wb")
                if data is None:  # the chunk's end
                    f.write(comp.flush())
                    f.close()
                    comp = f = None
                else:
                    f.write(comp.compress(data))
        except BaseException as exc:  # reported by close()
            self._error = exc
            while self._queue.get()[0] >= 0:
                pass

    def add(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= self.BATCH:
            self._send()

    def _send(self) -> None:
        if self._lines:
            n = len(self.chunks)
            self._queue.put((n, ("\n".join(self._lines) + "\n").encode()))
            self._in_chunk += len(self._lines)
            self._lines = []
        if self._in_chunk >= self.per_chunk:
            self._end_chunk()

    def _end_chunk(self) -> None:
        if not self._in_chunk:
            return
        n = len(self.chunks)
        self._queue.put((n, None))
        self.chunks.append({"seq": n, "first_event": self._first, "n_events": self._in_chunk})
        self._first += self._in_chunk
        self._in_chunk = 0

    def flush(self) -> None:
        """Write what is left and wait for the compressing thread."""
        self._send()
        self._end_chunk()
        self._queue.put((-1, None))
        self._thread.join()
        if self._error is not None:
            raise self._error


def _num(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    raise Invalid("a number in a trace entry is not a finite number")


def _block_out(
    seq: int, addr: Any, size: int, t_us: float, frames: Any, category: str, reason: str = ""
) -> dict[str, Any]:
    return {
        "addr": addr,
        "size": size,
        "seq": seq,
        "t_us": t_us,
        "phase": None,
        "frames": [json.loads(f) for f in _frames_json(frames)],
        "category": category,
        "reason": reason,
    }


def _frames_json(frames: Any) -> Iterator[str]:
    for frame in (frames or [])[:MAX_FRAMES]:
        yield _frame_json(frame)


def convert(data: Any, out: Path, per_chunk: int, asked_device: int | None) -> dict[str, Any]:
    traces, all_segments = _validate_top(data)
    index = _pick_device(traces, all_segments, asked_device)
    if index < 0 or (traces and index >= len(traces)) or (not traces and index != 0):
        raise Invalid(f"the snapshot has no device {index}")
    trace: list[Any] = traces[index] if traces else []
    segments = [s for s in all_segments if s.get("device", index) == index]
    device = f"cuda:{index}"
    for e in trace:
        _check_entry(e)
    pre_segs, pre_blocks = _pre_trace(trace, segments)
    baseline = sum(b["size"] for b in pre_blocks)
    reserved0 = sum(s["size"] for s in pre_segs)
    times = [e.get("time_us") for e in (trace[0], trace[-1])] if trace else []
    timed = bool(trace) and all(type(t) in (int, float) for t in times)
    t0 = float(times[0]) if timed else 0.0
    replay = Replay(baseline, reserved0)
    replay.run(trace, pre_blocks, t0 if timed else None)
    stacks = Stacks()
    writer = ChunkWriter(out, per_chunk)
    seq = 0
    for s in pre_segs:
        writer.add(
            f'{{"seq":{seq},"t_us":0.0,"action":"segment_alloc","addr":{_num(s["addr"])},'
            f'"size":{s["size"]},"device":"{device}","stream":null,"phase":null,'
            f'"pre_trace":true}}'
        )
        seq += 1
    # addr -> size, seq, site, frames, t_us, stack key
    live: dict[Any, Live] = {}
    for b in pre_blocks:
        key = stacks.key(b["frames"])
        writer.add(
            f'{{"seq":{seq},"t_us":0.0,"action":"alloc","addr":{_num(b["addr"])},'
            f'"size":{b["size"]},"device":"{device}","stream":null,"phase":null,'
            f'"pre_trace":true,"frames":{stacks.json(key, b["frames"])}}}'
        )
        live[b["addr"]] = (b["size"], seq, stacks.site(key, b["frames"]), b["frames"], 0.0, key)
        seq += 1
    offset = seq
    peak_at = replay.peak_index
    alive: dict[Any, Live] = dict(live) if peak_at < 0 else {}
    fates: dict[int, cat.Fate] = {}  # seq of a block alive at the peak -> how it ended
    timeline = Timeline()
    workspace_at = (-2, "")  # the latest workspace-sized allocation: seq, its stack
    after_workspace: set[int] = set()  # allocations right after one, by the same stack
    prev = ""
    zero_grad_addrs: set[Any] = set()
    ooms: list[dict[str, Any]] = []
    n_ooms = 0
    t_us = 0.0
    for i, e in enumerate(trace):
        action = e["action"]
        addr = e.get("addr")
        size = _int(e.get("size", 0), "size")
        frames = e.get("frames") or ()
        if action in FREE_ACTIONS:
            held = live.get(addr)
            if held is not None and held[3] is frames:
                key = ()  # the very list its allocation had (context="alloc")
                own = False
            else:
                key = stacks.key(frames)
                own = bool(key) and (held is None or held[5] != key)
        else:
            key = stacks.key(frames)
            own = bool(key)
        if timed:
            t = e.get("time_us")
            t_us = float(t) - t0 if type(t) in (int, float) else t_us
        else:
            t_us = float(i)
        stream = e.get("stream")
        line = (
            f'{{"seq":{seq},"t_us":{t_us!r},"action":"{RENAME.get(action, action)}",'
            f'"addr":{_num(addr)},"size":{size},"device":"{device}","stream":{_num(stream)},'
            f'"phase":null'
        )
        if action == "oom":
            free = e.get("device_free")
            line += f',"device_free":{_num(free if type(free) is int else None)}'
            n_ooms += 1
            if len(ooms) < MAX_OOMS:
                ooms.append(
                    {
                        "seq": seq,
                        "t_us": t_us,
                        "requested": size,
                        "device_free": free if type(free) is int else None,
                        "frames": [json.loads(f) for f in _frames_json(frames)],
                    }
                )
        # A free whose frames are its block's (PyTorch's context="alloc") stores none:
        # readers take them from the allocation, which keeps the stored trace a third
        # of the size. A free recorded with its own call site (context="all") keeps it.
        if own:
            line += ',"frames":' + stacks.json(key, frames)
        writer.add(line + "}")
        if action == "alloc":
            where = stacks.site(key, frames)
            timeline.see(seq, where, where == cat.OPTIMIZER and stacks.zero_grad(key, frames), True)
            if size in cat.WORKSPACE_SIZES:
                workspace_at = (seq, stacks.json(key, frames) if key else "")
            elif workspace_at[0] == seq - 1 - (prev == "segment_alloc") and workspace_at[1] == (
                stacks.json(key, frames) if key else ""
            ):
                after_workspace.add(seq)  # the same stack: the same op
            live[addr] = (block_size(size), seq, timeline.where(where), frames, t_us, key)
        elif own and action in FREE_ACTIONS:
            timeline.see(seq, stacks.site(key, frames), stacks.zero_grad(key, frames), False)
        if action == "free_requested":
            if key and stacks.zero_grad(key, frames):
                zero_grad_addrs.add(addr)
        elif action == "free_completed":
            block = live.pop(addr, None)
            zero = addr in zero_grad_addrs or (bool(key) and stacks.zero_grad(key, frames))
            zero_grad_addrs.discard(addr)
            if block is not None and block[1] in alive_seqs(alive, addr, block):
                fates[block[1]] = cat.Fate(seq, zero, timeline.now())
        if i == peak_at:
            alive = dict(live)
        prev = action
        seq += 1
    writer.flush()

    by_category: dict[str, list[int]] = {c: [0, 0] for c in cat.CATEGORIES}
    by_reason: dict[tuple[str, str], list[int]] = {}
    blocks_out: list[tuple[int, int, Any, float, Any, str, str]] = []
    at_end = cat.Fate(None, False, timeline.now())
    for baddr, (size, bseq, where, frames, bt, _) in alive.items():
        fate = fates.get(bseq, at_end)
        name, reason = cat.decide(where, bseq, size, bseq < offset, fate, bseq in after_workspace)
        by_category[name][0] += size
        by_category[name][1] += 1
        counts = by_reason.setdefault((name, reason), [0, 0])
        counts[0] += size
        counts[1] += 1
        blocks_out.append((size, bseq, baddr, bt, frames, name, reason))
    blocks_out.sort(key=lambda b: (-b[0], b[1]))
    top_alive = [_block_out(q, a, s, t, f, c, r) for s, q, a, t, f, c, r in blocks_out[:TOP]]
    largest = []
    for size, neg in sorted(replay.largest, reverse=True):
        e = trace[-neg]
        e_t = float(e["time_us"]) - t0 if timed and type(e.get("time_us")) in (int, float) else 0.0
        largest.append(
            _block_out(
                offset - neg,
                e.get("addr"),
                size,
                e_t if timed else float(-neg),
                e.get("frames"),
                "",
            )
        )
    peak_seq = offset + peak_at if peak_at >= 0 else None
    peak_t = 0.0
    if peak_at >= 0:
        pt = trace[peak_at].get("time_us")
        peak_t = float(pt) - t0 if timed and type(pt) in (int, float) else float(peak_at)
    seg_summary = summarise_segments(segments)
    with gzip.open(out / "segments.json.gz", "wt", compresslevel=1) as f:
        json.dump(segments, f, default=_plain)
    stats = _counters(data.get("memory_stats"), index)
    environment = data.get("environment")
    memory = SnapshotFigures(
        allocated_before=baseline,
        allocated_after=replay.allocated,
        allocated_peak=replay.peak,
        reserved_before=reserved0,
        reserved_after=replay.reserved if trace else seg_summary["reserved"],
        reserved_peak=replay.reserved_peak if trace else seg_summary["reserved"],
        delta_allocated=replay.allocated - baseline,
    ).model_dump()
    settings = data.get("allocator_settings")
    return {
        "device": device,
        "devices": [{"index": n, "entries": len(t)} for n, t in enumerate(traces)],
        "entries": len(trace),
        "events": seq,
        "chunks": writer.chunks,
        "time_recorded": timed,
        "duration_us": t_us if timed else None,
        "pre_trace": {"blocks": len(pre_blocks), "bytes": baseline, "segments": len(pre_segs)},
        "memory": memory,
        "peak": {
            "seq": peak_seq,
            "t_us": peak_t,
            "phase": None,
            "allocated": replay.peak,
            "reserved": replay.peak_reserved,
        },
        "alive_at_peak": top_alive,
        "alive_count": len(alive),
        "largest": largest,
        "categories": [
            {
                "category": c,
                "bytes": by_category[c][0],
                "blocks": by_category[c][1],
                "rule": cat.RULES[c],
                "inference": True,
                "reasons": _reasons(by_reason, c),
            }
            for c in cat.CATEGORIES
        ],
        "segments": seg_summary,
        "timeline": {
            "t_us": [p[0] for p in replay.points],
            "allocated": [p[1] for p in replay.points],
            "reserved": [p[2] for p in replay.points],
        },
        "ooms": ooms,
        "oom_count": n_ooms,
        "counters": stats,
        "environment": _plain_dict(environment),
        "allocator_settings": _plain_dict(settings),
    }


def _reasons(by_reason: dict[tuple[str, str], list[int]], category: str) -> list[dict[str, Any]]:
    """The evidence that put blocks in ``category``, most bytes first."""
    rows: list[dict[str, Any]] = [
        {"reason": reason, "bytes": n[0], "blocks": n[1]}
        for (c, reason), n in by_reason.items()
        if c == category
    ]
    rows.sort(key=lambda r: (-r["bytes"], r["reason"]))
    return rows[:MAX_REASONS]


def alive_seqs(alive: dict[Any, Live], addr: Any, block: Live) -> tuple[int, ...]:
    """The seq of the block alive at the peak at ``addr``, if it is this block."""
    held = alive.get(addr)
    return (held[1],) if held is not None and held[1] == block[1] else ()


def _counters(stats: Any, index: int) -> dict[str, int] | None:
    """PyTorch's own counters, where the recorder saved ``torch.cuda.memory_stats()``."""
    if type(stats) is list:
        stats = stats[index] if index < len(stats) else None
    if type(stats) is not dict:
        return None
    names = {
        "allocated_bytes.all.peak": Figure.ALLOCATED_PEAK.value,
        "allocated_bytes.all.current": "allocated_current",
        "reserved_bytes.all.peak": Figure.RESERVED_PEAK.value,
        "reserved_bytes.all.current": "reserved_current",
        "num_ooms": "num_ooms",
        "num_alloc_retries": "num_alloc_retries",
    }
    return {ours: stats[theirs] for theirs, ours in names.items() if type(stats.get(theirs)) is int}


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def _plain_dict(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        return {}
    text = json.dumps(value, default=_plain)
    if len(text) > 64_000:
        return {"note": "too large to keep"}
    out: dict[str, Any] = json.loads(text)
    return out


def _load(src: Path, out: Path, max_expanded: int, delete_src: bool) -> tuple[Any, int]:
    with src.open("rb") as f:
        magic = f.read(2)
    if magic == safe_pickle.GZIP_MAGIC:
        raw = out / "snapshot.pickle"
        with src.open("rb") as f, raw.open("wb") as dst:
            safe_pickle.gunzip_to(f, dst, max_expanded)
        if delete_src:  # the API's temp file: free its disk space early
            src.unlink(missing_ok=True)
        src = raw
    with src.open("rb") as f:
        return safe_pickle.load(f), src.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-expanded", type=int, default=2**31)
    parser.add_argument("--chunk-events", type=int, default=50_000)
    parser.add_argument("--device", type=int, default=None)
    parser.add_argument("--delete-src", action="store_true", help="once it is decompressed")
    args = parser.parse_args(argv)
    result: dict[str, Any]
    try:
        data, size = _load(args.src, args.out, args.max_expanded, args.delete_src)
        summary = convert(data, args.out, args.chunk_events, args.device)
        result = {"ok": True, "summary": {**summary, "pickle_bytes": size}}
    except safe_pickle.Refused as exc:
        result = {"ok": False, "type": "refused", "message": str(exc)}
    except safe_pickle.TooLarge as exc:
        result = {"ok": False, "type": "too_large", "message": str(exc)}
    except Invalid as exc:
        result = {"ok": False, "type": "invalid", "message": f"not a memory snapshot: {exc}"}
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        result = {"ok": False, "type": "invalid", "message": f"truncated or bad data: {exc}"}
    except MemoryError:
        result = {"ok": False, "type": "too_large", "message": "parsing needs more memory"}
    except RecursionError:
        result = {"ok": False, "type": "invalid", "message": "the data nests too deeply"}
    except Exception as exc:  # any other failure of the unpickler is a bad input
        result = {"ok": False, "type": "invalid", "message": f"not a pickle we can read: {exc}"}
    (args.out / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
