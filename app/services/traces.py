"""Allocator traces: chunks uploaded by workers, read back page by page or as a stream."""

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.errors import ApiError, Conflict, PayloadTooLarge
from app.models import Experiment, TraceChunk

REQUIRED_KEYS = ("action", "size")


def _decompress(data: bytes, limit: int) -> bytes:
    """Gunzip at most ``limit`` bytes: a small body must not expand without bound."""
    decoder = zlib.decompressobj(wbits=31)
    try:
        out = decoder.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ApiError(f"trace chunk is not gzip data: {exc}") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise PayloadTooLarge(f"trace chunk expands past {limit} bytes")
    return out


def store_chunk(
    session: Session, exp: Experiment, seq: int, body: bytes, settings: Settings
) -> int:
    """Validate and store one chunk; chunks arrive in order from 0. Returns its event count."""
    if len(body) > settings.max_trace_chunk_bytes:
        raise PayloadTooLarge(f"trace chunk is larger than {settings.max_trace_chunk_bytes} bytes")
    text = _decompress(body, settings.max_trace_chunk_bytes * 8)
    lines = [line for line in text.split(b"\n") if line.strip()]
    if len(lines) > settings.max_trace_chunk_events:
        raise PayloadTooLarge(f"a chunk holds at most {settings.max_trace_chunk_events} events")
    for n, line in enumerate(lines):
        try:
            event = json.loads(line)
        except ValueError:
            raise ApiError(f"trace chunk line {n + 1} is not JSON") from None
        if not isinstance(event, dict) or any(k not in event for k in REQUIRED_KEYS):
            raise ApiError(f"trace chunk line {n + 1} is not an event with {REQUIRED_KEYS}")
    existing = session.scalars(
        select(TraceChunk).where(TraceChunk.experiment_id == exp.id).order_by(TraceChunk.seq)
    ).all()
    if seq > len(existing):
        raise Conflict(f"trace chunk {seq} arrived before chunk {len(existing)}")
    if seq < len(existing):  # a retried upload replaces its chunk
        if seq != len(existing) - 1:
            raise Conflict(f"trace chunk {seq} was already stored and followed by others")
        session.delete(existing[seq])
        session.flush()
        existing = existing[:seq]
    first = sum(c.n_events for c in existing)
    session.add(
        TraceChunk(
            experiment_id=exp.id,
            seq=seq,
            first_event=first,
            n_events=len(lines),
            data=gzip.compress(b"\n".join(lines) + b"\n", compresslevel=6),
        )
    )
    return len(lines)


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
        for i, line in enumerate(gzip.decompress(data).splitlines()):
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
    event is parsed or encoded again, and one chunk at a time is held."""
    for seq in _chunk_seqs(session, experiment_id):
        decoder = zlib.decompressobj(wbits=31)
        data = _chunk_data(session, experiment_id, seq)
        while data:
            out = decoder.decompress(data, piece)
            data = decoder.unconsumed_tail
            if out:
                yield out
        if rest := decoder.flush():
            yield rest


def chunk_lines(session: Session, experiment_id: str) -> Iterator[list[bytes]]:
    """Each stored chunk's lines (one event each, as stored), one chunk at a time."""
    for seq in _chunk_seqs(session, experiment_id):
        text = gzip.decompress(_chunk_data(session, experiment_id, seq))
        yield [line for line in text.split(b"\n") if line.strip()]


def parse_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    """Stored lines as events, in one call: each line is one JSON object (checked when it
    was stored), so the lines joined by commas are one JSON array."""
    events: list[dict[str, Any]] = json.loads(b"[" + b",".join(lines) + b"]")
    return events


def iter_event_batches(
    session: Session, experiment_id: str, size: int = 5000
) -> Iterator[list[dict[str, Any]]]:
    """The events in batches of at most ``size``, parsed in one call a batch rather than
    one an event; a chunk's parsed events are never all held at once."""
    for lines in chunk_lines(session, experiment_id):
        for start in range(0, len(lines), size):
            yield parse_lines(lines[start : start + size])
