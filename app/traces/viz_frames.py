"""Trace entries with frames written as the C pickler writes them, from a chunk's stacks.

The general path (``memory_viz``) builds a dict an entry and a dict a frame and pickles a
thousand entries at a time (``viz_pickle.appends``); this writes the same bytes from a
table of the chunk's distinct stacks, so an export of a trace recorded with stacks does
not make those objects. What the pickler's memo does to the bytes is followed here:

- every entry dict, frames list, frame dict and string gets the next slot (``BINPUT``
  below 256, ``LONG_BINPUT`` from there), counted from the stream's memo (``viz_pickle``)
  and the batch's list, afresh each batch;
- the frame keys are one object each per block of lines (json shares a block's keys), so
  a batch writes each once, at its first frame, and refers to it after;
- empty and one-character (below U+0100) strings are one object each in CPython, so a
  batch writes each once; any other string is written whole wherever it occurs;
- a free the export adds before a free (``free_requested``) shares its free's list.

A stack of no such short string, once the slots pass 255 and the keys are written, is the
same bytes each time but for its slots, which are consecutive: its bytes are kept as one
integer and the slots added to it (``Stack.template``).
"""

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.traces.viz_pickle import (
    APPEND,
    APPENDS,
    BINGET,
    BINUNICODE,
    EMPTY_DICT,
    EMPTY_LIST,
    MARK,
    MEMO,
    SETITEMS,
    SLOT,
    get,
    int_opcode,
    put,
)

BATCH = 1000  # the pickler's batch of list items and dict items; the export's of entries
FRAME_KEYS = ("filename", "line", "name")
_FIRST = len(MEMO) + 1  # the stream's memo, then the batch's list
_FAR = 2**20  # a slot past 255, where a template is made


def _shared(s: str) -> bool:
    """Whether CPython makes ``s`` one object wherever it occurs (json's too)."""
    return not s or (len(s) == 1 and ord(s) < 256)


@dataclass
class Frame:
    filename: str
    filename_utf8: bytes
    line: int
    line_pickled: bytes
    name: str
    name_utf8: bytes


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")  # as the pickler encodes a str


def frames_of(raw: bytes) -> list[Frame] | None:
    """A stored stack (its JSON, as the event held it) as frames, or None where the
    export cannot write it from the table: not a list of ``{"filename": str, "line":
    int, "name": str}`` with the keys in that order. No frames: an empty list."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if value is None:
        return []
    if type(value) is not list:
        return None
    out = []
    for f in value:
        if type(f) is not dict or tuple(f) != FRAME_KEYS:
            return None
        filename, line, name = f["filename"], f["line"], f["name"]
        if type(filename) is not str or type(line) is not int or type(name) is not str:
            return None
        out.append(Frame(filename, _utf8(filename), line, int_opcode(line), name, _utf8(name)))
    return out


@dataclass
class Batch:
    """The memo of one batch as far as it is written: the next slot, the frame keys'
    slots once written, the shared short strings' slots."""

    next: int = _FIRST
    keys: list[int] = field(default_factory=list)
    shared: dict[str, int] = field(default_factory=dict)

    def string(self, out: bytearray, s: str, utf8: bytes) -> None:
        if _shared(s):
            slot = self.shared.get(s)
            if slot is not None:
                out += get(slot)
                return
            self.shared[s] = self.next
        out += BINUNICODE + struct.pack("<I", len(utf8)) + utf8 + put(self.next)
        self.next += 1

    def key(self, out: bytearray, i: int) -> None:
        if len(self.keys) > i:
            out += get(self.keys[i])
            return
        utf8 = FRAME_KEYS[i].encode()
        out += BINUNICODE + struct.pack("<I", len(utf8)) + utf8 + put(self.next)
        self.keys.append(self.next)
        self.next += 1


class Stack:
    """One of a chunk's distinct stacks, and its template once made."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self.plain = not any(_shared(f.filename) or _shared(f.name) for f in frames)
        self.puts = 1 + 3 * len(frames)  # the list, and each frame's dict and two strings
        self.templates: dict[tuple[int, ...], tuple[int, int, int]] = {}

    def write(self, out: bytearray, batch: Batch) -> None:
        """The frames list, as the pickler writes it with the batch's memo."""
        out += EMPTY_LIST + put(batch.next)
        batch.next += 1
        n = len(self.frames)
        if n > 1:
            out += MARK
        for j, f in enumerate(self.frames):
            if n > 1 and j and not j % BATCH:
                out += APPENDS + MARK
            out += EMPTY_DICT + put(batch.next) + MARK
            batch.next += 1
            batch.key(out, 0)
            batch.string(out, f.filename, f.filename_utf8)
            batch.key(out, 1)
            out += f.line_pickled
            batch.key(out, 2)
            batch.string(out, f.name, f.name_utf8)
            out += SETITEMS
        out += APPEND if n == 1 else APPENDS if n else b""

    def fast(self, batch: Batch) -> bool:
        return self.plain and batch.next >= 256 and len(batch.keys) == 3

    def template(self, batch: Batch) -> bytes:
        """What ``write`` writes where ``fast``: its bytes as an integer, plus the slot
        times a constant (one at the low byte of each slot)."""
        keys = tuple(batch.keys)
        made = self.templates.get(keys)
        if made is None:
            at = [bytearray(), bytearray()]
            for out, slot in zip(at, (_FAR, _FAR + 1), strict=True):
                self.write(out, Batch(slot, list(keys)))
            low, high = (int.from_bytes(b, "little") for b in at)
            step = high - low
            made = self.templates[keys] = (low - _FAR * step, step, len(at[0]))
        base, step, size = made
        data = (base + batch.next * step).to_bytes(size, "little")
        batch.next += self.puts
        return data


# An entry up to its values: ``{"action": <memo>, "addr": <int>, ..., "frames": ...}``.
_ACTION = MARK + get(SLOT["action"]) + BINGET
_ADDR, _SIZE, _STREAM = get(SLOT["addr"]), get(SLOT["size"]), get(SLOT["stream"])
_TIME, _FRAMES = get(SLOT["time_us"]), get(SLOT["frames"])

Entry = tuple[int, int, int, int, int, "Stack | None", bool]
"""An entry: its action's memo slot, addr, size, stream, time, frames, and whether it is
a free that shares the list of the free_requested written before it."""


def batch(entries: Sequence[Entry]) -> bytes:
    """``entries`` as ``viz_pickle.appends`` writes them as dicts."""
    out = bytearray()
    memo = Batch()
    n = len(entries)
    if n > 1:
        out += MARK
    shared_list = 0
    for i, (action, addr, size, stream, time, stack, second) in enumerate(entries):
        if n > 1 and i and not i % BATCH:
            out += APPENDS + MARK
        out += EMPTY_DICT + put(memo.next) + _ACTION + bytes((action,))
        memo.next += 1
        out += _ADDR + int_opcode(addr) + _SIZE + int_opcode(size)
        out += _STREAM + int_opcode(stream) + _TIME + int_opcode(time) + _FRAMES
        if second:
            out += get(shared_list)
        else:
            shared_list = memo.next
            if stack is None:
                out += EMPTY_LIST + put(memo.next)
                memo.next += 1
            elif stack.fast(memo):
                out += stack.template(memo)
            else:
                stack.write(out, memo)
        out += SETITEMS
    out += APPEND if n == 1 else APPENDS
    return bytes(out)
