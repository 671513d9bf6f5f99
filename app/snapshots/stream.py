"""Reading a memory snapshot's pickle with its trace handed on batch by batch, so that the
trace is never held whole.

PyTorch's snapshot is a dict whose ``device_traces`` holds one list per device, each built
by ``APPENDS`` of up to 1000 entries at a time. The file is read in two parts:

- up to the first device's list, opcode by opcode here (the top dict, the segments: a
  small part of the file), so the list is found exactly where it is made;
- from there on by the C unpickler (``safe_pickle.NoGlobalsUnpickler``: no global is ever
  resolved), reading the file as it goes (``Feed``), with each device's list replaced by
  a ``Collector``: ``APPENDS`` hands it a batch of entries, which it gives to the sink
  (``entries.Sink``) and then empties (a dict cleared, a frames list shrunk to a
  ``StackRef`` that keeps its stack, the list itself its identity: a free recorded with
  PyTorch's ``context="alloc"`` refers back to its block's very list). The unpickler gets
  the file a buffer at a time (``peek``: its opcodes are read in C), except where a
  device's list may begin (a list's ``APPENDS`` or ``APPEND`` then ``EMPTY_LIST``): those
  bytes it gets exactly as each opcode asks for them, so where it stopped after a batch
  is known. It is stopped there, and the stack it had (the top dict, the keys before
  ``device_traces``, the lists) is given back to it by persistent ids that only this
  reader knows, with a collector for the next device's list.

Anything this reader does not read exactly as the whole-file unpickler would (a global,
protocol 0 or 1, a reference to an entry already handed on, a shape it does not know)
raises ``Unsupported``; the caller then reads the file whole with ``safe_pickle``, which
refuses or reads it as before. The two readers never disagree: one only needs less memory.
"""

import os
import pickle
import struct
from collections.abc import Callable
from typing import IO, Any, Protocol

from app.snapshots import memo as memo_
from app.snapshots import safe_pickle
from app.snapshots.feed import Feed

WINDOW = 32 << 20  # the part before the trace must fit in this many bytes


class Unsupported(Exception):
    """The stream holds something this reader does not read exactly as the whole-file
    unpickler would; read the file whole instead."""


class Sink(Protocol):
    def batch(self, device: int, items: list[Any], outside: dict[int, Any]) -> None: ...


class _Pause(Exception):
    """Stop the unpickler after a batch: the next opcode makes the next device's list
    (``new_list``), or the next batch begins and the memo is to be cleaned."""

    def __init__(self, new_list: bool) -> None:
        self.new_list = new_list


class Collector:
    """Stands for one device's trace list: takes its batches of entries."""

    def __init__(self, reader: "Reader", device: int) -> None:
        self.reader = reader
        self.device = device

    def extend(self, items: list[Any]) -> None:
        self.reader.take(self.device, items)


class Deframer:
    """The pickle's opcodes without its FRAME opcodes (protocol 4's hints for readers that
    read a frame at a time): the C unpickler then reads exactly what each opcode needs,
    so where it stopped is where the next read begins. Only strings and bytes too large
    for a frame come between frames."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.raw = b""
        self.at = 0
        self.left = -1  # bytes left in the current frame; -1: not framed
        self.started = False

    def _raw(self, n: int) -> bytes:
        while len(self.raw) - self.at < n:
            more = self.f.read(max(n, 1 << 20))
            if not more:
                break
            self.raw = self.raw[self.at :] + more
            self.at = 0
        out = self.raw[self.at : self.at + n]
        self.at += len(out)
        return out

    def read(self, n: int) -> bytes:
        out = bytearray()
        if not self.started:
            self.started = True
            head = self._raw(2)
            out += head
            if head[:1] != b"\x80":
                self.left = -2  # not framed at all
        while len(out) < n:
            if self.left == -2:
                out += self._raw(n - len(out))
                break
            if self.left > 0:
                part = self._raw(min(self.left, n - len(out)))
                if not part:
                    break
                out += part
                self.left -= len(part)
                continue
            op = self._raw(1)
            if not op:
                break
            if op == b"\x95":
                (self.left,) = struct.unpack("<Q", self._raw(8))
                continue
            if self.left == -1 and not out[2:]:
                self.left = -2  # no frame after PROTO: read as it is
                out += op
                continue
            if op[0] not in _LARGE:  # between frames, only what did not fit in one
                raise Unsupported(f"opcode {op!r} between frames")
            size, fmt = _LARGE[op[0]]
            header = self._raw(size)
            (length,) = struct.unpack(fmt, header)
            out += op + header
            self.left = length  # its payload, read as if a frame
        return bytes(out)


class _Unpickler(safe_pickle.NoGlobalsUnpickler):
    def __init__(self, f: Feed, objects: list[Any], key: str, memo: list[Any]) -> None:
        super().__init__(f)
        self.objects = objects
        self.memo_values = memo
        self.key = key
        self.cleaner: memo_.Memo | None = None

    def persistent_load(self, pid: Any) -> Any:
        """Our own ids (a random key the file cannot know): the stack and the memo."""
        if type(pid) is str and pid.startswith(self.key):
            n = pid[len(self.key) :]
            if n[:1] == "m":
                return self.memo_values[int(n[1:])]
            if n in ("p", "D", "E") and self.cleaner is not None:
                return self.cleaner.named(n)
            return self.objects[int(n)]
        return super().persistent_load(pid)


class Reader:
    """One pass over a pickle file; ``read()`` returns its top-level dict, whose
    ``device_traces`` lists hold no entries (they went to the sink)."""

    def __init__(self, f: IO[bytes], sink: Sink) -> None:
        self.f = f
        self.sink = sink
        self.memo: dict[int, Any] = {}
        self.traces: list[Any] | None = None
        self.traces_at = -1  # where the device_traces list is on the stack
        # Lists memoized before the trace: kept alive, so their ids stay theirs.
        self.outside: dict[int, Any] = {}
        self.feed: Feed | None = None
        self.since = 0  # entries handed on since the memo was last cleaned
        self.recent: list[Any] = []  # and those entries

    def read(self) -> dict[Any, Any]:
        try:
            return self._read()
        except (IndexError, KeyError, struct.error, ValueError, OverflowError, TypeError) as exc:
            raise Unsupported(f"{type(exc).__name__}: {exc}") from None

    # Part one: opcode by opcode, up to the first trace list. ------------------------
    def _read(self) -> dict[Any, Any]:
        source = Deframer(self.f)
        buf = source.read(WINDOW)
        i = 0
        stack: list[Any] = []
        marks: list[int] = []
        memo = self.memo
        count = 0
        unpack_from = struct.unpack_from
        if buf[0] == 0x80:  # PROTO
            if buf[1] < 2:
                raise Unsupported("protocol 0 or 1")
            i = 2
        if buf[i] == 0x95:  # FRAME
            i += 9
        if buf[i] != 0x7D:  # EMPTY_DICT
            raise Unsupported("the pickle is not a dict")
        top: dict[Any, Any] = {}
        stack.append(top)
        i += 1
        while True:
            if i >= len(buf) - 16 and len(buf) >= WINDOW:
                raise Unsupported("the part before the trace is longer than a window")
            op = buf[i]
            i += 1
            value: Any
            if op == 0x94 or op == 0x71 or op == 0x72:  # MEMOIZE, BINPUT, LONG_BINPUT
                if op == 0x94:
                    slot = count
                elif op == 0x71:
                    slot = buf[i]
                    i += 1
                else:
                    (slot,) = unpack_from("<I", buf, i)
                    i += 4
                value = stack[-1]
                if slot not in memo:
                    count += 1
                memo[slot] = value
                if type(value) is list:
                    self.outside[id(value)] = value
            elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                if op == 0x68:
                    slot = buf[i]
                    i += 1
                else:
                    (slot,) = unpack_from("<I", buf, i)
                    i += 4
                stack.append(memo[slot])
            elif op == 0x28:  # MARK
                marks.append(len(stack))
            elif op in _STRINGS:
                size, fmt = _STRINGS[op]
                (n,) = unpack_from(fmt, buf, i)
                i += size
                if i + n > len(buf):
                    raise Unsupported("the part before the trace is longer than a window")
                data = buf[i : i + n]
                stack.append(data if op in _BYTES else data.decode("utf-8", "surrogatepass"))
                i += n
            elif op in _FIXED:
                size, fmt = _FIXED[op]
                stack.append(unpack_from(fmt, buf, i)[0])
                i += size
            elif op == 0x8A:  # LONG1
                n = buf[i]
                stack.append(int.from_bytes(buf[i + 1 : i + 1 + n], "little", signed=True))
                i += 1 + n
            elif op in _CONSTANTS:
                stack.append(_CONSTANTS[op]())
            elif op == 0x5D:  # EMPTY_LIST
                if self.traces is not None and (
                    len(stack) == self.traces_at + 1 or (marks and marks[-1] == self.traces_at + 1)
                ):
                    # The first device's list: from here on, the C unpickler.
                    return self._rest(stack, marks, source, buf[i:])
                new: list[Any] = []
                if (
                    self.traces is None
                    and type(stack[-1]) is str
                    and stack[-1] == "device_traces"
                    and ((marks == [1] and len(stack) % 2 == 0) or (not marks and len(stack) == 2))
                ):
                    self.traces = new
                    self.traces_at = len(stack)
                stack.append(new)
            elif op == 0x75 or op == 0x73:  # SETITEMS, SETITEM
                k = marks.pop() if op == 0x75 else len(stack) - 2
                target = stack[k - 1]
                if type(target) is not dict:
                    raise Unsupported("SETITEMS on something not a dict")
                items = stack[k:]
                del stack[k:]
                target.update(zip(items[0::2], items[1::2], strict=True))
            elif op == 0x65 or op == 0x61:  # APPENDS, APPEND
                k = marks.pop() if op == 0x65 else len(stack) - 1
                items = stack[k:]
                del stack[k:]
                if type(stack[-1]) is not list:
                    raise Unsupported("APPENDS on something not a list")
                stack[-1].extend(items)
            elif op == 0x74 or op in _TUPLES:  # TUPLE, TUPLE1..3
                k = marks.pop() if op == 0x74 else len(stack) - _TUPLES[op]
                value = tuple(stack[k:])
                del stack[k:]
                stack.append(value)
            elif op == 0x95:  # FRAME
                i += 8
            elif op == 0x2E:  # STOP: a snapshot without a trace list
                if stack[-1] is not top:
                    raise Unsupported("the pickle's value is not its first dict")
                return top
            else:
                raise Unsupported(f"opcode {bytes([op])!r} before the trace")

    # Part two: the C unpickler, to the end. -----------------------------------------
    def _rest(
        self, stack: list[Any], marks: list[int], source: Deframer, tail: bytes
    ) -> dict[Any, Any]:
        """The rest of the file (``tail``, then ``source``), from just past the first trace
        list's EMPTY_LIST. ``stack`` and ``marks``: the stack then, without that list."""
        top = stack[0]
        collectors = [Collector(self, 0)]
        objects = [*stack, collectors[0]]
        key = f"vramlab-{os.urandom(8).hex()}-"
        feed = Feed(source)
        self.feed = feed
        # The memo as the first part left it (the same slots, the same count): put by
        # opcodes, as the unpickler's memo setter loses a dict's values (CPython 3.11).
        values = list(self.memo.values())
        unpickler = _Unpickler(feed, [], key, values)
        feed.inject(
            b"".join(
                f"P{key}m{n}\n".encode() + b"r" + struct.pack("<I", slot) + b"0"
                for n, slot in enumerate(self.memo)
            )
            + b"N."
        )
        unpickler.load()
        unpickler.objects = objects
        unpickler.memo_values = []
        cleaner = memo_.Memo(unpickler, feed, key, len(self.memo))
        unpickler.cleaner = cleaner
        self.memo = {}
        feed.start(tail)
        while True:
            prelude = bytearray()
            at_mark = set(marks)
            for n in range(len(objects)):
                if n in at_mark:
                    prelude += b"("
                prelude += f"P{key}{n}\n".encode()
            head = feed.ahead(16)
            put = _PUTS.get(head[0], 0) if head else 0
            try:
                if head[put : put + 1] == b"]":
                    # The list just made stays empty: the next device's list comes next.
                    feed.skip(put + 1)
                    if put:
                        feed.inject(bytes(prelude) + head[:put] + b"N.")
                        unpickler.load()  # memoizes the collector, as the list would have been
                    collectors.append(Collector(self, len(collectors)))
                    objects.append(collectors[-1])
                    continue
                feed.inject(bytes(prelude))
                try:
                    result = unpickler.load()
                except _Pause as pause:
                    if pause.new_list:
                        # The next device's list: a collector of its own in its place.
                        feed.skip(1)
                        collectors.append(Collector(self, len(collectors)))
                        objects.append(collectors[-1])
                    else:
                        self.recent = []
                        cleaner.clean()
                        feed.want = False
                        self.since = 0
                    continue
            except (EOFError, pickle.UnpicklingError) as exc:
                raise Unsupported(f"past the stream: {exc}") from None
            break
        traces = self.traces
        if (
            result is not top
            or top.get("device_traces") is not traces
            or traces is None
            or len(traces) != len(collectors)
            or any(a is not b for a, b in zip(traces, collectors, strict=True))
        ):
            raise Unsupported("device_traces is not where it was built")
        before = {id(o) for o in objects}  # made before the trace
        after = [o for o in (*top, *top.values()) if id(o) not in before]
        if memo_.handed_on(after, self.recent):
            raise Unsupported("what follows the trace refers back to an entry handed on")
        self.recent = []
        traces[:] = [[] for _ in collectors]
        return top

    def take(self, device: int, items: list[Any]) -> None:
        """A batch for ``device``'s list: to the sink; then stop if the next device's list
        comes next (``EMPTY_LIST``), or, once ``memo.EVERY`` entries have gone by, the next
        batch (``MARK``), to clean the memo. Both are only ever seen where the feed is
        ``exact``."""
        self.recent += items
        self.sink.batch(device, items, self.outside)
        feed = self.feed
        assert feed is not None
        self.since += len(items)
        if self.since >= memo_.EVERY:
            feed.want = True
        if feed.exact:
            following = feed.ahead(1)
            if following == b"]":
                raise _Pause(new_list=True)
            if following == b"(" and feed.want:
                raise _Pause(new_list=False)


_STRINGS = {
    0x8C: (1, "<B"),  # SHORT_BINUNICODE
    0x58: (4, "<I"),  # BINUNICODE
    0x8D: (8, "<Q"),  # BINUNICODE8
    0x43: (1, "<B"),  # SHORT_BINBYTES
    0x42: (4, "<I"),  # BINBYTES
    0x8E: (8, "<Q"),  # BINBYTES8
}
_BYTES = {0x43, 0x42, 0x8E}
_LARGE = {0x58: (4, "<I"), 0x8D: (8, "<Q"), 0x42: (4, "<I"), 0x8E: (8, "<Q"), 0x96: (8, "<Q")}
_FIXED = {
    0x4B: (1, "<B"),  # BININT1
    0x4D: (2, "<H"),  # BININT2
    0x4A: (4, "<i"),  # BININT
    0x47: (8, ">d"),  # BINFLOAT
}
_CONSTANTS: dict[int, Callable[[], Any]] = {
    0x4E: lambda: None,  # NONE
    0x88: lambda: True,  # NEWTRUE
    0x89: lambda: False,  # NEWFALSE
    0x7D: dict,  # EMPTY_DICT
    0x29: tuple,  # EMPTY_TUPLE
    0x8F: set,  # EMPTY_SET
}
_TUPLES = {0x85: 1, 0x86: 2, 0x87: 3}
_PUTS = {0x94: 1, 0x71: 2, 0x72: 5}  # MEMOIZE, BINPUT, LONG_BINPUT: their lengths
