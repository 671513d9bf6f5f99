"""Receiving a snapshot upload: the body streamed to a temp file, counted and hashed,
never held whole, at a minimum rate; a gzipped body expanded as it arrives, so a bomb is
refused after its first kilobytes."""

import asyncio
import hashlib
import shutil
import tempfile
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from starlette.concurrency import run_in_threadpool

from app.core.config import Settings
from app.core.errors import ApiError, PayloadTooLarge, RequestTimeout
from vramlab.units import human_bytes


class SnapshotRefused(ApiError):
    """The upload is not a snapshot we will read (it names a global, or is not one)."""

    status_code = 422
    type = "snapshot_refused"


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


def paced(receive: Receive, settings: Settings) -> Receive:
    """``receive`` (a request's ASGI receive) held to a minimum rate: each window of
    ``snapshot_upload_window_seconds`` from the first read must bring at least
    ``snapshot_upload_min_bytes_per_second`` times its length of body, and a wait for the
    next piece ends when its window can no longer be met (a window whose share has come
    waits until the end of the next). Past that, 408: a client that trickles, or sends
    nothing, holds its connection and its share of the uploads one window at most."""
    rate = settings.snapshot_upload_min_bytes_per_second
    window = settings.snapshot_upload_window_seconds
    quota = rate * window
    loop = asyncio.get_running_loop()
    end = loop.time() + window
    got = 0

    def too_slow() -> RequestTimeout:
        return RequestTimeout(
            f"the snapshot's body came at less than {human_bytes(rate)}/s over "
            f"{window:g} s (VRAMLAB_SNAPSHOT_UPLOAD_MIN_BYTES_PER_SECOND, "
            "VRAMLAB_SNAPSHOT_UPLOAD_WINDOW_SECONDS); send it at once, from a file"
        )

    async def next_piece() -> MutableMapping[str, Any]:
        nonlocal end, got
        try:
            async with asyncio.timeout_at(end if got < quota else end + window):
                message = await receive()
        except TimeoutError:
            raise too_slow() from None
        now = loop.time()
        while now >= end:
            if got < quota:
                raise too_slow()
            got, end = 0, end + window
        if message["type"] == "http.request":
            got += len(message.get("body", b""))
        return message

    return next_piece


@dataclass
class Upload:
    folder: Path
    path: Path
    size: int
    sha256: str
    gzipped: bool


GZIP_MAGIC = b"\x1f\x8b"


# The expansion ratio is checked once this much has come out: a small file may be all
# repetition without being a bomb.
RATIO_FLOOR = 2**20


# Bytes of the body handed to the thread pool at a time (written, or expanded and written).
_BATCH = 256 * 2**10


_PIECE = 2**20


class _Expander:
    """Expands a gzip upload (every member) as it arrives, so that a bomb is refused
    after its first kilobytes rather than once gigabytes have come out: never more than
    ``ratio`` times the bytes received so far (past ``RATIO_FLOOR``), nor past ``cap``, is
    decompressed."""

    def __init__(self, ratio: int, cap: int) -> None:
        self.ratio = ratio
        self.cap = cap
        self.gz = zlib.decompressobj(wbits=31)
        self.received = 0
        self.expanded = 0

    def feed(self, data: bytes, out: BinaryIO) -> None:
        self.received += len(data)
        try:
            while data:
                if self.gz.eof:  # the next member of a multi-member file
                    self.gz = zlib.decompressobj(wbits=31)
                allowed = min(max(self.ratio * self.received, RATIO_FLOOR), self.cap)
                block = self.gz.decompress(data, min(allowed - self.expanded + 1, _PIECE))
                self.expanded += len(block)
                self._check()
                out.write(block)
                data = self.gz.unused_data if self.gz.eof else self.gz.unconsumed_tail
        except zlib.error as exc:
            raise SnapshotRefused(f"truncated or bad gzip data: {exc}") from None

    def _check(self) -> None:
        if self.expanded > self.cap:
            raise PayloadTooLarge(
                f"the gzip data expands past {self.cap} bytes (VRAMLAB_MAX_SNAPSHOT_EXPANDED_BYTES)"
            )
        if self.expanded > max(self.ratio * self.received, RATIO_FLOOR):
            raise PayloadTooLarge(
                f"the gzip data expands more than {self.ratio} times its size "
                f"(VRAMLAB_MAX_SNAPSHOT_GZIP_RATIO = {self.ratio}): its first "
                f"{self.received} bytes already gave {self.expanded}; refused as a gzip bomb"
            )

    def finish(self) -> None:
        if not self.gz.eof:
            raise SnapshotRefused("truncated gzip data: the upload ends inside a member")


async def receive(chunks: AsyncIterator[bytes], settings: Settings) -> Upload:
    """Stream a request body to a temp file, counting and hashing; never held whole.

    A gzipped body is expanded as it arrives (the file holds the pickle), so that its
    expansion ratio is checked before the next bytes are read (``_Expander``)."""
    folder = Path(tempfile.mkdtemp(prefix="vramlab-snapshot-"))
    path = folder / "upload"
    digest = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    waiting = 0
    expander: _Expander | None = None
    first = True

    def write(data: bytes, out: BinaryIO) -> None:
        nonlocal expander, first
        if first and data[:2] == GZIP_MAGIC:
            expander = _Expander(
                settings.max_snapshot_gzip_ratio, settings.max_snapshot_expanded_bytes
            )
        first = False
        if expander is not None:
            expander.feed(data, out)
        else:
            out.write(data)

    try:
        with path.open("wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                if size > settings.max_snapshot_bytes:
                    raise PayloadTooLarge(
                        f"a snapshot upload may be at most {settings.max_snapshot_bytes} bytes "
                        "(VRAMLAB_MAX_SNAPSHOT_BYTES)"
                    )
                digest.update(chunk)
                pending.append(chunk)
                waiting += len(chunk)
                if waiting < _BATCH:
                    continue
                data, pending, waiting = b"".join(pending), [], 0
                await run_in_threadpool(write, data, out)
            await run_in_threadpool(write, b"".join(pending), out)
            if expander is not None:
                expander.finish()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if size == 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise SnapshotRefused("the body is empty: send the snapshot file as the request body")
    return Upload(folder, path, size, digest.hexdigest(), expander is not None)


def discard(upload: Upload) -> None:
    shutil.rmtree(upload.folder, ignore_errors=True)
