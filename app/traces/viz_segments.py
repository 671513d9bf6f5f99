"""The allocator's state at the end of a trace, as memory_viz segments.

Blocks still alive fill the recorded segments that contain them, with inactive gaps
between; a block outside any recorded segment (CPU traces have none) gets a segment of
its own. Recorded segments are built as dicts and pickled a thousand at a time; the
segments of lone blocks, which a long trace can leave by the ten thousand, are one shape
and are written column by column (``viz_rows``) unless a block has frames or a number
that is not a plain int.
"""

import bisect
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from app.traces import viz_rows
from app.traces.viz_pickle import (
    APPEND,
    BINGET,
    EMPTY_DICT,
    EMPTY_LIST,
    MARK,
    NEWFALSE,
    SETITEMS,
    SLOT,
    TUPLE2,
    appends,
    int_opcode,
)

_LARGE_SEGMENT = 2**20  # the CUDA caching allocator's small/large pool boundary
_ROWS = 16 * viz_rows.BATCH  # lone segments written at once: bounded memory
Live = dict[Any, tuple[int, Any, Any]]  # address -> (size, stream, frames)


def _ref(word: str) -> bytes:
    return BINGET + bytes([SLOT[word]])


def _one_block_segment(used: str, state: str) -> viz_rows.Spec:
    """A segment that holds one block, the whole segment: ``used`` is the column of its
    allocated, active and requested bytes (``size``: the block is in use; ``zero``: it is
    not), ``state`` the block's state."""
    return (
        EMPTY_DICT + MARK + _ref("device"),
        ("int", "device"),
        _ref("address"),
        ("int", "addr"),
        _ref("total_size"),
        ("int", "size"),
        _ref("allocated_size"),
        ("int", used),
        _ref("active_size"),
        ("int", used),
        _ref("requested_size"),
        ("int", used),
        _ref("stream"),
        ("int", "stream"),
        _ref("segment_type") + BINGET,
        ("byte", "type"),
        _ref("segment_pool_id")
        + int_opcode(0) * 2
        + TUPLE2
        + _ref("is_expandable")
        + NEWFALSE
        + _ref("frames")
        + EMPTY_LIST
        + _ref("blocks")
        + EMPTY_LIST
        + EMPTY_DICT
        + MARK
        + _ref("address"),
        ("int", "addr"),
        _ref("size"),
        ("int", "size"),
        _ref("requested_size"),
        ("int", used),
        _ref("state") + _ref(state) + _ref("frames") + EMPTY_LIST + SETITEMS,
        APPEND + SETITEMS,
    )


# A lone block's segment, as _segment() builds it for one active block.
_LONE = _one_block_segment("size", "active_allocated")
# A recorded segment with no live block: one inactive block, the whole segment.
_EMPTY = _one_block_segment("zero", "inactive")


def write(live: Live, segments: dict[int, tuple[int, Any]], device: int) -> Iterator[bytes]:
    """Opcodes appending the segments to the list on the unpickler's stack."""
    blocks = sorted(live.items(), key=lambda item: item[0] or 0)
    addrs = [addr or 0 for addr, _ in blocks]
    placed = [False] * len(blocks)
    recorded: list[tuple[int, int, Any, int, int]] = []
    for addr, (size, stream) in sorted(segments.items()):
        # The blocks in [addr, addr + size): a slice of the sorted blocks, found by bisection
        # (a scan of every block for every segment was quadratic on long traces).
        first, end = bisect.bisect_left(addrs, addr), bisect.bisect_left(addrs, addr + size)
        recorded.append((addr, size, stream, first, end))
        placed[first:end] = [True] * (end - first)
    # Segments that hold no live block (cached, or emptied by the end) are one shape.
    for empty, run in itertools.groupby(recorded, key=lambda r: r[3] == r[4]):
        rows = list(run)
        for start in range(0, len(rows), _ROWS if empty else viz_rows.BATCH):
            part = rows[start : start + (_ROWS if empty else viz_rows.BATCH)]
            columns = _empty_columns(device, part) if empty else None
            if columns is not None:
                yield viz_rows.appended(_EMPTY, columns, len(part))
                continue
            for one in range(0, len(part), viz_rows.BATCH):
                yield appends(
                    [
                        _segment(device, addr, size, stream, blocks[first:end])
                        for addr, size, stream, first, end in part[one : one + viz_rows.BATCH]
                    ]
                )
    lone = [b for b, inside in zip(blocks, placed, strict=True) if not inside and b[0] is not None]
    yield from _lone(device, lone)


def _empty_columns(
    device: int, rows: list[tuple[int, int, Any, int, int]]
) -> dict[str, np.ndarray] | None:
    """Recorded segments without a live block as columns, or None past 64 bits."""
    streams = [int(stream or 0) for _, _, stream, _, _ in rows]
    try:
        size = np.array([size for _, size, _, _, _ in rows], np.int64)
        return {
            "device": np.full(len(rows), device, np.int64),
            "addr": np.array([addr for addr, _, _, _, _ in rows], np.int64),
            "size": size,
            "zero": np.zeros(len(rows), np.int64),
            "stream": np.array(streams, np.int64),
            "type": np.where(size >= _LARGE_SEGMENT, SLOT["large"], SLOT["small"]).astype(np.uint8),
        }
    except OverflowError:
        return None


def _lone(device: int, lone: list[tuple[Any, tuple[int, Any, Any]]]) -> Iterator[bytes]:
    """Runs of plain lone blocks column by column; the others as dicts."""
    plain = [not frames and type(a) is int and type(s) is int for a, (s, _, frames) in lone]
    start = 0
    for is_plain, run in itertools.groupby(plain):
        blocks = lone[start : start + len(list(run))]
        start += len(blocks)
        for first in range(0, len(blocks), _ROWS):
            batch = blocks[first : first + _ROWS]
            columns = _lone_columns(device, batch) if is_plain else None
            if columns is not None:
                yield viz_rows.appended(_LONE, columns, len(batch))
                continue
            for one in range(0, len(batch), viz_rows.BATCH):
                dicts = [
                    _segment(device, a, v[0], v[1], [(a, v)])
                    for a, v in batch[one : one + viz_rows.BATCH]
                ]
                yield appends(dicts)


def _lone_columns(
    device: int, lone: list[tuple[Any, tuple[int, Any, Any]]]
) -> dict[str, np.ndarray] | None:
    """Plain lone blocks' segments as columns, or None past 64 bits."""
    streams = [int(stream or 0) for _, (_, stream, _) in lone]
    try:
        size = np.array([size for _, (size, _, _) in lone], np.int64)
        return {
            "device": np.full(len(lone), device, np.int64),
            "addr": np.array([addr for addr, _ in lone], np.int64),
            "size": size,
            "stream": np.array(streams, np.int64),
            "type": np.where(size >= _LARGE_SEGMENT, SLOT["large"], SLOT["small"]).astype(np.uint8),
        }
    except OverflowError:
        return None


def _segment(
    device: int, addr: int, size: int, stream: Any, blocks: list[tuple[Any, tuple[int, Any, Any]]]
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    cursor = addr
    for b_addr, (b_size, _, frames) in blocks:
        if b_addr > cursor:
            parts.append(_block(cursor, b_addr - cursor))
        parts.append(_block(b_addr, b_size, frames or ()))
        cursor = b_addr + b_size
    if cursor < addr + size:
        parts.append(_block(cursor, addr + size - cursor))
    active = sum(b_size for _, (b_size, _, _) in blocks)
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


def _block(addr: int, size: int, frames: Any = None) -> dict[str, Any]:
    """An active block, or a gap (``frames`` None) between blocks of a segment."""
    if frames is None:
        return {
            "address": addr,
            "size": size,
            "requested_size": 0,
            "state": "inactive",
            "frames": [],
        }
    return {
        "address": addr,
        "size": size,
        "requested_size": size,
        "state": "active_allocated",
        "frames": list(frames),
    }
