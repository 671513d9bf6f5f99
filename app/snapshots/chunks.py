"""The stored trace's chunks: gzip NDJSON, compressed on a thread as they are written, by
ISA-L (``isal``: a gzip stream as zlib's, in a fifteenth of the CPU of zlib's level 1 on
these lines, and smaller)."""

import queue
import threading
from pathlib import Path
from typing import Any

from isal import isal_zlib


class ChunkWriter:
    """gzip NDJSON chunks of ``per_chunk`` events, compressed as they are written.

    Lines go to a compressing thread in batches (ISA-L lets go of the GIL), through a
    short queue: the text of a whole chunk is never held at once.
    """

    BATCH = 2000

    def __init__(self, out: Path, per_chunk: int) -> None:
        self.out = out
        self.per_chunk = per_chunk
        self.chunks: list[dict[str, int]] = []
        self._lines: list[str] = []
        self._in_chunk = 0
        self._first = 0
        self._queue: queue.Queue[tuple[int, bytes | None]] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._compress, daemon=True)
        self._thread.start()

    def _compress(self) -> None:
        comp: Any = None
        f: Any = None
        try:
            while True:
                n, data = self._queue.get()
                if n < 0:
                    return
                if comp is None:
                    comp = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
                    f = (self.out / f"chunk-{n:05d}.ndjson.gz").open("wb")
                if data is None:  # the chunk's end
                    f.write(comp.flush())
                    f.close()
                    comp = f = None
                else:
                    f.write(comp.compress(data))
        except BaseException as exc:  # reported by close()
            self._error = exc
            while self._queue.get()[0] >= 0:
                pass

    def add(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= self.BATCH:
            self._send()

    def _send(self) -> None:
        if self._lines:
            n = len(self.chunks)
            self._queue.put((n, ("\n".join(self._lines) + "\n").encode()))
            self._in_chunk += len(self._lines)
            self._lines = []
        if self._in_chunk >= self.per_chunk:
            self._end_chunk()

    def _end_chunk(self) -> None:
        if not self._in_chunk:
            return
        n = len(self.chunks)
        self._queue.put((n, None))
        self.chunks.append({"seq": n, "first_event": self._first, "n_events": self._in_chunk})
        self._first += self._in_chunk
        self._in_chunk = 0

    def flush(self) -> None:
        """Write what is left and wait for the compressing thread."""
        self._send()
        self._end_chunk()
        self._queue.put((-1, None))
        self._thread.join()
        if self._error is not None:
            raise self._error
