"""Hostile and broken uploads: refused with 4xx, nothing in them runs, the API stays up."""

import gzip
import os
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.snapshots.test_import import post


class RunsACommand:
    """A pickle whose REDUCE calls os.system: what a malicious "snapshot" would carry."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def _refused(response: httpx.Response, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["type"] == error
    message: str = body["message"]
    return message


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("compress", [False, True])
def test_a_pickle_that_calls_os_system_is_refused_and_does_not_run(
    client: httpx.Client, tmp_path: Path, protocol: int, compress: bool
) -> None:
    marker = tmp_path / "pwned"
    payload = {"segments": [], "device_traces": [[RunsACommand(f"touch {marker}")]]}
    body = pickle.dumps(payload, protocol=protocol)
    assert b"system" in body
    response = post(client, gzip.compress(body) if compress else body, name="evil")
    message = _refused(response, 422, "snapshot_refused")
    assert "system" in message and "never a class or a function" in message
    assert not marker.exists()
    # Nothing was stored.
    assert client.get("/v1/experiments", params={"kind": "snapshot"}).json()["items"] == []


def test_a_gzip_bomb_is_refused(small_limits: httpx.Client) -> None:
    bomb = gzip.compress(b"\0" * 64 * 2**20, compresslevel=9)
    assert len(bomb) < 2**20  # under the upload limit; 64 MiB once expanded
    message = _refused(post(small_limits, bomb), 413, "payload_too_large")
    assert "expands past" in message


def test_an_upload_over_the_limit_is_refused(small_limits: httpx.Client) -> None:
    _refused(post(small_limits, b"\x80" * (2**20 + 1)), 413, "payload_too_large")


def _nested(depth: int) -> bytes:
    """Opcodes that build ``depth`` lists, each inside the one before (no recursion in
    the unpickler: its stack is a list)."""
    return b"]" * depth + b"a" * (depth - 1)


def test_deep_nesting_is_refused(client: httpx.Client) -> None:
    depth = 200_000
    _refused(post(client, b"\x80\x02" + _nested(depth) + b"."), 422, "snapshot_refused")
    # The same nesting where a trace entry's frames should be.
    entry = {"action": "alloc", "addr": 1, "size": 1, "frames": "HERE"}
    body = pickle.dumps({"device_traces": [[entry]]}, protocol=2)
    body = body.replace(b"X\x04\x00\x00\x00HERE", _nested(depth))
    assert "a frame is not a dict" in _refused(post(client, body), 422, "snapshot_refused")
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "empty"),
        (b"not a pickle at all", "not a pickle"),
        (pickle.dumps([1, 2, 3]), "not a memory snapshot"),
        (pickle.dumps({"device_traces": "x"}), "list of lists"),
        (pickle.dumps({"device_traces": [[{"action": "launch"}]]}), "unknown trace action"),
        (pickle.dumps({"device_traces": [[{"action": "alloc", "size": "1"}]]}), "integer"),
        (pickle.dumps({"segments": []})[:-3], "truncated"),
    ],
)
def test_what_is_not_a_snapshot_is_refused(client: httpx.Client, body: bytes, words: str) -> None:
    assert words in _refused(post(client, body), 422, "snapshot_refused")


def test_a_gzip_bomb_is_refused_by_its_ratio_as_it_arrives(client: httpx.Client) -> None:
    """4 GiB of zeros in about 4 MB (gzip members of 1 MiB each, one after another),
    under the default limits: refused by its expansion ratio within its first MiB."""
    member = gzip.compress(b"\0" * 2**20, compresslevel=9)
    bomb = member * 4096
    assert len(bomb) < 5 * 2**20
    message = _refused(post(client, bomb), 413, "payload_too_large")
    assert "more than 200 times" in message and "VRAMLAB_MAX_SNAPSHOT_GZIP_RATIO" in message
    read = int(message.split("its first ")[1].split(" bytes")[0])
    assert read <= 2**20
    # The API is free for the next import at once.
    ok = post(client, gzip.compress(pickle.dumps({"segments": [], "device_traces": [[]]})))
    assert ok.status_code in (201, 422), ok.text


def test_a_gzipped_snapshot_in_several_members_is_read(client: httpx.Client) -> None:
    from tests.snapshots.synthetic import dumps, training_snapshot

    body = dumps(training_snapshot(iterations=1))
    half = len(body) // 2
    response = post(client, gzip.compress(body[:half]) + gzip.compress(body[half:]))
    assert response.status_code == 201, response.text
    assert response.json()["gzipped"]
    truncated = post(client, gzip.compress(body)[:-9])
    assert _refused(truncated, 422, "snapshot_refused").startswith("truncated")
