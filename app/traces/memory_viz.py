"""The ``memory_viz`` export: a pickle in PyTorch's snapshot format
(``torch.cuda.memory._snapshot()``), which https://pytorch.org/memory_viz and
``torch.cuda._memory_viz`` open, streamed from the stored trace a block of lines at a time.

Built without torch: ``viz_pickle`` writes the outer dict and lists and the memo that
entries share; each block's entries are written as fixed-layout records by
``viz_records`` when it can take the block, else event by event here (frames, imported
snapshots' events, unusual values), pickled a thousand at a time. The final ``segments``
(what the allocator held at the end, which the viewer rewinds from) come from replaying
the trace as it streams, written by ``viz_segments``. Memory stays bounded by one block
and what is alive at once.
"""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from app.traces import viz_records, viz_rows, viz_segments, viz_stacks
from app.traces.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS
from app.traces.viz_live import LiveBlocks
from app.traces.viz_pickle import ACTIONS, CLOSE_TRACES, END, appends, open_traces

Event = dict[str, Any]
# Our actions as the memo's own strings: the pickler refers to them, never writes them.
_VIZ_ACTIONS = {a: a for a in ACTIONS}


def device_index(device: str) -> int:
    """The snapshot's device slot: ``cuda:N`` is N; a CPU trace goes in slot 0."""
    if device.startswith("cuda"):
        return int(device.partition(":")[2] or 0)
    return 0


@dataclass
class State:
    """What the export keeps while it streams: blocks alive by address (size, stream,
    frames), segments by address (size, stream), addresses whose free was requested, and
    whether a block with frames was ever alive (a free without frames takes them)."""

    live: LiveBlocks = field(default_factory=LiveBlocks)
    segments: dict[int, tuple[int, Any]] = field(default_factory=dict)
    pending: set[Any] = field(default_factory=set)
    frames_seen: bool = False


def export(
    blocks: Iterable[bytes | viz_records.Columns | viz_stacks.StackBlock],
    device: str,
    given_segments: list[dict[str, Any]] | None = None,
) -> Iterator[bytes]:
    """The pickle, in pieces: ``{"device_traces": [[], ..., [entries]], "segments": [...],
    "allocator_settings": {}}`` with our trace in the experiment's device slot. ``blocks``
    are whole NDJSON lines (``traces.iter_line_blocks``), or a block's columns as they
    were kept at upload (``traces.iter_viz_blocks``), with a stack an event where the
    chunk has frames (``viz_stacks``), which give what their lines give.
    An imported snapshot passes its own ``segments``; otherwise they are replayed from
    the trace."""
    slot = device_index(device)
    state = State()
    yield open_traces(slot)
    for block in blocks:
        if isinstance(block, viz_stacks.StackBlock):
            if state.frames_seen or block.stack.any():
                live = state.live.as_dict()
                if viz_stacks.takes(block, live):
                    yield from viz_stacks.write(block, live, state)
                else:
                    yield from _entries(viz_stacks.as_events(block), state)
                continue
            block = block.columns  # no frames: as a plain chunk's columns
        columns = None
        if not state.frames_seen:
            columns = viz_records.decode(block) if isinstance(block, bytes) else block
        if columns is not None:
            unrequested = viz_records.apply(columns, state.live, state.segments, state.pending)
            yield viz_records.entries(columns, unrequested)
        elif isinstance(block, bytes):
            events: list[Event] = json.loads(b"[" + block[:-1].replace(b"\n", b",") + b"]")
            yield from _entries(events, state)
        else:
            yield from _entries(viz_records.as_events(block), state)
    yield CLOSE_TRACES
    if given_segments is None:
        yield from viz_segments.write(state.live.as_dict(), state.segments, slot)
    else:
        for start in range(0, len(given_segments), viz_rows.BATCH):
            yield appends(given_segments[start : start + viz_rows.BATCH])
    yield END


def _entries(events: list[Event], state: State) -> Iterator[bytes]:
    """Events one by one: the general path, for any block."""
    live, segments, pending = state.live.as_dict(), state.segments, state.pending
    actions = _VIZ_ACTIONS
    entries: list[Event] = []
    add = entries.append
    for event in events:
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
                live[addr] = (size, event.get("stream"), frames)
                state.frames_seen = state.frames_seen or bool(frames)
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
            pending.add(addr)
        elif action in FREES:
            # CUDA traces carry free_requested already; the CPU's have only the free.
            if addr not in pending:
                add({**entry, "action": "free_requested"})
            pending.discard(addr)
            entry["action"] = "free_completed"
        add(entry)
        if len(entries) >= viz_records.BATCH:
            yield appends(entries)
            entries = []
            add = entries.append
    if entries:
        yield appends(entries)
