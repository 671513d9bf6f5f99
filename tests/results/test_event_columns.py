"""The columns a plain chunk keeps when it is uploaded: the memory_viz export reads them
instead of the text and gives the very bytes the text gives (chunks stored without
them, as before migration 0012, are read from their text); the upload's check refuses
what it refused and takes what it took."""

import gzip
import json
import random
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, select, update

from app.tables import TraceChunk
from app.traces import event_columns, viz_records
from app.traces import service as traces
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, MATMUL, claim, register, submit
from tests.results.trace_data import churn, events, many_events, upload, varied_chunks


def _export(client: httpx.Client, exp_id: str) -> bytes:
    response = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
    assert response.status_code == 200, response.text
    return response.content


def _stored(database_url: str, exp_id: str) -> list[bytes | None]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(TraceChunk.event_columns)
                .where(TraceChunk.experiment_id == exp_id)
                .order_by(TraceChunk.seq)
            ).scalars()
            return [None if r is None else bytes(r) for r in rows]
    finally:
        engine.dispose()


def _forget_columns(database_url: str, exp_id: str) -> None:
    """The chunks as they were stored before migration 0012: their text alone."""
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                update(TraceChunk)
                .where(TraceChunk.experiment_id == exp_id)
                .values(event_columns=None)
            )
    finally:
        engine.dispose()


def _plain_then_odd() -> list[list[dict[str, Any]]]:
    """Three chunks: plain, one with a float size (not plain), plain again."""
    rows = churn(3000, seed=3)
    rows[1500]["size"] = float(rows[1500]["size"])
    return [rows[:1000], rows[1000:2000], rows[2000:]]


def _frames_then_plain() -> list[list[dict[str, Any]]]:
    """A chunk with frames, then plain ones: once a block with frames has been alive,
    the export takes every later block the general way, the columns' too."""
    return [events(), churn(2000, seed=4, first=len(events()))]


TRACES = {
    # Two chunks of several export blocks each (about 2.6 and 1.3 MB of text).
    "plain, many blocks": (MATMUL, lambda: [churn(20_000), churn(10_000, 1, 20_000)], [1, 1]),
    "cpu": (ADD, lambda: [many_events(1500)[:2000], many_events(1500)[2000:]], [1, 1]),
    "plain, odd, plain": (MATMUL, _plain_then_odd, [1, 0, 1]),
    "frames, then plain": (MATMUL, _frames_then_plain, [1, 1]),
    "varied": (MATMUL, varied_chunks, [1, 0, 1, 1, 1]),
}


@pytest.mark.parametrize("name", TRACES)
def test_the_columns_give_the_bytes_the_text_gives(
    client: httpx.Client, database_url: str, name: str
) -> None:
    spec, chunks, with_columns = TRACES[name]
    exp_id = upload(client, spec, chunks())
    assert [c is not None for c in _stored(database_url, exp_id)] == [bool(w) for w in with_columns]
    from_columns = _export(client, exp_id)
    _forget_columns(database_url, exp_id)
    assert _stored(database_url, exp_id) == [None] * len(with_columns)
    assert _export(client, exp_id) == from_columns


def _text_blocks(text: bytes, piece: int) -> list[int]:
    """Lines in each block of the text, as the export cuts it (``iter_line_blocks``)."""
    blocks = traces.LineBlocks()
    counts = [b.count(b"\n") for b in blocks.cut(traces.inflate(gzip.compress(text), piece))]
    blocks.end()
    return counts


@pytest.mark.parametrize("seed", range(6))
def test_the_columns_keep_where_the_export_cuts_the_text(seed: int) -> None:
    """Pieces of 100 bytes and lines of 1 to 300 (some longer than a piece, some ending
    at a piece's end): the blocks kept are those the text is cut in."""
    rnd = random.Random(seed)
    lengths = [rnd.choice([1, 9, 99, 100, 101, 150, 199, 300]) for _ in range(400)]
    text = b"".join(b"x" * (n - 1) + b"\n" for n in lengths)
    kept = event_columns.block_lengths(np.array(lengths) - 1, piece=100)
    assert kept.tolist() == _text_blocks(text, 100)
    assert kept.sum() == len(lengths)


def test_columns_cut_for_another_block_size_are_not_read() -> None:
    rows = churn(500)
    lines = [json.dumps(r).encode() for r in rows]
    columns = viz_records.from_events([viz_records.CHECKED.decode(line) for line in lines])
    assert columns is not None
    lengths = np.array([len(line) for line in lines])
    stored = event_columns.pack([columns], lengths, piece=4096)
    assert event_columns.blocks(stored, piece=2**20) is None
    got = event_columns.blocks(stored, piece=4096)
    assert got is not None
    blocks = list(got)
    assert [len(b.code) for b in blocks] == _text_blocks(b"".join(x + b"\n" for x in lines), 4096)
    for name in ("code", "addr", "no_addr", "size", "stream", "time"):
        joined = np.concatenate([getattr(b, name) for b in blocks])
        assert joined.tolist() == getattr(columns, name).tolist(), name


def _lines(rows: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


GOOD = _lines(churn(5))
DEEP = b'{"action":"alloc","size":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"

REFUSED = {
    "not JSON": ([*GOOD[:2], b"{not json", *GOOD[2:]], "line 3 is not JSON"),
    "no size": ([*GOOD, b'{"action":"alloc"}'], "line 6 is not an event"),
    "not an object": ([b"[1, 2]", *GOOD], "line 1 is not an event"),
    "two on a line": ([GOOD[0], GOOD[1] + b" " + GOOD[2]], "line 2 is not JSON"),
    "blank line": ([GOOD[0], b"", GOOD[1]], "line 2 is not JSON"),
    # msgspec skips this field's string without checking it; json refuses it.
    "invalid UTF-8": ([GOOD[0], b'{"action":"alloc","size":1,"x":"\xc0\xaf"}'], "line 2 is"),
    # Past the interpreter's limit on nesting: json raised RecursionError (a 500).
    "nested too deep": ([GOOD[0], DEEP], "line 2 is not JSON"),
}


def _leased(client: httpx.Client) -> tuple[str, dict[str, str]]:
    exp = submit(client, ADD)
    got = claim(client, register(client))
    assert got is not None
    headers = {"X-Lease-Token": got["lease_token"], "Content-Type": "application/gzip"}
    return f"/v1/worker/experiments/{exp['id']}/trace", headers


@pytest.mark.parametrize("name", REFUSED)
def test_bad_chunks_are_refused_as_before(client: httpx.Client, name: str) -> None:
    lines, message = REFUSED[name]
    url, headers = _leased(client)
    body = gzip.compress(b"".join(line + b"\n" for line in lines))
    refused = client.put(f"{url}/0", content=body, headers=headers)
    assert refused.status_code == 400, refused.text
    assert message in refused.json()["error"]["message"]


ODD_BUT_JSON = {
    "NaN": b'{"action":"alloc","size":1,"t_us":NaN}',
    "lone surrogate": b'{"action":"alloc","size":1,"x":"\\ud800"}',
    "past 64 bits": b'{"action":"alloc","size":1,"addr":%d}' % 2**70,
    "unknown action": b'{"action":"mystery","size":1}',
    "frames": b'{"action":"alloc","size":1,"frames":[{"filename":"a.py","line":1}]}',
    "a BOM": b'\xef\xbb\xbf{"action":"alloc","size":1}',
}


@pytest.mark.parametrize("name", ODD_BUT_JSON)
def test_what_json_reads_is_still_taken_without_columns(
    client: httpx.Client, database_url: str, name: str
) -> None:
    url, headers = _leased(client)
    lines = [*GOOD, ODD_BUT_JSON[name], *GOOD]
    body = gzip.compress(b"".join(line + b"\n" for line in lines))
    taken = client.put(f"{url}/0", content=body, headers=headers)
    assert taken.status_code == 200, taken.text
    assert taken.json()["events"] == len(lines)
    assert _stored(database_url, url.split("/")[-2]) == [None]


def test_too_many_events_are_refused_after_an_earlier_bad_line(database_url: str) -> None:
    settings = make_settings(database_url, max_trace_chunk_events=8)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:
        url, headers = _leased(client)
        many = gzip.compress(b"".join(line + b"\n" for line in GOOD * 2))
        refused = client.put(f"{url}/0", content=many, headers=headers)
        assert refused.status_code == 413 and "at most 8" in refused.json()["error"]["message"]
        bad = gzip.compress(b"".join(line + b"\n" for line in [*GOOD, b"{", *GOOD]))
        refused = client.put(f"{url}/0", content=bad, headers=headers)
        assert refused.status_code == 400 and "line 6" in refused.json()["error"]["message"]
