"""Trace chunk uploads: checked as a stream in bounded memory, stored as the worker sent
them, and a gzip member that was cut short is refused."""

import gzip
import json
import tracemalloc
import zlib
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select

from app.tables import TraceChunk
from tests.conftest import LiveServer, make_settings
from tests.helpers import claim, register, submit

STACKS = [
    [{"filename": f"torch/nn/modules/m{k + i}.py", "line": 100 + i, "name": f"f{k + i}"}]
    for k in range(4)
    for i in range(4)
]


def events(n: int, first: int = 0) -> list[dict[str, Any]]:
    """Allocator events with frames, as a worker traces them from a real op."""
    return [
        {
            "seq": i,
            "t_us": 3 * i,
            "action": "alloc" if i % 2 == 0 else "free",
            "addr": 0x7F0000000000 + (i // 2) * 4096,
            "size": 4096,
            "stream": 0,
            "frames": STACKS[(i // 2) % len(STACKS)] * 4,
        }
        for i in range(first, first + n)
    ]


def ndjson(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in rows)


def leased(client: httpx.Client) -> tuple[str, dict[str, str]]:
    exp = submit(client)
    got = claim(client, register(client))
    assert got is not None
    headers = {"X-Lease-Token": got["lease_token"], "Content-Type": "application/gzip"}
    return f"/v1/worker/experiments/{exp['id']}/trace", headers


def test_a_chunk_cut_short_on_a_line_boundary_is_refused(client: httpx.Client) -> None:
    url, headers = leased(client)
    # A gzip stream flushed after whole lines: it decompresses to complete events, but
    # the member's end and checksum never came.
    packer = zlib.compressobj(wbits=31)
    cut = packer.compress(ndjson(events(40))) + packer.flush(zlib.Z_SYNC_FLUSH)
    assert gzip.decompress(cut + packer.flush()) == ndjson(events(40))
    refused = client.put(f"{url}/0", content=cut, headers=headers)
    assert refused.status_code == 400, refused.text
    assert "cut short" in refused.json()["error"]["message"]
    trailing = client.put(
        f"{url}/0", content=gzip.compress(ndjson(events(3))) + b"x", headers=headers
    )
    assert trailing.status_code == 400
    blank = client.put(
        f"{url}/0", content=gzip.compress(b"\n" + ndjson(events(3))), headers=headers
    )
    assert blank.status_code == 400 and "line 1" in blank.json()["error"]["message"]


def test_chunks_are_stored_as_sent_and_read_back(database_url: str) -> None:
    with (
        LiveServer(make_settings(database_url)) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
    ):
        url, headers = leased(client)
        unended = client.put(
            f"{url}/0", content=gzip.compress(ndjson(events(3))[:-1]), headers=headers
        )
        assert unended.status_code == 400 and "newline" in unended.json()["error"]["message"]
        sent = [gzip.compress(ndjson(events(30)), 9), gzip.compress(ndjson(events(20, 30)))]
        for seq, body in enumerate(sent):
            answer = client.put(f"{url}/{seq}", content=body, headers=headers)
            assert answer.status_code == 200, answer.text
        again = client.put(f"{url}/1", content=sent[1], headers=headers)  # a retry replaces
        assert again.json() == {"seq": 1, "events": 20}
        exp_id = url.split("/")[-2]
        page = client.get(f"/v1/experiments/{exp_id}/trace", params={"limit": 100}).json()
        assert page["total"] == 50 and [e["seq"] for e in page["events"]] == list(range(50))
        streamed = client.get(f"/v1/experiments/{exp_id}/trace", params={"format": "ndjson"})
        assert [json.loads(line)["seq"] for line in streamed.text.splitlines()] == list(range(50))
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(
                select(TraceChunk.data)
                .where(TraceChunk.experiment_id == exp_id)
                .order_by(TraceChunk.seq)
            ).scalars()
            assert [bytes(b) for b in stored] == sent
    finally:
        engine.dispose()


@pytest.mark.parametrize("frames", [True, False])
def test_a_large_chunk_costs_the_api_little_memory(database_url: str, frames: bool) -> None:
    """With frames, about 0.4 MiB from about 30 MiB of events; without (plain: its
    columns are kept, ``event_columns``), the most events a chunk may hold."""
    rows = events(50_000) if frames else events(100_000)
    if not frames:
        for row in rows:
            del row["frames"]
    body = gzip.compress(ndjson(rows), 9)
    assert len(body) < 2**20
    with (
        LiveServer(make_settings(database_url)) as live,
        httpx.Client(base_url=live.url, timeout=120) as client,
    ):
        url, headers = leased(client)
        # The server is a thread of this process: tracemalloc sees what it allocates.
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            answer = client.put(f"{url}/0", content=body, headers=headers)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert answer.status_code == 200 and answer.json()["events"] == len(rows)
    grew = peak - before
    mib = len(body) / 2**20
    print(f"a {mib:.2f} MiB chunk of {len(rows)} events: API grew {grew / 2**20:.1f} MiB")
    assert grew <= 16 * 2**20
