"""A snapshot's trace entries as compact records on disk, read back as often as the
passes need them, so the trace is never held as Python objects.

Each entry becomes one fixed-size record: its action, its numbers (addr, size, stream,
time_us, device_free) and its frames as the id of a distinct stack (frames are shared
dicts, so a stack is known by the identities of its frames, as ``walk`` always knew it)
plus the identity of the frames list itself (``token``): a free recorded with PyTorch's
``context="alloc"`` holds its block's very list, and ``walk`` tells that apart from an
equal list of its own. An entry whose values are not plain integers or None keeps them
as they were (``odd``), so the passes see exactly what the pickle held and refuse what
they refused before. An entry that is not one (not a dict, an unknown action) is not
written: its error is kept and raised where the whole-file reader raised it.

The same records are made from the batches of a streamed read (``stream.Reader``) or from
a loaded snapshot (``from_data``), so both readers give the same results.
"""

import struct
from collections.abc import Iterator
from pathlib import Path
from sys import getrefcount
from typing import Any

from app.snapshots.load import check_entry
from app.snapshots.memo import DROPPED, EMPTY, StackRef
from app.snapshots.stream import Unsupported
from vramlab.contract import MEMORY_VIZ_ACTIONS

ACTIONS = MEMORY_VIZ_ACTIONS
CODES = {a: n for n, a in enumerate(ACTIONS)}
# action, flags, addr, size, stream, time_us, device_free, stack, token
RECORD = struct.Struct("<BBqqqqqiq")
NO_ADDR, NO_STREAM, NO_TIME, NO_FREE, ODD = 1, 2, 4, 8, 16
_OOM = CODES["oom"]
_FLUSH = 1 << 22
_READ = RECORD.size * 8192
_NEW_TOKENS = -1  # identities of lists no one else holds (ids are positive)
# References to a frames list held by its entry alone, seen from ``Sink.batch``: the
# entry, the local name, getrefcount's argument.
_UNSHARED = 3

# What the passes get for each entry.
Entry = tuple[str, Any, Any, Any, Any, Any, int, Any]


class Trace:
    """One device's entries, written once and read back in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = 0  # entries, valid or not
        self.error: Exception | None = None  # the first entry that is not one
        self.odd: dict[int, tuple[Any, Any, Any, Any, Any]] = {}
        self.first_time: Any = None
        self.last_time: Any = None
        self._buf = bytearray()
        self._file = path.open("wb")

    def flush(self) -> None:
        self._file.write(self._buf)
        self._buf.clear()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Entry]:
        """(action, addr, size, stream, time_us, device_free, stack, token) per entry."""
        actions, odd = ACTIONS, self.odd
        i = 0
        with self.path.open("rb") as f:
            while block := f.read(_READ):
                for code, flags, addr, size, stream, t, free, sid, token in RECORD.iter_unpack(
                    block
                ):
                    if flags:
                        if flags & ODD:
                            addr, size, stream, t, free = odd[i]
                        else:
                            addr = None if flags & NO_ADDR else addr
                            stream = None if flags & NO_STREAM else stream
                            t = None if flags & NO_TIME else t
                            free = None if flags & NO_FREE else free
                    yield actions[code], addr, size, stream, t, free, sid, token
                    i += 1


class Sink:
    """Takes entries batch by batch (``stream.Reader`` or ``from_data``) and writes each
    device's records into ``folder``; keeps the distinct stacks."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.traces: list[Trace] = []
        self.stacks: list[Any] = [()]  # 0: no frames
        self.weird: set[int] = set()  # stack ids of frames that are not a list or tuple
        self._ids: dict[tuple[int, ...], int] = {}
        self._token = _NEW_TOKENS

    def intern(self, frames: list[Any] | tuple[Any, ...]) -> int:
        """The id of a stack: the same frames (by identity) in the same order."""
        key = tuple(map(id, frames))
        sid = self._ids.get(key)
        if sid is None:
            if any(f is DROPPED or f is EMPTY for f in frames):
                raise Unsupported("a frame refers to an object the stream reader let go of")
            sid = self._ids[key] = len(self.stacks)
            self.stacks.append(list(frames))
        return sid

    def trace(self, device: int) -> Trace:
        while len(self.traces) <= device:
            self.traces.append(Trace(self.folder / f"trace-{len(self.traces)}.records"))
        return self.traces[device]

    def close(self) -> None:
        for t in self.traces:
            t.close()

    def remove(self) -> None:
        for t in self.traces:
            t.path.unlink(missing_ok=True)
        self.traces = []

    def batch(self, device: int, items: list[Any], outside: dict[int, Any] | None) -> None:
        """Write ``items`` (entries, in order) as records. ``outside``: lists made before
        the trace (alive, and never changed here), by id; None: every entry stays alive
        (a whole snapshot loaded), so a list's id is its identity. Otherwise the entries
        are emptied once written: a dict cleared, a frames list the memo holds shrunk to
        a ``StackRef`` of its stack and an identity token of its own, so that the
        unpickler's memo holds little (and ``memo`` then lets go of them: a list let go of
        comes back, where an entry refers to it again, as that token, a complex number;
        any other object as ``DROPPED``, which is read whole instead)."""
        trace = self.trace(device)
        pack = RECORD.pack
        buf = trace._buf
        intern = self.intern
        for e in items:
            index = trace.n
            trace.n += 1
            if trace.error is not None:
                continue
            try:
                code = CODES[e["action"]]
            except Exception:
                if outside is not None and (
                    e is DROPPED
                    or e is EMPTY
                    or (type(e) is dict and (not e or e.get("action") in (DROPPED, EMPTY)))
                ):
                    raise Unsupported("an entry referred to again after it was handed on") from None
                try:
                    check_entry(e)
                except Exception as exc:  # raised where the whole-file reader raised it
                    trace.error = exc
                    continue
                raise
            frames = e.get("frames")
            if not frames:
                sid = token = 0
            elif type(frames) is list:
                if len(frames) == 1 and type(frames[0]) is StackRef:
                    sid, token = frames[0].stack, frames[0].token
                elif outside is None or id(frames) in outside:
                    sid = intern(frames)
                    token = id(frames)
                else:
                    # An identity of its own; in the unpickler's memo (a later entry may
                    # refer to it again), shrunk to a StackRef that keeps it.
                    sid = intern(frames)
                    self._token -= 1
                    token = self._token
                    if getrefcount(frames) > _UNSHARED:
                        frames[:] = [StackRef(sid, token)]
            elif type(frames) is complex and outside is not None:
                # A list handed on that the memo let go of (``memo``): its stack, its identity.
                sid, token = int(frames.imag), int(frames.real)
            elif frames is DROPPED:
                raise Unsupported("frames refer to an object the stream reader let go of")
            elif type(frames) is tuple and outside is None:
                sid = intern(frames)
                token = id(frames)
            elif type(frames) is tuple:
                raise Unsupported("frames as a tuple")
            else:
                sid = len(self.stacks)
                self.stacks.append(frames)
                self.weird.add(sid)
                self._token -= 1
                token = self._token
            addr = e.get("addr")
            size = e.get("size", 0)
            stream = e.get("stream")
            t = e.get("time_us")
            free = e.get("device_free") if code == _OOM else None
            if index == 0:
                trace.first_time = t
            trace.last_time = t
            flags = 0
            if addr is None:
                flags = NO_ADDR
                addr = 0
            if stream is None:
                flags |= NO_STREAM
                stream = 0
            if t is None:
                flags |= NO_TIME
                t = 0
            if free is None:
                flags |= NO_FREE
                free = 0
            if (
                type(addr) is int
                and type(size) is int
                and type(stream) is int
                and type(t) is int
                and type(free) is int
            ):
                try:
                    buf += pack(code, flags, addr, size, stream, t, free, sid, token)
                except struct.error:
                    pass
                else:
                    if outside is not None:
                        e.clear()
                    continue
            odd = (e.get("addr"), size, e.get("stream"), e.get("time_us"), e.get("device_free"))
            if outside is not None and any(
                v is DROPPED or v is EMPTY or type(v) is complex for v in odd
            ):
                raise Unsupported("a field refers to an object the stream reader let go of")
            trace.odd[index] = odd
            buf += pack(code, ODD, 0, 0, 0, 0, 0, sid, token)
            if outside is not None:
                e.clear()
        if len(buf) >= _FLUSH:
            trace.flush()


def from_data(traces: list[Any], folder: Path) -> Sink:
    """The records of a loaded snapshot's ``device_traces`` (the whole-file reader)."""
    sink = Sink(folder)
    for device, entries in enumerate(traces):
        sink.trace(device)
        for start in range(0, len(entries), 1000):
            sink.batch(device, entries[start : start + 1000], None)
    sink.close()
    return sink
