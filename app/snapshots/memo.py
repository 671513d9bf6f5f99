"""What the stream reader's C unpickler keeps of the trace entries it has handed on, let
go of every so often.

PyTorch's pickle (protocol 4) memoizes every dict, list and string it writes, so the
unpickler's memo would keep each entry's dict, its frames list and its own strings to
the end of the file: about 230 bytes an entry, three times the file for dense entries.
A memo slot cannot be emptied (``MEMOIZE`` numbers the next slot by how many are full),
but one can be put again (``LONG_BINPUT``) without changing that count. So between two
batches, once ``EVERY`` entries have gone by, the reader reads back the slots filled
since the last time (``Memo.clean``) and puts, in place of each object that only the
memo still holds:

- for a frames list handed on (shrunk to its ``StackRef``): a complex number, its
  identity token plus its stack id times 1j, which no pickle can make without a global:
  a later entry that refers to the list again (PyTorch's ``context="alloc"``) gets its
  stack and identity from it (``entries.Sink.batch``);
- for an empty list (an entry's frames, none): ``EMPTY``, which reads as no frames too;
- for anything else (an entry's dict, its own strings): ``DROPPED``, one object for all.
  A later reference to one is caught where it could change what is read (an entry, its
  fields and frames: ``entries.Sink.batch``; what follows the trace: ``placeholders``)
  and the file is read whole instead. Strings that could be a key (identifiers) are
  kept, so the keys first written in an entry never are.

The slots filled since the last time end where the memo ends: found by reading single
slots (a missing one fails on its own, the last opcode it was given: ``Feed.failed``).
"""

import _pickle
import operator
import pickle
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from itertools import compress, repeat
from sys import getrefcount
from typing import Any

from app.snapshots.feed import Feed

EVERY = 100_000  # entries between two cleanings
_INDEX = struct.Struct("<I")
_TOKEN = operator.attrgetter("token")
_STACK = operator.attrgetter("stack")


class StackRef:
    """What a frames list the memo holds keeps once handed on: its stack's id and its
    identity token."""

    __slots__ = ("stack", "token")

    def __init__(self, stack: int, token: int) -> None:
        self.stack = stack
        self.token = token


class _Dropped:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<let go of>"


DROPPED = _Dropped()


class _Empty:
    """An empty list let go of: no frames, as the list was."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<an empty list let go of>"


EMPTY = _Empty()


class _Probe:
    """What the slots read back are handed to (``APPENDS``)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def extend(self, items: list[Any]) -> None:
        self.items = items


class Memo:
    """The memo of ``unpickler`` (reading from ``feed``), from slot ``start`` on."""

    def __init__(self, unpickler: pickle.Unpickler, feed: Feed, key: str, start: int) -> None:
        self.unpickler = unpickler
        self.run = unpickler.load
        self.persistent_load = unpickler.persistent_load
        self.feed = feed
        self.key = key
        self.lo = start  # slots below were looked at
        self.probe = _Probe()
        self.tokens: list[complex] = []
        self.used = False

    def named(self, name: str) -> Any:
        """The objects the cleaning's programs refer to by persistent id."""
        if name == "p":
            return self.probe
        if name == "D":
            return DROPPED
        if name == "E":
            return EMPTY
        raise KeyError(name)

    def _exists(self, i: int) -> bool:
        self.feed.inject(b"j" + _INDEX.pack(i), b"0N.")
        try:
            self.run()
        except pickle.UnpicklingError:
            self.feed.failed()
            return False
        return True

    def _end(self) -> int:
        """The first missing slot from ``lo`` on (the memo's slots are filled in order)."""
        ok = self.lo - 1
        bad = self.lo
        step = 1
        while self._exists(bad):
            ok, bad = bad, bad + step
            step *= 2
        while bad - ok > 1:
            mid = (ok + bad) // 2
            if self._exists(mid):
                ok = mid
            else:
                bad = mid
        return bad

    def clean(self) -> None:
        """Let go of what only the memo holds among the slots filled since last time."""
        lo, hi = self.lo, self._end()
        if hi <= lo:
            return
        key, feed = self.key, self.feed
        slots = range(lo, hi)
        feed.inject(f"P{key}p\n(".encode() + _program(b"j", slots) + b"e0N.")
        self.run()
        objects = self.probe.items
        self.probe.items = []
        # What nothing else holds: the memo, the list, map's reference alone.
        alone = list(map((3).__ge__, map(getrefcount, objects)))
        held = list(compress(objects, alone))
        where = list(compress(slots, alone))
        del objects
        kinds = list(map(type, held))
        lists = list(map(operator.is_, kinds, repeat(list)))
        strings = list(map(operator.is_, kinds, repeat(str)))
        others = map(operator.not_, map(operator.or_, lists, strings))
        dropped = list(compress(where, others))
        # Strings but those that could be a key.
        text = compress(held, strings)
        dropped += compress(
            compress(where, strings), map(operator.not_, map(str.isidentifier, text))
        )
        refs: list[StackRef] = []
        tokens: list[int] = []
        empty: list[int] = []
        obj: Any = None
        for slot, obj in zip(compress(where, lists), compress(held, lists), strict=True):
            if len(obj) == 1 and type(obj[0]) is StackRef:
                refs.append(obj[0])
                tokens.append(slot)
            elif not obj:
                empty.append(slot)
            else:
                dropped.append(slot)
        del held, obj
        feed.inject(
            f"P{key}D\n".encode()
            + _program(b"r", dropped)
            + f"0P{key}E\n".encode()
            + _program(b"r", empty)
            + b"0N."
        )
        self.run()
        if tokens:
            # Each list's token pushed by BINPERSID of its number, looked up in C.
            self.tokens = list(map(complex, map(_TOKEN, refs), map(_STACK, refs)))
            del refs
            feed.inject(_tokens(tokens) + b"N.")
            loader = _pickle.Unpickler.__dict__["persistent_load"]
            loader.__set__(self.unpickler, self.tokens.__getitem__)
            try:
                self.run()
            finally:
                loader.__set__(self.unpickler, self.persistent_load)
            self.tokens = []
        self.lo = hi
        self.used = True


def _ints(values: Iterable[int]) -> bytes:
    """4-byte little-endian unsigned integers."""
    raw = array("I", values)
    if raw.itemsize != 4:
        return b"".join(map(_INDEX.pack, values))
    if sys.byteorder != "little":
        raw.byteswap()
    return raw.tobytes()


def _program(op: bytes, slots: Sequence[int]) -> bytes:
    """``op`` (LONG_BINGET or LONG_BINPUT) of each slot."""
    n = len(slots)
    out = bytearray(5 * n)
    out[0::5] = op * n
    raw = _ints(slots)
    for k in range(4):
        out[1 + k :: 5] = raw[k::4]
    return bytes(out)


def _tokens(slots: list[int]) -> bytes:
    """For each slot: BININT its number, BINPERSID, LONG_BINPUT the slot, POP."""
    n = len(slots)
    out = bytearray(12 * n)
    out[0::12] = b"J" * n
    numbers = _ints(range(n))
    where = _ints(slots)
    for k in range(4):
        out[1 + k :: 12] = numbers[k::4]
        out[7 + k :: 12] = where[k::4]
    out[5::12] = b"Q" * n
    out[6::12] = b"r" * n
    out[11::12] = b"0" * n
    return bytes(out)


def handed_on(values: Iterable[Any], recent: list[Any]) -> bool:
    """Whether anything in ``values`` (nested in dicts, lists, tuples) is what the stream
    reader left of what it handed on: a placeholder of the cleaning, a frames list shrunk
    to its ``StackRef``, or one of the ``recent`` entries (emptied): something read after
    the trace refers back to the trace."""
    seen: set[int] = set()
    emptied: set[int] | None = None
    todo = list(values)
    while todo:
        obj = todo.pop()
        kind = type(obj)
        if obj is DROPPED or obj is EMPTY or kind is complex or kind is StackRef:
            return True
        if kind in (dict, list, tuple) and id(obj) not in seen:
            seen.add(id(obj))
            if kind is dict:
                if not obj:
                    emptied = {id(e) for e in recent} if emptied is None else emptied
                    if id(obj) in emptied:
                        return True
                todo.extend(obj.keys())
                todo.extend(obj.values())
            else:
                todo.extend(obj)
    return False
