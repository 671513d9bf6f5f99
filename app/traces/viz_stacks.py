"""A block of a chunk recorded with stacks, as kept at upload: its columns, a stack id an
event and the chunk's table of distinct stacks; and its memory_viz entries from them.

``write`` gives the entries the general path (``memory_viz._entries``) gives for the
block's lines, byte for byte, without a dict an entry or a frame: it keeps the export's
state as that path does, event by event, and writes the entries with ``viz_frames``.
Where that path would take a free's frames from its allocation (a free stored without
frames, its block alive with some), ``takes`` says no and the export gives the block to
the general path as the events its lines hold (``as_events``).

The blocks alive keep a stack as ``LazyFrames``: the frames the general path would have
kept, made only where they are read (a free that takes them, the final segments), with
the keys of their block as json would have shared them.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.traces import viz_frames, viz_records
from app.traces.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS
from app.traces.viz_pickle import SLOT

_REQUESTED_SLOT = SLOT["free_requested"]
_COMPLETED_SLOT = SLOT["free_completed"]
_ACTION_SLOT = [SLOT.get(n, 0) if isinstance(n, str) else 0 for n in viz_records.NAMES]
_TAKES_FRAMES = (*FREES, "free_requested")  # without frames, these take their block's


class StackTable:
    """A chunk's distinct stacks, from their stored JSON, each parsed when first read.
    Id 0 is no frames; id i is ``texts[i - 1]``."""

    def __init__(self, texts: list[bytes]) -> None:
        self.texts = texts
        self._stacks: dict[int, viz_frames.Stack | None] = {}

    def stack(self, sid: int) -> viz_frames.Stack | None:
        if not sid:
            return None
        if sid not in self._stacks:
            frames = viz_frames.frames_of(self.texts[sid - 1])
            if frames is None:  # checked at upload: a bug, never the client's
                raise RuntimeError("a stored stack is not one the export writes")
            self._stacks[sid] = viz_frames.Stack(frames) if frames else None
        return self._stacks[sid]


@dataclass
class StackBlock:
    columns: viz_records.Columns
    stack: np.ndarray  # per event: 0 none, else 1 + its index in the table
    table: StackTable


class _Keys:
    """A block's frame keys: made once, as json makes a block's keys one object each."""

    def __init__(self) -> None:
        self._keys: tuple[str, str, str] | None = None

    def get(self) -> tuple[str, str, str]:
        if self._keys is None:
            f, line, n = (k.encode().decode() for k in viz_frames.FRAME_KEYS)  # new objects
            self._keys = (f, line, n)
        return self._keys


def _made(stack: viz_frames.Stack, keys: _Keys) -> list[dict[str, Any]]:
    """The frames as json makes them: new strings (short ones shared by CPython)."""
    f, line, n = keys.get()
    return [
        {
            f: fr.filename_utf8.decode("utf-8", "surrogatepass"),
            line: fr.line,
            n: fr.name_utf8.decode("utf-8", "surrogatepass"),
        }
        for fr in stack.frames
    ]


class LazyFrames:
    """An allocation's frames while its block is alive: made once, when first read."""

    __slots__ = ("_keys", "_made", "_stack")

    def __init__(self, stack: viz_frames.Stack, keys: _Keys) -> None:
        self._stack, self._keys = stack, keys
        self._made: list[dict[str, Any]] | None = None

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._stack.frames)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._made is None:
            self._made = _made(self._stack, self._keys)
        return iter(self._made)


def _events(block: StackBlock) -> Iterator[tuple[Any, ...]]:
    c = block.columns
    addrs: list[Any] = c.addr.tolist()
    for i in np.flatnonzero(c.no_addr).tolist():
        addrs[i] = None
    return zip(
        c.code.tolist(),
        addrs,
        c.size.tolist(),
        c.stream.tolist(),
        c.time.tolist(),
        block.stack.tolist(),
        strict=True,
    )


def takes(block: StackBlock, live: dict[Any, tuple[int, Any, Any]]) -> bool:
    """Whether ``write`` can take the block: no free without frames whose block is alive
    with frames (from this block or before it)."""
    stackless = block.stack == 0
    takers = np.isin(block.columns.code, [viz_records.NAMES.index(n) for n in _TAKES_FRAMES])
    if not (stackless & takers).any():
        return True
    framed: dict[Any, bool] = {}  # this block's allocations and frees so far
    alloc, free = viz_records.NAMES.index("alloc"), [viz_records.NAMES.index(n) for n in FREES]
    for code, addr, _, _, _, sid in _events(block):
        if code == alloc and addr is not None:
            framed[addr] = bool(sid)
        elif not sid and viz_records.NAMES[code] in _TAKES_FRAMES:
            if addr in framed:
                if framed[addr]:
                    return False
            else:
                alive = live.get(addr)
                if alive is not None and alive[2]:
                    return False
        if code in free:
            framed[addr] = False
    return True


class State(Protocol):
    """What the export keeps while it streams (``memory_viz.State``)."""

    segments: dict[int, tuple[int, Any]]
    pending: set[Any]
    frames_seen: bool


def write(
    block: StackBlock, live: dict[Any, tuple[int, Any, Any]], state: State
) -> Iterator[bytes]:
    """The block's entries as ``memory_viz._entries`` writes them for its lines (where
    ``takes``), a batch at a time; ``live`` and ``state`` kept as that path keeps them."""
    keys = _Keys()
    table = block.table
    segments, pending = state.segments, state.pending
    entries: list[viz_frames.Entry] = []
    add = entries.append
    for code, addr, size, stream, time, sid in _events(block):
        name = viz_records.NAMES[code]
        if name == "mark" or name is None:
            continue
        stack = table.stack(sid)
        if name == "alloc":
            if addr is not None:
                live[addr] = (size, stream, None if stack is None else LazyFrames(stack, keys))
                state.frames_seen = state.frames_seen or stack is not None
        elif name in FREES:
            live.pop(addr, None)
        elif name in SEGMENT_GROWS:
            if addr is not None:
                segments[int(addr)] = (size, stream)
        elif name in SEGMENT_SHRINKS and addr is not None:
            segments.pop(int(addr), None)
        at = addr or 0
        if name == "free_requested":
            pending.add(addr)
        elif name in FREES:
            second = addr not in pending
            if second:
                add((_REQUESTED_SLOT, at, size, stream, time, stack, False))
            pending.discard(addr)
            add((_COMPLETED_SLOT, at, size, stream, time, stack, second))
            if len(entries) >= viz_frames.BATCH:
                yield viz_frames.batch(entries)
                entries = []
                add = entries.append
            continue
        add((_ACTION_SLOT[code], at, size, stream, time, stack, False))
        if len(entries) >= viz_frames.BATCH:
            yield viz_frames.batch(entries)
            entries = []
            add = entries.append
    if entries:
        yield viz_frames.batch(entries)


def as_events(block: StackBlock) -> list[dict[str, Any]]:
    """The block as the events the general path reads from its lines: the columns'
    (``viz_records.as_events``) with each event's frames made as json makes them."""
    events = viz_records.as_events(block.columns)
    keys = _Keys()
    for event, sid in zip(events, block.stack.tolist(), strict=True):
        stack = block.table.stack(sid)
        if stack is not None:
            event["frames"] = _made(stack, keys)
    return events
