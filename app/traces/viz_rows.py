"""Many dicts of one shape as pickle opcodes, written column by column.

A shape (``Spec``) is a sequence of constant opcodes and holes: an int hole takes each
row's value of a numpy column, in the narrowest of pickle's int opcodes that holds the
whole column; a byte hole takes one raw byte (a memo slot after a BINGET). Every row is
then the same bytes with its values in the same places, so n rows are one array filled a
column at a time instead of n dicts built and pickled one by one.
"""

import functools
from collections.abc import Mapping

import numpy as np

from app.traces.viz_pickle import APPENDS, LONG1, MARK

BATCH = 1000  # rows per MARK ... APPENDS: a bounded stack in the unpickler
Hole = tuple[str, str]  # ("int" | "byte", column name)
Spec = tuple[bytes | Hole, ...]

# How pickle writes an int, narrowest first: opcode, bytes, the range it holds.
_INTS = (
    (b"K", 1, 0, 2**8),
    (b"M", 2, 0, 2**16),
    (b"J", 4, -(2**31), 2**31),
    *((LONG1 + bytes([n]), n, -(2 ** (8 * n - 1)), 2 ** (8 * n - 1)) for n in (5, 6, 7, 8)),
)


def _int_opcode(column: np.ndarray) -> tuple[bytes, int]:
    """The narrowest of pickle's int opcodes that holds every value of ``column``."""
    low, high = int(column.min()), int(column.max())
    for opcode, width, lowest, past in _INTS:
        if lowest <= low and high < past:
            return opcode, width
    raise AssertionError("an int64 column fits LONG1 of 8 bytes")


@functools.lru_cache(maxsize=64)
def _layout(
    spec: Spec, opcodes: tuple[tuple[bytes, int], ...]
) -> tuple[np.ndarray, tuple[tuple[str, int, int], ...]]:
    """The row's template and each hole's column, place and width, for the int opcodes
    chosen (one per int hole, in order)."""
    out = bytearray()
    holes: list[tuple[str, int, int]] = []
    chosen = iter(opcodes)
    for part in spec:
        if isinstance(part, bytes):
            out += part
            continue
        kind, name = part
        width = 1
        if kind == "int":
            opcode, width = next(chosen)
            out += opcode
        holes.append((name, len(out), width))
        out += bytes(width)
    return np.frombuffer(bytes(out), np.uint8), tuple(holes)


# Holes as numpy writes them at once, by width: pickle's K, M, J and 8-byte LONG1 are
# these little-endian ints; 5 to 7 bytes (LONG1 only) are copied byte by byte.
_HOLE_DTYPES = {1: "u1", 2: "<u2", 4: "<i4", 8: "<i8"}


def appended(spec: Spec, columns: Mapping[str, np.ndarray], n: int) -> bytes:
    """``n`` rows of ``spec`` as opcodes that append them to the list on the unpickler's
    stack, a thousand per MARK ... APPENDS. Int columns are int64; byte columns uint8.

    The rows are written in place inside the framed batches (one array, copied out once
    by ``tobytes``), each hole as a field of a structured view of the rows."""
    if not n:
        return b""
    ints = [p[1] for p in spec if not isinstance(p, bytes) and p[0] == "int"]
    template, holes = _layout(spec, tuple(_int_opcode(columns[name]) for name in ints))
    width = len(template)
    full, rest = divmod(n, BATCH)
    batches = full + (rest > 0)
    framed = np.empty((batches, BATCH * width + 2), np.uint8)
    framed[:, 0], framed[:, -1] = MARK[0], APPENDS[0]
    cells = framed[:, 1:-1].reshape(batches, BATCH, width)  # a view: rows inside batches
    cells[:] = template
    parts = [(cells[:full], slice(0, full * BATCH))]
    if rest:
        parts.append((cells[full:, :rest], slice(full * BATCH, n)))
    for name, at, size in holes:
        column = columns[name]
        dtype = _HOLE_DTYPES.get(size)
        for rows, taken in parts:
            values = column[taken].reshape(rows.shape[:2])
            if dtype is not None:
                field = np.dtype(
                    {"names": ["v"], "formats": [dtype], "offsets": [at], "itemsize": width}
                )
                rows.view(field)["v"][..., 0] = values
            else:
                as_bytes = values.astype("<i8").view(np.uint8).reshape(*rows.shape[:2], 8)
                rows[..., at : at + size] = as_bytes[..., :size]
    data = framed.reshape(-1)
    if rest:  # the last batch ends after its rows
        end = full * (BATCH * width + 2) + 1 + rest * width
        data[end] = APPENDS[0]
        data = data[: end + 1]
    return data.tobytes()
