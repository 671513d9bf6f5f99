"""A stored chunk's events as the memory_viz export's columns, kept beside its text.

The upload checks every line of a chunk anyway (``traces.check_chunk``); where every
event of the chunk is one the export writes as records (``viz_records``: no frames,
values of the expected JSON types, known actions), the check's decoded fields are kept
as columns, so the export reads them instead of decoding the text again. A chunk whose
events are such but for their frames (each a list of ``{"filename", "line", "name"}``,
``viz_frames.frames_of``) keeps the same columns, then a table of its distinct stacks
(each as its JSON) and a stack id an event (0: none): a second format of the same blob,
which the export writes with ``viz_stacks``. The export cuts
the text in blocks of lines (``traces.iter_line_blocks``) and writes each block on its
own (the narrowest int opcode of each block's column, a thousand entries per batch from
each block's start), so the columns keep where those blocks end: ``blocks`` gives the
very blocks the text would have given, as columns.

Stored as one zlib stream: a header (the block size the cuts were made for, the events,
the blocks), the lines in each block, then each column in the narrowest little-endian
int that holds it, the times as steps from the one before (a third smaller in all: 4.6
MB for the bench's million events, beside 14.4 MB of gzip text); with stacks, their
count, lengths and JSON, then the ids as 4-byte ints. A chunk holds at most
``MAX_TRACE_CHUNK_EVENTS`` events, so its columns are at most a few MiB; the export
makes one block's arrays at a time from them.
"""

import struct
from collections.abc import Iterator, Sequence

import numpy as np
from isal import isal_zlib

from app.traces.viz_records import Columns
from app.traces.viz_stacks import StackBlock, StackTable

PIECE = 2**20  # the export's block of text (``traces.iter_line_blocks``)
_MAGIC = b"vc1"
_STACKS_MAGIC = b"vc2"  # the same, then the chunk's stacks and a stack id an event
_HEADER = struct.Struct("<3sIIIB")  # magic, piece, events, blocks, flags
_NO_ADDR = 1  # flags: a null address is marked (else none is)
_INTS = ("addr", "size", "stream", "time")
_WIDTHS = ((np.int8, b"b"), (np.int16, b"h"), (np.int32, b"i"), (np.int64, b"q"))
_DTYPES = {code: np.dtype(dtype).newbyteorder("<") for dtype, code in _WIDTHS}
_LEVEL = 1  # the columns compress to about a third at the fastest level


def block_lengths(line_lengths: np.ndarray, piece: int = PIECE) -> np.ndarray:
    """Lines in each block, as ``traces.iter_line_blocks`` cuts a chunk's text: the text
    comes in pieces of ``piece`` bytes and a block ends at the last newline of each piece
    that holds one. ``line_lengths`` are the lines' lengths without their newlines."""
    if not line_lengths.size:
        return line_lengths
    piece_of_newline = (np.cumsum(line_lengths + 1) - 1) // piece
    last = np.flatnonzero(np.append(piece_of_newline[1:] != piece_of_newline[:-1], True))
    return np.diff(last + 1, prepend=0)


def pack(
    parts: Sequence[Columns],
    line_lengths: np.ndarray,
    piece: int = PIECE,
    stacks: tuple[Sequence[bytes], np.ndarray] | None = None,
) -> bytes:
    """A chunk's columns (its lines' in order, in any parts) as stored; with ``stacks``
    (the chunk's distinct stacks as their JSON, and each event's: 0 none, else 1 + its
    index), those too."""
    counts = block_lengths(line_lengths, piece).astype("<u4")
    column = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _INTS}
    code = np.concatenate([p.code for p in parts])
    no_addr = np.concatenate([p.no_addr for p in parts])
    flags = _NO_ADDR if no_addr.any() else 0
    magic = _MAGIC if stacks is None else _STACKS_MAGIC
    out = [_HEADER.pack(magic, piece, code.size, counts.size, flags), counts.tobytes()]
    out.append(code.astype(np.int8).tobytes())
    if flags & _NO_ADDR:
        out.append(no_addr.tobytes())
    column["time"] = np.diff(column["time"], prepend=0)  # times grow: small steps
    for name in _INTS:
        values = column[name]
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        for dtype, letter in _WIDTHS:
            info = np.iinfo(dtype)
            if info.min <= low and high <= info.max:
                out += [letter, values.astype(_DTYPES[letter]).tobytes()]
                break
    if stacks is not None:
        texts, ids = stacks
        lengths = np.array([len(t) for t in texts], "<u4")
        out += [struct.pack("<I", len(texts)), lengths.tobytes(), *texts]
        out.append(ids.astype("<u4").tobytes())
    return isal_zlib.compress(b"".join(out), _LEVEL)


def blocks(stored: bytes, piece: int = PIECE) -> Iterator[Columns | StackBlock] | None:
    """The export's blocks of a chunk as columns, one at a time (with their stacks where
    the chunk has frames); None where they were cut for another block size (the text is
    read instead)."""
    data = isal_zlib.decompress(stored)
    magic, cut_for, n, n_blocks, flags = _HEADER.unpack_from(data)
    if magic not in (_MAGIC, _STACKS_MAGIC) or cut_for != piece:
        return None
    return _blocks(memoryview(data), n, n_blocks, flags, magic == _STACKS_MAGIC)


def _blocks(
    data: memoryview, n: int, n_blocks: int, flags: int, with_stacks: bool
) -> Iterator[Columns | StackBlock]:
    at = _HEADER.size
    counts = np.frombuffer(data, "<u4", n_blocks, at)
    at += 4 * n_blocks
    code = np.frombuffer(data, np.int8, n, at)
    at += n
    no_addr = None
    if flags & _NO_ADDR:
        no_addr = np.frombuffer(data, bool, n, at)
        at += n
    stored: dict[str, np.ndarray] = {}
    for name in _INTS:
        dtype = _DTYPES[bytes(data[at : at + 1])]
        stored[name] = np.frombuffer(data, dtype, n, at + 1)
        at += 1 + n * dtype.itemsize
    stored["time"] = np.cumsum(stored["time"], dtype=np.int64)
    table, ids = None, None
    if with_stacks:
        (n_stacks,) = struct.unpack_from("<I", data, at)
        lengths = np.frombuffer(data, "<u4", n_stacks, at + 4).tolist()
        at += 4 + 4 * n_stacks
        texts = []
        for length in lengths:
            texts.append(bytes(data[at : at + length]))
            at += length
        table, ids = StackTable(texts), np.frombuffer(data, "<u4", n, at)
    start = 0
    for count in counts.tolist():
        end = start + count
        ints = {name: stored[name][start:end].astype(np.int64) for name in _INTS}
        columns = Columns(
            code=code[start:end].copy(),
            no_addr=np.zeros(count, bool) if no_addr is None else no_addr[start:end].copy(),
            **ints,
        )
        if table is None or ids is None:
            yield columns
        else:
            yield StackBlock(columns, ids[start:end].astype(np.int64), table)
        start = end
