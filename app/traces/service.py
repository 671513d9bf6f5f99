"""Allocator traces: chunks uploaded by workers, read back page by page or as a stream."""

import contextlib
import gzip
import json
import queue
import threading
import zlib
from collections.abc import Generator, Iterator
from typing import Any

import msgspec
from isal import isal_zlib
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.errors import ApiError, Conflict, PayloadTooLarge
from app.models import Experiment, TraceChunk
from vramlab import contract

REQUIRED_KEYS = ("action", "size")
# Decompressed text is looked at this many bytes at a time.
TEXT_STEP = 256 * 1024
# One event (one line) may not pass this: deep stacks stay well under it.
MAX_EVENT_BYTES = 1 * 2**20
_DECODE = msgspec.json.Decoder(list[dict[str, Any]]).decode


def _text(body: bytes, limit: int) -> Iterator[bytes]:
    """The gzip member's text, piece by piece; it must end where the body ends.

    A member cut short (on a line boundary or not) has no end-of-stream and trailer, so
    it is refused rather than stored as if it were whole.
    """
    decoder = zlib.decompressobj(wbits=31)
    data, produced = body, 0
    try:
        while not decoder.eof:
            piece = decoder.decompress(data, TEXT_STEP)
            data = decoder.unconsumed_tail
            if not piece and not data:
                break
            produced += len(piece)
            if produced > limit:
                raise PayloadTooLarge(f"trace chunk expands past {limit} bytes")
            yield piece
    except zlib.error as exc:
        raise ApiError(f"trace chunk is not gzip data: {exc}") from None
    if not decoder.eof:
        raise ApiError("trace chunk's gzip member is cut short: its end (and checksum) is missing")
    if decoder.unused_data:
        raise ApiError("trace chunk has bytes after its gzip member: send one member")


def _lines(body: bytes, limit: int) -> Iterator[bytes]:
    pending = b""
    for piece in _text(body, limit):
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        if len(pending) > MAX_EVENT_BYTES:
            raise PayloadTooLarge(f"a trace event may not pass {MAX_EVENT_BYTES} bytes")
        yield from lines
    if pending:  # chunks are streamed back as stored, one after another: each must end
        raise ApiError("trace chunk's last line has no newline: end every event with one")


def check_chunk(body: bytes, settings: Settings) -> int:
    """Validate an uploaded chunk as a stream, one line at a time; return its event count.

    Only one piece of text and one line are held at once, whatever the chunk expands to.
    """
    if len(body) > settings.max_trace_chunk_bytes:
        raise PayloadTooLarge(f"trace chunk is larger than {settings.max_trace_chunk_bytes} bytes")
    limit = settings.max_trace_chunk_bytes * contract.TRACE_CHUNK_EXPANSION
    n = 0
    for n, line in enumerate(_lines(body, limit), start=1):
        if n > settings.max_trace_chunk_events:
            raise PayloadTooLarge(f"a chunk holds at most {settings.max_trace_chunk_events} events")
        try:
            event = json.loads(line)
        except ValueError:
            raise ApiError(f"trace chunk line {n} is not JSON") from None
        if not isinstance(event, dict) or any(k not in event for k in REQUIRED_KEYS):
            raise ApiError(f"trace chunk line {n} is not an event with {REQUIRED_KEYS}")
    return n


def store_chunk(session: Session, exp: Experiment, seq: int, body: bytes, n_events: int) -> None:
    """Store a checked chunk as the worker sent it; chunks arrive in order from 0."""
    earlier = session.execute(
        select(TraceChunk.seq, TraceChunk.n_events)
        .where(TraceChunk.experiment_id == exp.id)
        .order_by(TraceChunk.seq)
    ).all()
    if seq > len(earlier):
        raise Conflict(f"trace chunk {seq} arrived before chunk {len(earlier)}")
    if seq < len(earlier):  # a retried upload replaces its chunk
        if seq != len(earlier) - 1:
            raise Conflict(f"trace chunk {seq} was already stored and followed by others")
        session.execute(
            delete(TraceChunk).where(TraceChunk.experiment_id == exp.id, TraceChunk.seq == seq)
        )
        earlier = earlier[:seq]
    session.add(
        TraceChunk(
            experiment_id=exp.id,
            seq=seq,
            first_event=sum(n for _, n in earlier),
            n_events=n_events,
            data=body,
        )
    )


def count(session: Session, experiment_id: str) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(TraceChunk.n_events), 0)).where(
            TraceChunk.experiment_id == experiment_id
        )
    )
    return int(total or 0)


def iter_events(session: Session, experiment_id: str, start: int = 0) -> Iterator[dict[str, Any]]:
    """Events from index ``start`` on, one chunk in memory at a time."""
    seqs = session.execute(
        select(TraceChunk.seq, TraceChunk.first_event, TraceChunk.n_events)
        .where(TraceChunk.experiment_id == experiment_id)
        .order_by(TraceChunk.seq)
    ).all()
    for seq, first, n in seqs:
        if first + n <= start:
            continue
        data = session.scalar(
            select(TraceChunk.data).where(
                TraceChunk.experiment_id == experiment_id, TraceChunk.seq == seq
            )
        )
        assert data is not None
        # Stored as sent, as checked: one event per line, every line ended by a newline.
        for i, line in enumerate(gzip.decompress(data).split(b"\n")[:-1]):
            if first + i >= start:
                yield json.loads(line)


def matches(event: dict[str, Any], actions: set[str] | None, min_size: int) -> bool:
    if actions and event.get("action") not in actions:
        return False
    return int(event.get("size") or 0) >= min_size


def _chunk_seqs(session: Session, experiment_id: str) -> list[int]:
    return list(
        session.scalars(
            select(TraceChunk.seq)
            .where(TraceChunk.experiment_id == experiment_id)
            .order_by(TraceChunk.seq)
        )
    )


def _chunk_data(session: Session, experiment_id: str, seq: int) -> bytes:
    data = session.scalar(
        select(TraceChunk.data).where(
            TraceChunk.experiment_id == experiment_id, TraceChunk.seq == seq
        )
    )
    assert data is not None
    return bytes(data)


def iter_ndjson(session: Session, experiment_id: str, piece: int = 2**20) -> Iterator[bytes]:
    """The stored NDJSON itself, decompressed in pieces of at most ``piece`` bytes: no
    event is parsed or encoded again, and one chunk at a time is held. ISA-L inflates the
    same pieces as zlib in a third of the CPU time (docs/design.md, trace exports)."""
    for seq in _chunk_seqs(session, experiment_id):
        decoder = isal_zlib.decompressobj(wbits=31)
        data = _chunk_data(session, experiment_id, seq)
        while data:
            out = decoder.decompress(data, piece)
            data = decoder.unconsumed_tail
            if out:
                yield out
        if rest := decoder.flush():
            yield rest


def iter_line_blocks(
    session: Session, experiment_id: str, piece: int = 2**20
) -> Generator[bytes, None, None]:
    """The stored NDJSON in blocks of whole lines (about ``piece`` bytes each, one line
    more where a line is longer): what ``iter_ndjson`` yields, cut after a newline."""
    rest = b""
    for text in iter_ndjson(session, experiment_id, piece):
        cut = text.rfind(b"\n") + 1
        if not cut:
            rest += text
            continue
        yield b"".join((rest, memoryview(text)[:cut]))  # one copy, not two
        rest = text[cut:]
    if rest:  # every stored chunk ends with a newline: nothing is left but by a bug
        raise RuntimeError("stored trace text does not end with a newline")


def ahead(pieces: Generator[bytes, None, None], depth: int = 4) -> Iterator[bytes]:
    """``pieces`` made in a thread of their own, at most ``depth`` ahead of the reader, so
    making them overlaps with what the reader does with the piece before: decompressing
    (ISA-L and zlib let go of the GIL) under an export, or an export's next piece while the
    event loop sends this one. Only that thread touches ``pieces`` (and its session); when
    the reader stops, early or not, the thread closes ``pieces`` and is joined."""
    ready: queue.Queue[tuple[bytes | None, BaseException | None]] = queue.Queue(depth)
    stop = threading.Event()

    def give(item: tuple[bytes | None, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for piece in pieces:
                if not give((piece, None)):
                    return
            give((None, None))
        except BaseException as exc:  # handed to the reader, raised there
            give((None, exc))
        finally:
            pieces.close()

    thread = threading.Thread(target=produce, name="trace-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            piece, error = ready.get()
            if error is not None:
                raise error
            if piece is None:
                return
            yield piece
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):  # a put waiting for room returns at once
            while True:
                ready.get_nowait()
        thread.join()


def chunk_lines(session: Session, experiment_id: str) -> Iterator[list[bytes]]:
    """Each stored chunk's lines (one event each, as stored), one chunk at a time."""
    for seq in _chunk_seqs(session, experiment_id):
        text = gzip.decompress(_chunk_data(session, experiment_id, seq))
        yield [line for line in text.split(b"\n") if line.strip()]


def parse_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    """Stored lines as events, in one call: each line is one JSON object (checked when it
    was stored), so the lines joined by commas are one JSON array."""
    text = b"[" + b",".join(lines) + b"]"
    try:
        events: list[dict[str, Any]] = _DECODE(text)  # the same values, in half the time
    except msgspec.DecodeError:  # NaN, Infinity, a lone surrogate: json reads them
        events = json.loads(text)
    return events


def iter_event_batches(
    session: Session, experiment_id: str, size: int = 5000
) -> Iterator[list[dict[str, Any]]]:
    """The events in batches of at most ``size``, parsed in one call a batch rather than
    one an event; a chunk's parsed events are never all held at once."""
    for lines in chunk_lines(session, experiment_id):
        for start in range(0, len(lines), size):
            yield parse_lines(lines[start : start + size])
