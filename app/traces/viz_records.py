"""Stored trace lines as memory_viz entries, a block of lines at a time, column by column.

The common block (no frames, values of the expected JSON types, known actions) is decoded
by msgspec into only the fields the format reads, held as numpy columns, and written as
fixed-layout pickle records: every entry is the same opcodes with its numbers in the same
places, so a block's entries are one array filled column by column, not objects built and
pickled one by one. The state the export keeps (blocks alive, segments, frees requested)
is updated from the last event of each address in the block.

``decode`` returns None for any other block, before anything changes; the export then
takes the general path (``memory_viz``), which gives the same entries event by event.
"""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from app.traces import viz_rows
from app.traces.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS
from app.traces.viz_live import LiveBlocks
from app.traces.viz_pickle import ACTIONS, BINGET, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, SLOT

BATCH = viz_rows.BATCH  # entries per MARK ... APPENDS: a bounded stack in the unpickler
_TIME_EXACT = 2**53  # larger times would not survive the float column exactly


# Action codes: the snapshot's actions, then ours that become one of them or nothing.
# A code column's names (also ``viz_stacks``'): its code is the index.
NAMES: tuple[str | None, ...] = (*ACTIONS, "free", "mark", None)
_CODE = {name: i for i, name in enumerate(NAMES)}
# The known actions as a Literal: msgspec matches them without making a string an event
# (a third less time decoding), and an unknown action does not decode.
_Action = Literal[tuple(n for n in NAMES if n is not None)]  # type: ignore[valid-type]


class _Event(msgspec.Struct, gc=False):
    """The fields of a stored event that the format reads; the others are skipped. A
    block with frames, with events from before an imported trace, or with an action of
    no known kind does not decode."""

    action: _Action | None = None  # type: ignore[valid-type]
    addr: int | None = None
    size: int | None = None
    stream: int | None = None
    t_us: int | float | None = None
    frames: Annotated[list[Any], msgspec.Meta(max_length=0)] | None = None
    pre_trace: None = None


DECODER = msgspec.json.Decoder(_Event)


class Checked(_Event, gc=False):
    """A stored event as the upload's check decodes it (``traces.check_chunk``): the
    same fields, but a missing ``action`` or ``size`` is told from a null one."""

    action: _Action | UnsetType | None = UNSET  # type: ignore[valid-type,assignment]
    size: int | UnsetType | None = UNSET  # type: ignore[assignment]


CHECKED = msgspec.json.Decoder(Checked)


class Stacked(Checked, gc=False):
    """A stored event with frames as the upload's check decodes it: the frames kept as
    their JSON, for the chunk's table of stacks (``viz_stacks``)."""

    frames: msgspec.Raw = msgspec.Raw(b"null")  # type: ignore[assignment]


STACKED = msgspec.json.Decoder(Stacked)

_SKIPPED = _CODE["mark"]  # this code and those after it write no entry
# The memo slot of the action each code writes ("free" is written "free_completed").
_OUT_SLOT = np.array(
    [SLOT["free_completed" if n in FREES else n] if n in SLOT or n in FREES else 0 for n in NAMES],
    np.uint8,
)


def _table(names: tuple[str | None, ...]) -> np.ndarray:
    """Whether each code is one of ``names``: indexed by a code column, a mask."""
    return np.array([n in names for n in NAMES], bool)


_ALLOC, _FREE, _REQUESTED = _table(("alloc",)), _table(FREES), _table(("free_requested",))
_GROW, _SHRINK = _table(SEGMENT_GROWS), _table(SEGMENT_SHRINKS)


def _ref(word: str) -> bytes:
    return BINGET + bytes([SLOT[word]])


# An entry: ``{"action": <memo>, "addr": <int>, "size": <int>, "stream": <int>,
# "time_us": <int>, "frames": []}``.
_ENTRY: viz_rows.Spec = (
    EMPTY_DICT + MARK + _ref("action") + BINGET,
    ("byte", "action"),
    _ref("addr"),
    ("int", "addr"),
    _ref("size"),
    ("int", "size"),
    _ref("stream"),
    ("int", "stream"),
    _ref("time_us"),
    ("int", "time"),
    _ref("frames") + EMPTY_LIST + SETITEMS,
)


@dataclass
class Columns:
    """A block's events, one array a field (addr 0 where it was null)."""

    code: np.ndarray
    addr: np.ndarray
    no_addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time: np.ndarray


def decode(block: bytes) -> Columns | None:
    """``block`` (whole NDJSON lines) as columns, or None where the general path must
    take it: frames (or a free whose block may have them), events from before an
    imported trace, a value of another type than the fast path reads, an action of no
    known kind, a free of no address, a number past 64 bits."""
    try:
        events = DECODER.decode_lines(block)
    except (ValueError, RecursionError):  # msgspec's errors, invalid UTF-8, deep nesting
        return None
    return from_events(events)


def from_events(events: Sequence[Any]) -> Columns | None:
    """Decoded events (``_Event``'s fields, by attribute) as columns, or None where the
    general path must take them; each event is judged on its own, so the columns of many
    lines are those of any block of them, one after another."""
    n = len(events)
    # Every action decoded is one of _CODE's (the Literal): a plain look-up, no default.
    code = np.fromiter(map(_CODE.__getitem__, map(_GET["action"], events)), np.int8, n)
    try:
        addr, no_addr = _column(events, "addr", np.int64), np.zeros(n, bool)
        if addr.dtype != np.int64:  # a null
            addrs = addr.tolist()
            no_addr = np.array([a is None for a in addrs], bool)
            addr = np.array([0 if a is None else a for a in addrs], np.int64)
        size = _column(events, "size", np.int64)
        stream = _column(events, "stream", np.int64)
        t_us = _column(events, "t_us", np.float64)  # a null is NaN
    except OverflowError:
        return None
    if (code < 0).any() or (no_addr & (_FREE[code] | _REQUESTED[code])).any():
        return None
    t_us[np.isnan(t_us)] = 0
    if (np.abs(t_us) >= _TIME_EXACT).any():
        return None
    return Columns(code, addr, no_addr, size, stream, t_us.astype(np.int64))  # int() truncates


def as_events(c: Columns) -> list[dict[str, Any]]:
    """The columns as the events the general path reads, for stored columns it must take
    (once a block with frames has been alive): what it reads of a plain event, but a
    null stream as 0 and no frames key, which it writes the same (``int(stream or 0)``,
    ``frames or ()``)."""
    addrs = c.addr.tolist()
    for i in np.flatnonzero(c.no_addr).tolist():
        addrs[i] = None
    rows = zip(
        map(NAMES.__getitem__, c.code.tolist()),
        addrs,
        c.size.tolist(),
        c.stream.tolist(),
        c.time.tolist(),
        strict=True,
    )
    keys = ("action", "addr", "size", "stream", "t_us")
    return [dict(zip(keys, row, strict=True)) for row in rows]


_GET = {name: attrgetter(name) for name in ("action", "addr", "size", "stream", "t_us")}


def _column(events: Sequence[Any], name: str, dtype: type) -> np.ndarray:
    """A field of every event in one array, without a list between; where a value is
    null: NaN in a float column, 0 in an int column, except ``addr``, which comes back
    as objects (None kept) for ``decode`` to mark."""
    values = map(_GET[name], events)
    try:
        return np.fromiter(values, dtype, len(events))
    except TypeError:  # a null
        listed = list(map(_GET[name], events))
        if dtype is np.float64:
            return np.array(listed, np.float64)
        if name == "addr":
            return np.array(listed, object)
        return np.array([v or 0 for v in listed], np.int64)


def _pop_all(d: dict[Any, Any], keys: list[Any]) -> None:
    deque(map(d.pop, keys, repeat(None)), maxlen=0)  # the loop in C


def _last(order: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Of ``order`` (positions sorted by key, then in order) and its ``keys``: the last
    position of each distinct key, by key."""
    if not order.size:
        return order
    return order[np.append(keys[1:] != keys[:-1], True)]


def apply(
    c: Columns,
    live: LiveBlocks,
    segments: dict[int, tuple[int, Any]],
    pending: set[Any],
) -> np.ndarray:
    """Update the state with the block's events; return where a free has no
    free_requested before it (CPU traces have only the free: the export adds one)."""
    has_addr = ~c.no_addr
    is_alloc, is_free, is_requested = _ALLOC[c.code], _FREE[c.code], _REQUESTED[c.code]
    # One sort serves the three below: each takes its events from it, by address, then
    # in order.
    by_addr = np.argsort(c.addr, kind="stable")

    def sorted_where(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = by_addr[mask[by_addr]]
        return order, c.addr[order]

    # Blocks: what the last alloc or free of each address left.
    last = _last(*sorted_where((is_alloc | is_free) & has_addr))
    if last.size:
        live.update(c.addr[last], is_alloc[last], c.size[last], c.stream[last])
    # Segments, the same way.
    is_grow = _GROW[c.code]
    last = _last(*sorted_where((is_grow | _SHRINK[c.code]) & has_addr))
    if last.size:
        _pop_all(segments, c.addr[last[~is_grow[last]]].tolist())
        grown = last[is_grow[last]]
        sizes = zip(c.size[grown].tolist(), c.stream[grown].tolist(), strict=True)
        segments.update(zip(c.addr[grown].tolist(), sizes, strict=True))
    # Frees requested: a free completes one if the address's previous request or free
    # (in this block, else before it) was a request.
    order, keys = sorted_where(is_requested | is_free)
    if not order.size:
        return order
    keys = c.addr[order]
    first = np.ones(len(order), bool)
    first[1:] = keys[1:] != keys[:-1]
    requested_before = np.empty(len(order), bool)
    requested_before[1:] = is_requested[order[:-1]]
    # The first event of each address asks the set from earlier blocks, which holds only
    # requests not yet freed: one set operation finds those of this block's addresses.
    carried = pending.intersection(keys[first].tolist()) if pending else set()
    requested_before[first] = np.isin(keys[first], np.array(list(carried), np.int64))
    unrequested = order[is_free[order] & ~requested_before]
    ends = order[np.append(first[1:], True)]
    ends_freed = ends[is_free[ends]]
    if carried and ends_freed.size:
        pending.difference_update(carried.intersection(c.addr[ends_freed].tolist()))
    pending.update(c.addr[ends[is_requested[ends]]].tolist())
    return unrequested


def entries(c: Columns, unrequested: np.ndarray) -> bytes:
    """The block's entries as opcodes that append them to the list on the unpickler's
    stack, a free_requested written before each free in ``unrequested``."""
    kept = np.flatnonzero(c.code < _SKIPPED)
    if not kept.size:
        return b""
    doubled = np.zeros(len(c.code), np.int64)
    doubled[unrequested] = 1
    copies = 1 + doubled[kept]
    source = np.repeat(kept, copies)
    slots = _OUT_SLOT[c.code[source]]
    if unrequested.size:
        slots[(np.cumsum(copies) - copies)[copies == 2]] = SLOT["free_requested"]
    columns = {
        "action": slots,
        "addr": c.addr[source],
        "size": c.size[source],
        "stream": c.stream[source],
        "time": c.time[source],
    }
    return viz_rows.appended(_ENTRY, columns, len(source))
