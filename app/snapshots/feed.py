"""The file the stream reader's C unpickler reads past the first trace list
(``stream.Reader``): the deframed pickle handed out by ``peek`` a buffer at a time (the
unpickler then reads its opcodes from that buffer, in C), except around the bytes where
the reader may have to stop it, which it gets by ``read`` exactly as each opcode asks for
them, so that where it stopped is known there (``exact``, ``at``)."""

from typing import Protocol


class Source(Protocol):
    def read(self, n: int) -> bytes: ...


CHUNK = 4 << 20  # bytes of the file read at a time
PEEK = 256 << 10  # the most a peek hands out: ``want`` is heeded within as many bytes
# Where a device's list may begin: a list's APPENDS or APPEND, then EMPTY_LIST.
NEW_LIST = (b"e]", b"a]")
# Between two batches of a trace list: APPENDS or APPEND, then MARK.
BETWEEN = (b"e(", b"a(")


class Feed:
    """Bytes of the reader's own (``inject``: the stack given back after a stop, or a
    small program) come before the file's, a segment at a time, so that the unpickler
    never holds any past a segment's end: stopped there, it has read all it was given.
    ``want``: also stop exactly between two batches (``BETWEEN``)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.buf = b""  # the file's bytes
        self.at = 0  # where the unpickler is in them (after a peek: where it began)
        self.pre = b""  # the reader's own bytes, read first
        self.pre_at = 0
        self.ends: list[int] = []  # where the segments of ``pre`` end
        self.eof = False
        self.peeked: int | None = None  # the last peek's length, until the read that skips it
        self.owed = 0  # a skip the unpickler still makes of bytes already counted
        self.exact = True  # ``at`` is where the unpickler stopped
        self.want = False
        # Each pattern: where it was found (-1: not), and up to where ``buf`` was searched.
        self._next: dict[bytes, tuple[int, int]] = {}

    # The reader's own bytes. -------------------------------------------------------
    def inject(self, *segments: bytes) -> None:
        """``segments`` to be read, each on its own, before the rest."""
        self.pre = b"".join(segments)
        self.pre_at = 0
        self.ends = []
        total = 0
        for s in segments:
            total += len(s)
            self.ends.append(total)

    def failed(self) -> None:
        """The unpickler failed on the last opcode of the first segment it was given: all
        of it is read (the skip it owes is made when it next reads), the rest dropped."""
        self.owed = self.ends[0] - self.pre_at
        self.pre = b""
        self.pre_at = 0
        self.ends = []
        self.peeked = None

    def _in_pre(self) -> bool:
        return self.pre_at < len(self.pre)

    # The file's bytes. -------------------------------------------------------------
    def start(self, data: bytes) -> None:
        """The file from where the unpickler is: ``data``, then the source's."""
        self._rebase(data + self.buf[self.at :])

    def _more(self, n: int) -> None:
        """At least ``n`` bytes from ``at`` on, where the file has them."""
        while len(self.buf) - self.at < n and not self.eof:
            more = self.source.read(max(CHUNK, n))
            if not more:
                self.eof = True
            self._rebase(self.buf[self.at :] + more)

    def _rebase(self, buf: bytes) -> None:
        d = -self.at
        self._next = {
            p: (found + d if found >= 0 else -1, max(0, searched + d))
            for p, (found, searched) in self._next.items()
        }
        self.buf = buf
        self.at = 0

    def ahead(self, n: int) -> bytes:
        """The file's next ``n`` bytes (fewer at its end), not consumed."""
        self._more(n)
        return self.buf[self.at : self.at + n]

    def skip(self, n: int) -> bytes:
        out = self.ahead(n)
        self.at += len(out)
        return out

    def _find(self, pattern: bytes) -> int:
        """Where ``pattern`` is next, at or past ``at`` (the end of ``buf``: nowhere)."""
        found, searched = self._next.get(pattern, (-1, 0))
        if found >= self.at:
            return found
        # From where the last search stopped (a pattern may straddle that place).
        found = self.buf.find(pattern, max(self.at, searched - 1))
        self._next[pattern] = (found, found + 1) if found >= 0 else (-1, len(self.buf))
        return found if found >= 0 else len(self.buf)

    def _stop(self) -> int:
        """Where the buffer a peek hands out ends: before the next possible stop."""
        stop = min(self.at + PEEK, len(self.buf) if self.eof else len(self.buf) - 1)
        for pattern in NEW_LIST + (BETWEEN if self.want else ()):
            stop = min(stop, self._find(pattern))
        return stop

    # What the unpickler calls. -----------------------------------------------------
    def peek(self, n: int = 0) -> memoryview:
        if self._in_pre():
            at = self.pre_at
            stop = next(e for e in self.ends if e > at)
            data = self.pre
        else:
            self._more(2)
            at = self.at
            stop = max(at, self._stop())
            data = self.buf
        self.peeked = stop - at
        if self.peeked:
            self.exact = False
        return memoryview(data)[at:stop]

    def read(self, n: int = -1) -> bytes:
        if self.owed:
            # The skip the unpickler owed since it failed (``failed``).
            self.owed = 0
            return b""
        skip = self.peeked is not None and 0 <= n <= self.peeked
        self.peeked = None
        if skip:
            # What the unpickler used of the last peek: its position; no data wanted.
            if self._in_pre():
                self.pre_at += n
            else:
                self.at += n
            return b""
        self.exact = True
        if self._in_pre():
            out = self.pre[self.pre_at : self.pre_at + n]
            self.pre_at += len(out)
            return out
        return self.skip(n)

    def readline(self) -> bytes:
        self.peeked = None
        self.exact = True
        if self._in_pre():
            end = self.pre.find(b"\n", self.pre_at)
            end = len(self.pre) if end < 0 else end + 1
            out = self.pre[self.pre_at : end]
            self.pre_at = end
            return out
        while True:
            line = self.buf.find(b"\n", self.at)
            if line >= 0 or self.eof:
                return self.skip(line + 1 - self.at if line >= 0 else len(self.buf) - self.at)
            self._more(len(self.buf) - self.at + 1)
