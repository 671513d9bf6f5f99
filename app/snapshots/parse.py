"""Turn a PyTorch memory snapshot file into vramlab's trace and a summary, in a child.

Run as ``python -m app.snapshots.parse SRC OUT [--max-expanded N] [--chunk-events N]
[--device N]`` by ``app.snapshots.service`` under memory and CPU limits, so a hostile or
huge input can only kill this process. It never imports torch and never resolves a
global (``safe_pickle``). It writes into OUT:

- ``result.json``: ``{"ok": true, "summary": {...}}`` or ``{"ok": false, "type", "message"}``
- ``chunk-NNNNN.ndjson.gz``: the chosen device's trace in vramlab's event schema, cut in
  chunks ready for the trace table;
- ``segments.json.gz``: that device's segments as PyTorch wrote them (for the round trip).

Its pieces: ``entries`` (each value read as data), ``entry_replay`` (the first pass),
``chunks`` (the trace written in chunks), ``categories`` (what held the peak).

Two passes over the entries in memory: the first finds the peak, the largest blocks and
what was alive before the trace began (a ring buffer that filled up drops its oldest
entries); the second writes the events and follows the blocks alive at the peak to
their end, which their categories need.
"""

import argparse
import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Any

from vramlab.contract import Figure, SnapshotFigures

from app.snapshots import categories as cat
from app.snapshots import safe_pickle
from app.snapshots.chunks import ChunkWriter, block_out, frames_json, num_text
from app.snapshots.entries import (
    FREE_ACTIONS,
    RENAME,
    Invalid,
    Live,
    Stacks,
    as_int,
    block_size,
    check_entry,
    pick_device,
    pre_trace,
    validate_top,
)
from app.snapshots.entry_replay import TOP, Replay
from app.snapshots.segments import summarise_segments

MAX_OOMS = 50


def convert(data: Any, out: Path, per_chunk: int, asked_device: int | None) -> dict[str, Any]:
    traces, all_segments = validate_top(data)
    index = pick_device(traces, all_segments, asked_device)
    if index < 0 or (traces and index >= len(traces)) or (not traces and index != 0):
        raise Invalid(f"the snapshot has no device {index}")
    trace: list[Any] = traces[index] if traces else []
    segments = [s for s in all_segments if s.get("device", index) == index]
    device = f"cuda:{index}"
    for e in trace:
        check_entry(e)
    pre_segs, pre_blocks = pre_trace(trace, segments)
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
            f'{{"seq":{seq},"t_us":0.0,"action":"segment_alloc","addr":{num_text(s["addr"])},'
            f'"size":{s["size"]},"device":"{device}","stream":null,"phase":null,'
            f'"pre_trace":true}}'
        )
        seq += 1
    # addr -> size, seq, site, frames, t_us, stack key
    live: dict[Any, Live] = {}
    for b in pre_blocks:
        key = stacks.key(b["frames"])
        writer.add(
            f'{{"seq":{seq},"t_us":0.0,"action":"alloc","addr":{num_text(b["addr"])},'
            f'"size":{b["size"]},"device":"{device}","stream":null,"phase":null,'
            f'"pre_trace":true,"frames":{stacks.json(key, b["frames"])}}}'
        )
        live[b["addr"]] = (b["size"], seq, stacks.site(key, b["frames"]), b["frames"], 0.0, key)
        seq += 1
    offset = seq
    peak_at = replay.peak_index
    alive: dict[Any, Live] = dict(live) if peak_at < 0 else {}
    fates: dict[int, tuple[int, bool, int, int, int]] = {}  # seq -> free seq, zero_grad, lasts
    last = [-1, -1, -1]  # latest backward, forward, optimizer allocation (seq)
    zero_grad_addrs: set[Any] = set()
    ooms: list[dict[str, Any]] = []
    n_ooms = 0
    t_us = 0.0
    for i, e in enumerate(trace):
        action = e["action"]
        addr = e.get("addr")
        size = as_int(e.get("size", 0), "size")
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
            f'"addr":{num_text(addr)},"size":{size},"device":"{device}","stream":{num_text(stream)},'
            f'"phase":null'
        )
        if action == "oom":
            free = e.get("device_free")
            line += f',"device_free":{num_text(free if type(free) is int else None)}'
            n_ooms += 1
            if len(ooms) < MAX_OOMS:
                ooms.append(
                    {
                        "seq": seq,
                        "t_us": t_us,
                        "requested": size,
                        "device_free": free if type(free) is int else None,
                        "frames": [json.loads(f) for f in frames_json(frames)],
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
            if where == cat.BACKWARD:
                last[0] = seq
            elif where == cat.FORWARD:
                last[1] = seq
            elif where == cat.OPTIMIZER:
                last[2] = seq
            live[addr] = (block_size(size), seq, where, frames, t_us, key)
        elif action == "free_requested":
            if key and stacks.zero_grad(key, frames):
                zero_grad_addrs.add(addr)
        elif action == "free_completed":
            block = live.pop(addr, None)
            zero = addr in zero_grad_addrs or (bool(key) and stacks.zero_grad(key, frames))
            zero_grad_addrs.discard(addr)
            if block is not None and block[1] in alive_seqs(alive, addr, block):
                fates[block[1]] = (seq, zero, last[0], last[1], last[2])
        if i == peak_at:
            alive = dict(live)
        seq += 1
    writer.flush()

    by_category: dict[str, list[int]] = {c: [0, 0] for c in cat.CATEGORIES}
    blocks_out: list[tuple[int, int, Any, float, Any, str]] = []
    for baddr, (size, bseq, where, frames, bt, _) in alive.items():
        fate = fates.get(bseq)
        name = cat.category(
            where,
            bseq,
            fate[0] if fate else None,
            fate[1] if fate else False,
            fate[2] if fate else last[0],
            fate[3] if fate else last[1],
            fate[4] if fate else last[2],
        )
        by_category[name][0] += size
        by_category[name][1] += 1
        blocks_out.append((size, bseq, baddr, bt, frames, name))
    blocks_out.sort(key=lambda b: (-b[0], b[1]))
    top_alive = [block_out(q, a, s, t, f, c) for s, q, a, t, f, c in blocks_out[:TOP]]
    largest = []
    for size, neg in sorted(replay.largest, reverse=True):
        e = trace[-neg]
        e_t = float(e["time_us"]) - t0 if timed and type(e.get("time_us")) in (int, float) else 0.0
        largest.append(
            block_out(
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
