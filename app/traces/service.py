"""Allocator traces: chunks uploaded by workers, read back page by page or as a stream."""

import base64
import binascii
import contextlib
import gzip
import json
import operator
import queue
import threading
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import numpy as np
from isal import isal_zlib
from msgspec import UNSET
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.errors import ApiError, Conflict, PayloadTooLarge
from app.tables import Experiment, TraceChunk
from app.traces import event_columns, viz_frames, viz_records, viz_stacks
from vramlab import contract

REQUIRED_KEYS = ("action", "size")
# Decompressed text is looked at this many bytes at a time.
TEXT_STEP = 256 * 1024
# One event (one line) may not pass this: deep stacks stay well under it.
MAX_EVENT_BYTES = 1 * 2**20
# A chunk's distinct stacks kept beside its columns at most (``ChunkStacks``).
MAX_STACK_TABLE_BYTES = 8 * 2**20
T = TypeVar("T")
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


def _line_batches(body: bytes, limit: int) -> Iterator[list[bytes]]:
    """The chunk's whole lines, a list per piece of text."""
    pending = b""
    for piece in _text(body, limit):
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        if len(pending) > MAX_EVENT_BYTES:
            raise PayloadTooLarge(f"a trace event may not pass {MAX_EVENT_BYTES} bytes")
        yield lines
    if pending:  # chunks are streamed back as stored, one after another: each must end
        raise ApiError("trace chunk's last line has no newline: end every event with one")


class _Valid(msgspec.Struct):
    """What the check reads of an event that is not plain: the keys it must have."""

    action: Any = UNSET
    size: Any = UNSET


_VALID = msgspec.json.Decoder(_Valid)


@dataclass
class CheckedChunk:
    """An uploaded chunk that passed the check: its events, and their columns where
    every event is plain (``event_columns``)."""

    n_events: int
    columns: bytes | None


def check_chunk(body: bytes, settings: Settings) -> CheckedChunk:
    """Validate an uploaded chunk as a stream, a piece of text at a time: every line one
    JSON object with an action and a size, as Python's json reads it.

    Only one piece of text and its lines are held at once, whatever the chunk expands to,
    and the columns of a plain chunk (at most ``max_trace_chunk_events`` events). msgspec
    decodes a piece's lines one call a line (each must be one value; a line it reads,
    json reads too: its strings are checked UTF-8 apart); a piece it refuses is read line
    by line by json, which gives the refusal or lets it through as before.
    """
    if len(body) > settings.max_trace_chunk_bytes:
        raise PayloadTooLarge(f"trace chunk is larger than {settings.max_trace_chunk_bytes} bytes")
    limit = settings.max_trace_chunk_bytes * contract.TRACE_CHUNK_EXPANSION
    n = 0
    parts: list[viz_records.Columns] | None = []  # None once an event is not plain
    lengths: list[np.ndarray] = []
    stacks = ChunkStacks()
    for lines in _line_batches(body, limit):
        if not lines:
            continue
        valid, events = False, None
        if n + len(lines) <= settings.max_trace_chunk_events:
            valid, events = _decoded(lines, plain=parts is not None)
        if not valid:
            _check_lines(lines, n, settings)
        columns = None if events is None else viz_records.from_events(events)
        if parts is not None and columns is not None and stacks.add(events):
            parts.append(columns)
            lengths.append(np.fromiter(map(len, lines), np.int64, len(lines)))
        else:
            parts = None
        n += len(lines)
    if not parts:
        return CheckedChunk(n, None)
    kept = stacks.kept()
    return CheckedChunk(n, event_columns.pack(parts, np.concatenate(lengths), stacks=kept))


class ChunkStacks:
    """A chunk's distinct stacks as it is checked, and each event's (0: no frames).

    The export holds a chunk's table whole while it writes the chunk, so a table past
    ``MAX_STACK_TABLE_BYTES`` (nearly every event a stack of its own) is not kept: that
    chunk is read from its text, a block at a time."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {b"null": 0}
        self.texts: list[bytes] = []
        self.size = 0
        self.of_events: list[np.ndarray] = []

    def add(self, events: list[Any] | None) -> bool:
        """The events' stacks, by their JSON; False where one is not a stack the export
        writes from the table (``viz_frames.frames_of``), or the table grows too large."""
        if not events or type(events[0]) is not viz_records.Stacked:
            self.of_events.append(np.zeros(len(events or ()), np.uint32))
            return True
        ids, known = [], self.ids
        for raw in map(bytes, map(_FRAMES, events)):
            sid = known.get(raw)
            if sid is None:
                frames = viz_frames.frames_of(raw)
                if frames is None:
                    return False
                sid = known[raw] = len(self.texts) + 1 if frames else 0
                if frames:
                    self.texts.append(raw)
                    self.size += len(raw)
                    if self.size > MAX_STACK_TABLE_BYTES:
                        return False
            ids.append(sid)
        self.of_events.append(np.array(ids, np.uint32))
        return True

    def kept(self) -> tuple[list[bytes], np.ndarray] | None:
        if not self.texts:
            return None
        return self.texts, np.concatenate(self.of_events)


_FRAMES = operator.attrgetter("frames")


def _decoded(lines: list[bytes], plain: bool) -> tuple[bool, list[Any] | None]:
    """Whether msgspec reads every line as one JSON object with an action and a size
    (then json does too), and where ``plain`` and every event is, the events as
    ``viz_records.Checked``."""
    text = b"\n".join(lines)
    if not text.isascii():
        try:  # msgspec does not check the strings it skips; json does
            text.decode()
        except UnicodeDecodeError:
            return False, None
    if plain:
        for decoder in (viz_records.CHECKED, viz_records.STACKED):
            try:
                events: list[Any] = list(map(decoder.decode, lines))
            except (ValueError, RecursionError):
                continue
            if all(e.action is not UNSET and e.size is not UNSET for e in events):
                return True, events
            break
    try:
        valid = list(map(_VALID.decode, lines))
    except (ValueError, RecursionError):
        return False, None
    return all(e.action is not UNSET and e.size is not UNSET for e in valid), None


def _check_lines(lines: list[bytes], before: int, settings: Settings) -> None:
    """Lines ``before + 1`` on, one at a time, as json reads them: refuse the first that
    is not one JSON object with the required keys."""
    for n, line in enumerate(lines, start=before + 1):
        if n > settings.max_trace_chunk_events:
            raise PayloadTooLarge(f"a chunk holds at most {settings.max_trace_chunk_events} events")
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # nested past the interpreter's limit too
            raise ApiError(f"trace chunk line {n} is not JSON") from None
        if not isinstance(event, dict) or any(k not in event for k in REQUIRED_KEYS):
            raise ApiError(f"trace chunk line {n} is not an event with {REQUIRED_KEYS}")


@dataclass(frozen=True)
class InlineTrace:
    """A trace sent inside its outcome (a batch report's ``trace_gz``), checked."""

    body: bytes
    checked: CheckedChunk


def check_inline(trace_gz: str, settings: Settings) -> InlineTrace | str:
    """A batch report's inline trace decoded and checked as an uploaded chunk is; or why
    it is refused (the refusal is its outcome's alone)."""
    try:
        body = base64.b64decode(trace_gz, validate=True)
    except (binascii.Error, ValueError):
        return "trace_gz: not base64"
    try:
        return InlineTrace(body, check_chunk(body, settings))
    except ApiError as exc:
        return f"trace_gz: {exc.message}"


def store_chunk(
    session: Session,
    exp: Experiment,
    seq: int,
    body: bytes,
    n_events: int,
    columns: bytes | None = None,
) -> None:
    """Store a checked chunk as the worker sent it, with its columns where it has them;
    chunks arrive in order from 0."""
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
            event_columns=columns,
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


def inflate(data: bytes, piece: int) -> Iterator[bytes]:
    """A stored chunk's text in pieces of ``piece`` bytes (the last one shorter): with the
    whole chunk given, ISA-L fills each piece before it returns it, as zlib does."""
    decoder = isal_zlib.decompressobj(wbits=31)
    while data:
        out = decoder.decompress(data, piece)
        data = decoder.unconsumed_tail
        if out:
            yield out
    if rest := decoder.flush():
        yield rest


def iter_ndjson(session: Session, experiment_id: str, piece: int = 2**20) -> Iterator[bytes]:
    """The stored NDJSON itself, decompressed in pieces of at most ``piece`` bytes: no
    event is parsed or encoded again, and one chunk at a time is held. ISA-L inflates the
    same pieces as zlib in a third of the CPU time (docs/design.md, trace exports)."""
    for seq in _chunk_seqs(session, experiment_id):
        yield from inflate(_chunk_data(session, experiment_id, seq), piece)


class LineBlocks:
    """Pieces of text cut after their last newline: what is left waits for the next."""

    def __init__(self) -> None:
        self.rest = b""

    def cut(self, texts: Iterator[bytes]) -> Iterator[bytes]:
        for text in texts:
            cut = text.rfind(b"\n") + 1
            if not cut:
                self.rest += text
                continue
            yield b"".join((self.rest, memoryview(text)[:cut]))  # one copy, not two
            self.rest = text[cut:]

    def end(self) -> None:
        if self.rest:  # every stored chunk ends with a newline: nothing is left but by a bug
            raise RuntimeError("stored trace text does not end with a newline")


def iter_line_blocks(
    session: Session, experiment_id: str, piece: int = 2**20
) -> Generator[bytes, None, None]:
    """The stored NDJSON in blocks of whole lines (about ``piece`` bytes each, one line
    more where a line is longer): what ``iter_ndjson`` yields, cut after a newline."""
    blocks = LineBlocks()
    yield from blocks.cut(iter_ndjson(session, experiment_id, piece))
    blocks.end()


def iter_viz_blocks(
    session: Session, experiment_id: str, piece: int = event_columns.PIECE
) -> Generator[bytes | viz_records.Columns | viz_stacks.StackBlock, None, None]:
    """``iter_line_blocks``' blocks for the memory_viz export, a chunk's as the columns
    kept when it was uploaded where it has them (the same blocks, not decoded again; with
    its stacks where it has frames), else as text."""
    blocks = LineBlocks()
    for seq in _chunk_seqs(session, experiment_id):
        stored = session.scalar(
            select(TraceChunk.event_columns).where(
                TraceChunk.experiment_id == experiment_id, TraceChunk.seq == seq
            )
        )
        columns = None if stored is None else event_columns.blocks(bytes(stored), piece)
        if columns is not None and not blocks.rest:
            yield from columns
        else:
            yield from blocks.cut(inflate(_chunk_data(session, experiment_id, seq), piece))
    blocks.end()


def ahead(pieces: Generator[T, None, None], depth: int = 4) -> Iterator[T]:
    """``pieces`` made in a thread of their own, at most ``depth`` ahead of the reader, so
    making them overlaps with what the reader does with the piece before: decompressing
    (ISA-L and zlib let go of the GIL) under an export, or an export's next piece while the
    event loop sends this one. Only that thread touches ``pieces`` (and its session); when
    the reader stops, early or not, the thread closes ``pieces`` and is joined."""
    ready: queue.Queue[tuple[T | None, BaseException | None]] = queue.Queue(depth)
    stop = threading.Event()

    def give(item: tuple[T | None, BaseException | None]) -> bool:
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
