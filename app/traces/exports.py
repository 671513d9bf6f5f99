"""The ``chrome`` trace export, written as a stream of bytes: trace-event JSON (Perfetto,
chrome://tracing) with counter events for allocated and reserved bytes, an async slice
per allocation from alloc to free, a slice per phase. (The ``memory_viz`` export is
``memory_viz``'s.)

It takes events in batches (a stored chunk is one batch: ``traces.iter_event_batches``)
and keeps per event only what the format needs: the frequent events are formatted from
cached pieces rather than encoded object by object. Memory stays bounded by one batch and
the blocks alive at once.
"""

import json
from collections.abc import Iterable, Iterator
from typing import Any

from app.traces.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS
from vramlab.units import human_bytes

Event = dict[str, Any]
Batches = Iterable[list[Event]]

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _json_value(value: Any) -> str:
    """``value`` as json.dumps writes it; ints and finite floats without the encoder."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float and value - value == 0:  # finite
        return float.__repr__(value)
    return _ENCODE(value)


def chrome_batches(batches: Batches, experiment: str, device: str) -> Iterator[bytes]:
    """Trace-event JSON, one event a line inside ``{"traceEvents": [...]}``, over batches
    of events (a stored chunk each).

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
