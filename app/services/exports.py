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

Both take events in batches (a stored chunk is one batch: ``traces.iter_event_batches``)
and keep per event only what the format needs: a batch of memory_viz entries is pickled
in one call, and Chrome's frequent events are formatted from cached pieces rather than
encoded object by object. Memory stays bounded by one batch and the blocks alive at once.
"""

import bisect
import itertools
import json
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from app.contract import MEMORY_VIZ_ACTIONS
from app.core.units import human_bytes
from app.services.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS, Block, Replay

Event = dict[str, Any]
Batches = Iterable[list[Event]]

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
_EVENTS_PER_BATCH = 5000  # when events come one by one
_LIST_HEAD = b"]q\x00"  # EMPTY_LIST, BINPUT 0: how pickle.dumps(list, 2) opens a list
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
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
    addrs = [b.addr or 0 for b in live]
    placed: set[int] = set()
    out = []
    for addr, (size, stream) in sorted(replay.segments.items()):
        # The blocks in [addr, addr + size): a slice of the sorted blocks, found by bisection
        # (a scan of every block for every segment was quadratic on long traces).
        inside = live[bisect.bisect_left(addrs, addr) : bisect.bisect_left(addrs, addr + size)]
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


def batched(events: Iterable[Event], size: int = _EVENTS_PER_BATCH) -> Iterator[list[Event]]:
    iterator = iter(events)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _appends(entries: list[Event]) -> bytes:
    """``entries`` pickled in one call, as opcodes that append them to the list on the
    unpickler's stack (MARK ... APPENDS, or the item and APPEND for one entry).

    Its memo indexes restart at 0 and refer only to objects of this batch: repeated keys
    and actions are written once a batch, not once an event.
    """
    data = pickle.dumps(entries, protocol=2)
    if not data.startswith(b"\x80\x02" + _LIST_HEAD) or not data.endswith(_STOP):
        raise RuntimeError("unexpected pickle framing for a list")  # a bug: never the client's
    return data[2 + len(_LIST_HEAD) : -1]


# Our actions as the constants below: the pickler writes each once a batch.
_VIZ_ACTIONS = {a: a for a in MEMORY_VIZ_ACTIONS}


class _Final:
    """What the allocator holds at the end of a trace, as ``Replay`` keeps it, with plain
    tuples: live blocks by address (size, stream, frames) and segments (size, stream)."""

    def __init__(self) -> None:
        self.live: dict[Any, tuple[int, Any, Any, int]] = {}
        self.segments: dict[int, tuple[int, Any]] = {}

    def blocks(self) -> list[Block]:
        return [
            Block(addr, size, seq, 0.0, None, stream, tuple(frames or ()))
            for addr, (size, stream, frames, seq) in self.live.items()
            if addr is not None
        ]


def memory_viz(
    events: Iterable[Event], device: str, segments: list[dict[str, Any]] | None = None
) -> Iterator[bytes]:
    """The pickle, in pieces: ``{"device_traces": [[], ..., [events]], "segments": [...],
    "allocator_settings": {}}`` with our trace in the experiment's device slot. An imported
    snapshot passes its own ``segments``; otherwise they are replayed from the trace."""
    return memory_viz_batches(batched(events), device, segments)


def memory_viz_batches(
    batches: Batches, device: str, given_segments: list[dict[str, Any]] | None = None
) -> Iterator[bytes]:
    """``memory_viz`` over batches of events (a stored chunk each)."""
    slot = device_index(device)
    final = _Final()
    live, segments = final.live, final.segments
    pending_free: set[Any] = set()
    actions = _VIZ_ACTIONS
    yield _PROTO2 + _EMPTY_DICT + _body("device_traces") + _EMPTY_LIST
    yield (_EMPTY_LIST + _APPEND) * slot
    yield _EMPTY_LIST
    index = -1
    for batch in batches:
        entries: list[Event] = []
        add = entries.append
        for event in batch:
            index += 1
            action = event.get("action")
            if action == "mark" or action is None:
                continue  # the snapshot format has no phase marks
            addr = event.get("addr")
            size = int(event.get("size") or 0)
            frames = event.get("frames")
            if not frames and (action in FREES or action == "free_requested"):
                # An imported snapshot stores a free's frames with its allocation only.
                block = live.get(addr)
                if block is not None and block[2]:
                    frames = block[2]
            # What Replay.feed does, for the final segments.
            if action == "alloc":
                if addr is not None:
                    live[addr] = (size, event.get("stream"), frames, index)
            elif action in FREES:
                live.pop(addr, None)
            elif action in SEGMENT_GROWS:
                if addr is not None:
                    segments[int(addr)] = (size, event.get("stream"))
            elif action in SEGMENT_SHRINKS and addr is not None:
                segments.pop(int(addr), None)
            if event.get("pre_trace"):
                # Blocks an imported snapshot held before its trace began are in its
                # segments, not its history.
                continue
            t_us = event.get("t_us")
            name = str(action)
            entry: Event = {
                "action": actions.get(name, name),
                "addr": int(addr or 0),
                "size": size,
                "stream": int(event.get("stream") or 0),
                "time_us": int(t_us) if t_us is not None else 0,
                "frames": list(frames or []),
            }
            if action == "free_requested":
                pending_free.add(addr)
            elif action in FREES:
                # CUDA traces carry free_requested already; the CPU's have only the free.
                if addr not in pending_free:
                    add({**entry, "action": "free_requested"})
                pending_free.discard(addr)
                entry["action"] = "free_completed"
            add(entry)
            if len(entries) >= _BATCH:
                yield _appends(entries)
                entries = []
                add = entries.append
        if entries:
            yield _appends(entries)
    yield _APPEND + _SETITEM
    if given_segments is None:
        replay = Replay()
        replay.live = {b.addr: b for b in final.blocks()}
        replay.segments = segments
        given_segments = final_segments(replay, slot)
    yield _body("segments") + _body(given_segments) + _SETITEM
    yield _body("allocator_settings") + _body({}) + _SETITEM + _STOP


def chrome(events: Iterable[Event], experiment: str, device: str) -> Iterator[bytes]:
    """Trace-event JSON, one event a line inside ``{"traceEvents": [...]}``."""
    return chrome_batches(batched(events), experiment, device)


def _json_value(value: Any) -> str:
    """``value`` as json.dumps writes it; ints and finite floats without the encoder."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float and value - value == 0:  # finite
        return float.__repr__(value)
    return _ENCODE(value)


def chrome_batches(batches: Batches, experiment: str, device: str) -> Iterator[bytes]:
    """``chrome`` over batches of events (a stored chunk each).

    The allocator's state is replayed inline, as ``Replay.feed`` does: allocated and
    reserved bytes, and the live blocks by address (size and seq, for a free's slice)."""
    pid, mem_tid, phase_tid = 1, 1, 2
    lines: list[str] = [
        _ENCODE(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": f"vramlab {experiment}"},
            }
        ),
        _ENCODE(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": mem_tid, "args": {"name": device}}
        ),
        _ENCODE(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": phase_tid,
                "args": {"name": "phases"},
            }
        ),
    ]
    yield b'{"displayTimeUnit":"ms","traceEvents":[\n' + ",\n".join(lines).encode()
    live: dict[Any, tuple[int, int]] = {}  # addr -> (size, seq)
    allocated = reserved = 0
    has_segments = False
    t_us = 0.0
    index = -1
    phase: tuple[str, float] | None = None
    names: dict[int, str] = {}  # size -> its slice name, JSON-quoted
    encoded: dict[Any, str] = {}  # phase and stream values, as JSON
    for batch in batches:
        lines = []
        out = lines.append
        for event in batch:
            index += 1
            if event.get("t_us") is not None:
                t_us = float(event["t_us"])
            ts = _json_value(t_us)
            action = event.get("action")
            addr = event.get("addr")
            if action == "mark":
                name = str(event.get("name") or event.get("phase") or "phase")
                if phase is not None:
                    out(_ENCODE(_phase_slice(pid, phase_tid, phase, t_us)))
                phase = (name, t_us)
                out(
                    _ENCODE(
                        {
                            "ph": "i",
                            "s": "g",
                            "name": name,
                            "pid": pid,
                            "tid": phase_tid,
                            "ts": t_us,
                        }
                    )
                )
                continue
            raw_size = event.get("size")
            size = int(raw_size or 0)
            if action == "alloc":
                seq = event.get("seq")
                live[addr if addr is not None else ("seq", index)] = (
                    size,
                    int(event.get("seq", index)),
                )
                allocated += size
                label = names.get(size)
                if label is None:
                    label = names[size] = _ENCODE(human_bytes(size))
                key = event.get("phase")
                ph = encoded.get(key) if isinstance(key, str | None) else None
                if ph is None:
                    ph = _ENCODE(key)
                    if isinstance(key, str | None):
                        encoded[key] = ph
                out(
                    f'{{"ph":"b","cat":"alloc","name":{label},'
                    f'"id":{_ENCODE(f"{addr}:{seq}")},"pid":1,"tid":1,"ts":{ts},'
                    f'"args":{{"size":{_json_value(raw_size)},"addr":{_json_value(addr)},'
                    f'"phase":{ph},"stream":{_json_value(event.get("stream"))}}}}}'
                )
            elif action in FREES:
                freed = live.pop(addr, None)
                if freed is None:
                    continue  # a block allocated before the trace began: nothing changed
                allocated -= freed[0]
                out(
                    f'{{"ph":"e","cat":"alloc","name":{names[freed[0]]},'
                    f'"id":{_ENCODE(f"{addr}:{freed[1]}")},"pid":1,"tid":1,"ts":{ts}}}'
                )
            elif action in SEGMENT_GROWS:
                has_segments = True
                reserved += size
            elif action in SEGMENT_SHRINKS:
                has_segments = True
                reserved = max(0, reserved - size)
            else:
                continue
            if has_segments:
                counter = f'{{"allocated":{allocated},"reserved":{reserved}}}'
            else:
                counter = f'{{"allocated":{allocated}}}'
            out(f'{{"ph":"C","name":"memory (bytes)","pid":1,"ts":{ts},"args":{counter}}}')
        if lines:
            yield (",\n" + ",\n".join(lines)).encode()
    if phase is not None:
        yield (",\n" + _ENCODE(_phase_slice(pid, phase_tid, phase, t_us))).encode()
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
