"""Turn a PyTorch memory snapshot file into vramlab's trace and a summary, in a child.

Run as ``python -m app.snapshots.parse SRC OUT [--max-expanded N] [--chunk-events N]
[--device N]`` by ``app.snapshots.service`` under memory and CPU limits, so a hostile or
huge input can only kill this process. It never imports torch and never resolves a
global (``safe_pickle``). It writes into OUT:

- ``result.json``: ``{"ok": true, "summary": {...}}`` or ``{"ok": false, "type", "message"}``
- ``chunk-NNNNN.ndjson.gz``: the chosen device's trace in vramlab's event schema, cut in
  chunks ready for the trace table;
- ``segments.json.gz``: that device's segments as PyTorch wrote them (for the round trip).

The file is read once (``read``): its trace streamed into compact records on disk
(``stream``, ``entries``), so the parser holds about the pickle's non-trace part, the
distinct stacks and a placeholder in the unpickler's memo for each object of an entry
it memoized (``memo``), never the trace as Python objects; a file the stream reader
does not read exactly as an unpickler would is unpickled whole as before (``--whole``
forces that, to compare). Then two passes over the records: the first (``replay``)
finds the peak and the largest blocks, after ``load`` has found what was alive before
the trace began (a ring buffer that filled up drops its oldest entries); the second
(``walk``) writes the events (``chunks``) and follows the blocks alive at the peak to
their end, which their categories need (``summary``, ``categories``).
"""

import argparse
import gc
import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Any

from app.core.contract import SnapshotFigures
from app.snapshots import recorded, safe_pickle
from app.snapshots.blocks import Blocks, max_split_size
from app.snapshots.chunks import ChunkWriter
from app.snapshots.entries import Sink, from_data
from app.snapshots.load import Invalid, pick_device, pre_trace, validate_top
from app.snapshots.phases import read as read_phases
from app.snapshots.read import load
from app.snapshots.replay import Replay
from app.snapshots.segments import summarise_segments
from app.snapshots.summary import block_out, categorise, counters, plain, plain_dict
from app.snapshots.walk import Walk


def convert(data: Any, out: Path, per_chunk: int, asked_device: int | None) -> dict[str, Any]:
    """The summary of ``data`` (a loaded snapshot); the trace's chunks and the segments are
    written into ``out``."""
    traces, _ = validate_top(data)
    return convert_records(data, from_data(traces, out), out, per_chunk, asked_device)


def convert_records(
    data: Any, sink: Sink, out: Path, per_chunk: int, asked_device: int | None
) -> dict[str, Any]:
    """The summary of a snapshot read into ``sink``'s records (``data``: its top dict)."""
    traces, all_segments = validate_top(data)
    for n in range(len(traces)):
        sink.trace(n)
    sink.close()
    lengths = [len(t) for t in sink.traces[: len(traces)]]
    index = pick_device(lengths, all_segments, asked_device)
    if index < 0 or (traces and index >= len(traces)) or (not traces and index != 0):
        raise Invalid(f"the snapshot has no device {index}")
    trace = sink.trace(index)
    sink.close()
    segments = [s for s in all_segments if s.get("device", index) == index]
    device = f"cuda:{index}"
    if trace.error is not None:
        raise trace.error
    pre_segs, pre_blocks = pre_trace(trace, segments, sink)
    baseline = sum(b["size"] for b in pre_blocks)
    reserved0 = sum(s["size"] for s in pre_segs)
    times = [trace.first_time, trace.last_time] if len(trace) else []
    timed = bool(len(trace)) and all(type(t) in (int, float) for t in times)
    t0 = float(times[0]) if timed else 0.0
    marks = recorded.read(data, t0 if timed else None)
    blocks = Blocks(max_split_size(data.get("allocator_settings")))
    for seg in pre_segs:
        blocks.segment(seg["addr"], seg["size"])
    for block in pre_blocks:
        blocks.alive(block["addr"])
    replay = Replay(baseline, reserved0, blocks)
    replay.run(trace, pre_blocks, t0 if timed else None)
    walk = Walk(device, ChunkWriter(out, per_chunk), sink)
    walk.pre_trace(pre_segs, pre_blocks)
    peak_at = replay.peak_index
    walk.run(trace, t0 if timed else None, peak_at, replay.sizes)
    phases = read_phases(data)
    bound = None if phases is None else phases.bind(index, len(walk.alloc_seqs))
    categories, top_alive = categorise(walk, marks, bound)
    offset = walk.offset
    largest = []
    for size, neg in sorted(replay.largest, reverse=True):
        addr, e_time, sid = replay.kept[-neg]
        e_t = float(e_time) - t0 if timed and type(e_time) in (int, float) else 0.0
        largest.append(
            block_out(
                offset - neg,
                addr,
                size,
                e_t if timed else float(-neg),
                sink.stacks[sid],
                "",
            )
        )
    peak_seq = offset + peak_at if peak_at >= 0 else None
    peak_t = 0.0
    if peak_at >= 0:
        pt = replay.peak_time
        peak_t = float(pt) - t0 if timed and type(pt) in (int, float) else float(peak_at)
    seg_summary = summarise_segments(segments)
    with gzip.open(out / "segments.json.gz", "wt", compresslevel=1) as f:
        json.dump(segments, f, default=plain)
    stats = counters(data.get("memory_stats"), index)
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
        "devices": [{"index": n, "entries": length} for n, length in enumerate(lengths)],
        "entries": len(trace),
        "events": walk.seq,
        "chunks": walk.writer.chunks,
        "time_recorded": timed,
        "duration_us": walk.t_us if timed else None,
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
        "alive_count": len(walk.alive),
        "largest": largest,
        "categories": categories,
        "categories_recorded": None if marks is None else marks.summary(),
        "phases_recorded": None if phases is None else phases.summary(bound is not None),
        "segments": seg_summary,
        "timeline": {
            "t_us": [p[0] for p in replay.points],
            "allocated": [p[1] for p in replay.points],
            "reserved": [p[2] for p in replay.points],
        },
        "ooms": walk.ooms,
        "oom_count": walk.n_ooms,
        "counters": stats,
        "environment": plain_dict(environment),
        "allocator_settings": plain_dict(settings),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-expanded", type=int, default=2**31)
    parser.add_argument("--chunk-events", type=int, default=50_000)
    parser.add_argument("--device", type=int, default=None)
    parser.add_argument("--delete-src", action="store_true", help="once it is decompressed")
    parser.add_argument(
        "--whole", action="store_true", help="unpickle the file whole (no stream reader)"
    )
    args = parser.parse_args(argv)
    result: dict[str, Any]
    try:
        loaded = load(args.src, args.out, args.max_expanded, args.delete_src, args.whole)
        try:
            summary = convert_records(
                loaded.data, loaded.sink, args.out, args.chunk_events, args.device
            )
        finally:
            loaded.sink.close()
            loaded.sink.remove()
        result = {"ok": True, "summary": {**summary, "pickle_bytes": loaded.size}}
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
    # What the parser makes holds no cycles but what a pickle may build, and lives only
    # as long as this child: the cyclic collector would only walk, again and again, all
    # that is alive (the unpickler's memo, slot by slot), a fifth of the CPU and more as
    # the file grows.
    gc.disable()
    sys.exit(main())
