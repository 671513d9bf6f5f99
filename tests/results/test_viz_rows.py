"""Rows written column by column (``viz_rows.appended``): every width of pickle's int
opcodes, and batches of a thousand that end anywhere, unpickle to the rows' values."""

import pickle

import numpy as np
import pytest

from app.traces import viz_rows
from app.traces.viz_pickle import EMPTY_LIST, MARK, PROTO2, STOP

TUPLE = b"t"
# A row is the tuple (x, y, b): two int holes, then a byte hole read as K's operand.
SPEC: viz_rows.Spec = (MARK, ("int", "x"), ("int", "y"), b"K", ("byte", "b"), TUPLE)

# Ranges that take each of pickle's int opcodes: K, M, J, then LONG1 of 5 to 8 bytes.
RANGES = [
    (0, 2**8),
    (0, 2**16),
    (-(2**31), 2**31),
    (-(2**39), 2**39),
    (-(2**47), 2**47),
    (-(2**55), 2**55),
    (-(2**63), 2**63),
]


@pytest.mark.parametrize("n", [1, 999, 1000, 1001, 2000, 2345])
@pytest.mark.parametrize("low, past", RANGES)
def test_rows_unpickle_to_their_values(n: int, low: int, past: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.integers(low, past, n, dtype=np.int64, endpoint=False)
    x[0], x[-1] = low, past - 1  # the range's ends: the widest values of the opcode
    y = np.arange(n, dtype=np.int64)
    b = rng.integers(0, 256, n, dtype=np.uint8)
    data = viz_rows.appended(SPEC, {"x": x, "y": y, "b": b}, n)
    rows = pickle.loads(PROTO2 + EMPTY_LIST + data + STOP)
    assert rows == list(zip(x.tolist(), y.tolist(), b.tolist(), strict=True))
    # A MARK ... APPENDS per thousand rows, the last one ending after its rows.
    batches = -(-n // viz_rows.BATCH)
    assert data.count(b"e") >= batches
    assert data.startswith(MARK) and data.endswith(b"e")


def test_no_rows_write_nothing() -> None:
    empty = np.zeros(0, np.int64)
    assert viz_rows.appended(SPEC, {"x": empty, "y": empty, "b": empty.astype(np.uint8)}, 0) == b""
