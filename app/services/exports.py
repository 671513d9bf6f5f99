"""Trace exports for other tools, written as streams of bytes.

- ``memory_viz``: a pickle in PyTorch's snapshot format (``torch.cuda.memory._snapshot()``),
  which https://pytorch.org/memory_viz and ``torch.cuda._memory_viz`` open. Built
  without torch: the pickle opcodes for the outer dict and lists are written by hand
  and each event is pickled alone, so a million-event trace streams in batches instead
  of being held whole. The final ``segments`` (what the allocator held at the end, which
  the viewer rewinds from) come from replaying the trace as it streams.
- ``chrome``: trace-event JSON (Perfetto, chrome://tracing): counter events for
  allocated and reserved bytes, an async slice per allocation from alloc to free, a
  slice per phase.
"""

import json
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from app.services.replay import FREES, Block, Replay

Event = dict[str, Any]

# Pickle opcodes (protocol 2) used to frame the streamed structure.
_PROTO2 = b"\x80\x02"
_EMPTY_DICT = b"}"
_EMPTY_LIST = b"]"
_MARK = b"("
_APPENDS = b"e"
_APPEND = b"a"
_SETITEM = b"s"
_STOP = b"."
_BATCH = 1000  # events per APPENDS: bounded stack in the unpickler
_LARGE_SEGMENT = 2**20  # the CUDA caching allocator's small/large pool boundary


def _body(obj: Any) -> bytes:
    """``obj`` pickled without its PROTO header and STOP, to splice into a larger pickle.

    Each body's memo indexes restart at 0; the unpickler simply overwrites them, and no
    body refers to another's objects.
    """
    data = pickle.dumps(obj, protocol=2)
    return data[2:-1]


def device_index(device: str) -> int:
    """The snapshot's device slot: ``cuda:N`` is N; a CPU trace goes in slot 0."""
    if device.startswith("cuda"):
        return int(device.partition(":")[2] or 0)
    return 0


def _viz_event(event: Event, action: str) -> Event:
    t_us = event.get("t_us")
    return {
        "action": action,
        "addr": int(event.get("addr") or 0),
        "size": int(event.get("size") or 0),
        "stream": int(event.get("stream") or 0),
        "time_us": int(t_us) if t_us is not None else 0,
        "frames": list(event.get("frames") or []),
    }


def viz_events(events: Iterable[Event], replay: Replay) -> Iterator[Event]:
    """Our normalised events as PyTorch's history entries, feeding ``replay`` as they go."""
    pending_free: set[Any] = set()
    for event in events:
        action = event.get("action")
        if (action in FREES or action == "free_requested") and not event.get("frames"):
            # An imported snapshot stores a free's frames with its allocation only.
            block = replay.live.get(event.get("addr"))
            if block is not None and block.frames:
                event = {**event, "frames": list(block.frames)}
        replay.feed(event)
        if action == "mark" or action is None or event.get("pre_trace"):
            # The snapshot format has no phase marks; blocks an imported snapshot held
            # before its trace began are in its segments, not its history.
            continue
        if action == "free_requested":
            pending_free.add(event.get("addr"))
        elif action in FREES:
            # CUDA traces carry free_requested already; the CPU's have only the free.
            if event.get("addr") not in pending_free:
                yield _viz_event(event, "free_requested")
            pending_free.discard(event.get("addr"))
            action = "free_completed"
        yield _viz_event(event, str(action))


def _block(addr: int, size: int, state: str, frames: list[Any] | None = None) -> dict[str, Any]:
    return {
        "address": addr,
        "size": size,
        "requested_size": size if state == "active_allocated" else 0,
        "state": state,
        "frames": frames or [],
    }


def final_segments(replay: Replay, device: int) -> list[dict[str, Any]]:
    """The allocator's state at the end of the trace, as snapshot segments.

    Blocks still alive fill the segments that contain them, with inactive gaps between;
    a block outside any recorded segment (CPU traces have none) gets a segment of its own.
    """
    live = sorted(
        (b for b in replay.live.values() if b.addr is not None), key=lambda b: b.addr or 0
    )
    placed: set[int] = set()
    out = []
    for addr, (size, stream) in sorted(replay.segments.items()):
        inside = [b for b in live if b.addr is not None and addr <= b.addr < addr + size]
        out.append(_segment(device, addr, size, stream, inside))
        placed.update(id(b) for b in inside)
    for b in live:
        if id(b) not in placed and b.addr is not None:
            out.append(_segment(device, b.addr, b.size, b.stream, [b]))
    return out


def _segment(device: int, addr: int, size: int, stream: Any, blocks: list[Block]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    cursor = addr
    for b in blocks:
        assert b.addr is not None
        if b.addr > cursor:
            parts.append(_block(cursor, b.addr - cursor, "inactive"))
        parts.append(_block(b.addr, b.size, "active_allocated", list(b.frames)))
        cursor = b.addr + b.size
    if cursor < addr + size:
        parts.append(_block(cursor, addr + size - cursor, "inactive"))
    active = sum(b.size for b in blocks)
    return {
        "device": device,
        "address": addr,
        "total_size": size,
        "allocated_size": active,
        "active_size": active,
        "requested_size": active,
        "stream": int(stream or 0),
        "segment_type": "large" if size >= _LARGE_SEGMENT else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": parts,
    }


def memory_viz(
    events: Iterable[Event], device: str, segments: list[dict[str, Any]] | None = None
) -> Iterator[bytes]:
    """The pickle, in pieces: ``{"device_traces": [[], ..., [events]], "segments": [...],
    "allocator_settings": {}}`` with our trace in the experiment's device slot. An imported
    snapshot passes its own ``segments``; otherwise they are replayed from the trace."""
    slot = device_index(device)
    replay = Replay()
    yield _PROTO2 + _EMPTY_DICT + _body("device_traces") + _EMPTY_LIST
    yield (_EMPTY_LIST + _APPEND) * slot
    yield _EMPTY_LIST
    batch: list[bytes] = []
    for entry in viz_events(events, replay):
        batch.append(_body(entry))
        if len(batch) >= _BATCH:
            yield _MARK + b"".join(batch) + _APPENDS
            batch = []
    if batch:
        yield _MARK + b"".join(batch) + _APPENDS
    yield _APPEND + _SETITEM
    final = segments if segments is not None else final_segments(replay, slot)
    yield _body("segments") + _body(final) + _SETITEM
    yield _body("allocator_settings") + _body({}) + _SETITEM + _STOP


def chrome(events: Iterable[Event], experiment: str, device: str) -> Iterator[bytes]:
    """Trace-event JSON, one event a line inside ``{"traceEvents": [...]}``."""
    pid, mem_tid, phase_tid = 1, 1, 2
    replay = Replay()
    first = True

    def out(obj: dict[str, Any]) -> bytes:
        nonlocal first
        sep = b"" if first else b",\n"
        first = False
        return sep + json.dumps(obj, separators=(",", ":")).encode()

    yield b'{"displayTimeUnit":"ms","traceEvents":[\n'
    yield out(
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"vramlab {experiment}"}}
    )
    yield out(
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": mem_tid, "args": {"name": device}}
    )
    yield out(
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": phase_tid, "args": {"name": "phases"}}
    )
    phase: tuple[str, float] | None = None
    for event in events:
        # Look the block up before the free removes it: its alloc's slice id.
        freed = replay.live.get(event.get("addr")) if event.get("action") in FREES else None
        changed = replay.feed(event)
        ts = replay.t_us
        action = event.get("action")
        if action == "mark":
            name = str(event.get("name") or event.get("phase") or "phase")
            if phase is not None:
                yield out(_phase_slice(pid, phase_tid, phase, ts))
            phase = (name, ts)
            yield out({"ph": "i", "s": "g", "name": name, "pid": pid, "tid": phase_tid, "ts": ts})
            continue
        if action == "alloc":
            yield out(
                {
                    "ph": "b",
                    "cat": "alloc",
                    "name": _human(int(event.get("size") or 0)),
                    "id": f"{event.get('addr')}:{event.get('seq')}",
                    "pid": pid,
                    "tid": mem_tid,
                    "ts": ts,
                    "args": {
                        "size": event.get("size"),
                        "addr": event.get("addr"),
                        "phase": event.get("phase"),
                        "stream": event.get("stream"),
                    },
                }
            )
        elif freed is not None:
            yield out(
                {
                    "ph": "e",
                    "cat": "alloc",
                    "name": _human(freed.size),
                    "id": f"{freed.addr}:{freed.seq}",
                    "pid": pid,
                    "tid": mem_tid,
                    "ts": ts,
                }
            )
        if changed:
            args: dict[str, int] = {"allocated": replay.allocated}
            if replay.has_segments:
                args["reserved"] = replay.reserved
            yield out({"ph": "C", "name": "memory (bytes)", "pid": pid, "ts": ts, "args": args})
    if phase is not None:
        yield out(_phase_slice(pid, phase_tid, phase, replay.t_us))
    yield b"\n]}\n"


def _phase_slice(pid: int, tid: int, phase: tuple[str, float], end: float) -> dict[str, Any]:
    name, start = phase
    return {
        "ph": "X",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start,
        "dur": max(0.0, end - start),
    }


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
