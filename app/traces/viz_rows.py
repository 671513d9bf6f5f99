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


def appended(spec: Spec, columns: Mapping[str, np.ndarray], n: int) -> bytes:
    """``n`` rows of ``spec`` as opcodes that append them to the list on the unpickler's
    stack, a thousand per MARK ... APPENDS. Int columns are int64; byte columns uint8."""
    if not n:
        return b""
    ints = [p[1] for p in spec if not isinstance(p, bytes) and p[0] == "int"]
    template, holes = _layout(spec, tuple(_int_opcode(columns[name]) for name in ints))
    rows = np.empty((n, len(template)), np.uint8)
    rows[:] = template
    for name, at, width in holes:
        column = columns[name]
        if column.dtype == np.uint8:
            rows[:, at] = column
        else:
            rows[:, at : at + width] = column.astype("<i8").view(np.uint8).reshape(n, 8)[:, :width]
    data = rows.tobytes()
    step = BATCH * len(template)
    return b"".join(MARK + data[i : i + step] + APPENDS for i in range(0, len(data), step))
