"""The framing of the memory_viz pickle, written piece by piece, and the memo it shares.

The export is one pickle (protocol 2) streamed in pieces: the outer dict and lists are
opcodes written here, and the trace's entries are spliced in, either pickled by the C
pickler a thousand at a time (``appends``) or written as fixed-layout records
(``viz_records``). Both refer to the entries' keys and actions through one memo set up
once at the start (``PRELUDE``), so a key is written once a stream, not once an entry, and
the unpickled entries share their key strings.

Only opcodes that PyTorch's own viewer (``MemoryViz.js``, which has its own unpickler)
reads are used: it has no POP, so the prelude leaves no value behind by setting the outer
dict's first key to each memo string in turn; the trace list replaces that value at the
end.
"""

import io
import pickle
import struct
import sys
from typing import Any

from vramlab.contract import MEMORY_VIZ_ACTIONS

PROTO2 = b"\x80\x02"
EMPTY_DICT = b"}"
EMPTY_LIST = b"]"
MARK = b"("
APPENDS = b"e"
APPEND = b"a"
SETITEM = b"s"
SETITEMS = b"u"
STOP = b"."
BINGET = b"h"
BINPUT = b"q"
LONG_BINGET = b"j"
LONG_BINPUT = b"r"
BINUNICODE = b"X"
LONG1 = b"\x8a"
TUPLE2 = b"\x86"
NEWFALSE = b"\x89"

# An entry's keys, in the order the export writes them.
KEYS = tuple(sys.intern(k) for k in ("action", "addr", "size", "stream", "time_us", "frames"))
ACTIONS = tuple(sys.intern(a) for a in MEMORY_VIZ_ACTIONS)
# A segment's and its blocks' keys and words, besides those above.
SEGMENT_WORDS = tuple(
    sys.intern(w)
    for w in (
        *("device", "address", "total_size", "allocated_size", "active_size"),
        *("requested_size", "segment_type", "segment_pool_id", "is_expandable", "blocks"),
        *("state", "large", "small", "active_allocated", "inactive"),
    )
)
# Memo slot of each string: the outer dict's first key, then the rest.
TRACES_KEY = sys.intern("device_traces")
MEMO = (TRACES_KEY, *KEYS, *ACTIONS, *SEGMENT_WORDS)
SLOT = {s: i for i, s in enumerate(MEMO)}
assert len(MEMO) < 256  # BINGET's one-byte index


def _string(s: str) -> bytes:
    data = s.encode()
    return BINUNICODE + struct.pack("<I", len(data)) + data


def put(slot: int) -> bytes:
    """Memo ``slot`` set, as the pickler writes it (``LONG_BINPUT`` past 255)."""
    if slot < 256:
        return BINPUT + bytes((slot,))
    return LONG_BINPUT + slot.to_bytes(4, "little")


def get(slot: int) -> bytes:
    """Memo ``slot`` read, as the pickler writes it (``LONG_BINGET`` past 255)."""
    if slot < 256:
        return BINGET + bytes((slot,))
    return LONG_BINGET + slot.to_bytes(4, "little")


# The outer dict with every memo string set up: ``{"device_traces": <last string>}``
# until the trace list is set under the same key at the end.
PRELUDE = (
    PROTO2
    + EMPTY_DICT
    + MARK
    + b"".join((get(0) if i > 1 else b"") + _string(s) + put(i) for i, s in enumerate(MEMO))
    + SETITEMS
)
_MEMO_TABLE = {id(s): (i, s) for i, s in enumerate(MEMO)}


def open_traces(slot: int) -> bytes:
    """Up to the first entry: the prelude, then ``"device_traces": [[], ..., [`` with
    ``slot`` empty lists before the trace's."""
    return PRELUDE + get(0) + EMPTY_LIST + (EMPTY_LIST + APPEND) * slot + EMPTY_LIST


# After the last entry: the trace list closed and set, and the segments list opened.
CLOSE_TRACES = APPEND + SETITEM + _string("segments") + EMPTY_LIST
# After the last segment: ``"allocator_settings": {}`` and the end. Keys after the trace
# are written whole, so the memo that appends() relies on is never overwritten.
END = SETITEM + _string("allocator_settings") + EMPTY_DICT + SETITEM + STOP


def int_opcode(value: int) -> bytes:
    """``value`` as the C pickler writes an int (protocol 2): the narrowest opcode that
    holds it, a long's bytes as few as hold it in two's complement."""
    if 0 <= value < 256:
        return b"K" + bytes((value,))
    if 0 <= value < 65536:
        return b"M" + value.to_bytes(2, "little")
    if -(2**31) <= value < 2**31:
        return b"J" + value.to_bytes(4, "little", signed=True)
    width = (value.bit_length() >> 3) + 1
    data = value.to_bytes(width, "little", signed=True)
    if value < 0 and width > 1 and data[-1] == 0xFF and data[-2] & 0x80:
        data = data[:-1]
    return LONG1 + bytes((len(data),)) + data


def appends(entries: list[dict[str, Any]]) -> bytes:
    """``entries`` (trace entries or segments) pickled in one call, as opcodes that
    append them to the list on the unpickler's stack (MARK ... APPENDS, or the item and
    APPEND for one entry).

    The pickler starts with the stream's memo: keys and actions (the interned strings
    above) are referred to, and what it memoizes itself goes in slots after them.
    """
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=2)
    pickler.memo = _MEMO_TABLE
    pickler.dump(entries)
    data = out.getvalue()
    head = PROTO2 + EMPTY_LIST + put(len(MEMO))
    if not data.startswith(head) or not data.endswith(STOP):
        raise RuntimeError("unexpected pickle framing for a list")  # a bug: never the client's
    return data[len(head) : -1]
