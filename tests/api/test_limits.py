"""Duplicates, overload and hostile input: each answered with a 4xx in the one shape."""

import base64
import json
import threading

import httpx

from tests.api.test_auth import bearer, create_token
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD


def test_a_repeated_idempotency_key_returns_the_first_experiment(client: httpx.Client) -> None:
    first = client.post("/v1/experiments", json=ADD, headers={"Idempotency-Key": "k-1"})
    again = client.post("/v1/experiments", json=ADD, headers={"Idempotency-Key": "k-1"})
    other = client.post("/v1/experiments", json=ADD, headers={"Idempotency-Key": "k-2"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert other.json()["id"] != first.json()["id"]
    assert len(client.get("/v1/experiments").json()["items"]) == 2


def test_concurrent_requests_with_one_key_queue_once(server: LiveServer) -> None:
    ids: list[str] = []

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            r = c.post("/v1/experiments", json=ADD, headers={"Idempotency-Key": "same"})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    with httpx.Client(base_url=server.url) as c:
        assert len(c.get("/v1/experiments").json()["items"]) == 1


def test_too_many_queued_is_429_with_retry_after(database_url: str) -> None:
    with LiveServer(make_settings(database_url, max_queued_per_token=3)) as live:
        with httpx.Client(base_url=live.url) as c:
            for _ in range(3):
                assert c.post("/v1/experiments", json=ADD).status_code == 202
            refused = c.post("/v1/experiments", json=ADD)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "30"
            assert refused.json()["error"]["type"] == "too_many_requests"
            exp_id = c.get("/v1/experiments").json()["items"][0]["id"]
            c.post(f"/v1/experiments/{exp_id}/cancel")
            assert c.post("/v1/experiments", json=ADD).status_code == 202


def test_the_queue_cap_counts_each_token_apart(database_url: str) -> None:
    # The cap is checked by the INSERT itself: refused, nothing is queued; another
    # token's queue is its own.
    first, second = create_token(database_url, "submit"), create_token(database_url, "admin")
    with LiveServer(make_settings(database_url, max_queued_per_token=2)) as live:
        with httpx.Client(base_url=live.url) as c:
            for _ in range(2):
                assert c.post("/v1/experiments", json=ADD, headers=bearer(first)).status_code == 202
            refused = c.post("/v1/experiments", json={**ADD, "tags": ["x"]}, headers=bearer(first))
            assert refused.status_code == 429, refused.text
            assert "2 experiments of yours are queued" in refused.json()["error"]["message"]
            assert c.post("/v1/experiments", json=ADD, headers=bearer(second)).status_code == 202
            listed = c.get("/v1/experiments", headers=bearer(second)).json()["items"]
            assert len(listed) == 3
            assert (
                c.get("/v1/experiments", params={"tag": "x"}, headers=bearer(second)).json()[
                    "items"
                ]
                == []
            )


def test_bodies_over_the_limit_are_413(database_url: str) -> None:
    with LiveServer(make_settings(database_url, max_body_bytes=10_000)) as live:
        with httpx.Client(base_url=live.url) as c:
            big = {**ADD, "tags": ["x" * 60] * 32, "params": {"pad": "y" * 20_000}}
            declared = c.post("/v1/experiments", json=big)
            assert declared.status_code == 413
            assert declared.json()["error"]["type"] == "payload_too_large"

            def chunks() -> object:
                yield json.dumps(big).encode()

            streamed = c.post(
                "/v1/experiments", content=chunks(), headers={"Content-Type": "application/json"}
            )
            assert streamed.status_code == 413
            assert c.get("/v1/experiments").json()["items"] == []


def test_hostile_input_gets_4xx_in_the_one_shape(client: httpx.Client) -> None:
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    cases = [
        b"{not json",
        b"[]",
        b'"just a string"',
        json.dumps({**ADD, "shape": [10**100]}).encode(),
        json.dumps({**ADD, "shape": "1000"}).encode(),
        json.dumps({**ADD, "repeat": 1e308}).encode(),
        json.dumps({**ADD, "timeout_s": float("inf")}).encode(),
        json.dumps({**ADD, "tags": ["a\x00b"]}).encode(),
        b'{"op": "add", "shape": [1], "params": {"other_shape": ' + deep + b"}}",
        b'{"op": "add", "shape": [1], "params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # Each of these answered 500 (or was stored, then failed to render or to run).
        _scenario(b'{"do": "create", "name": "x", "shape": [2], "label": "\\udfff"}'),
        _scenario(b'{"do": "create", "name": "x", "shape": [2], "fn": "full", "value": NaN}'),
        _scenario(b'{"do": "create", "name": "x", "shape": [2], "fn": "full", "value": -Infinity}'),
        _scenario(
            b'{"do": "create", "name": "x", "shape": [2], "fn": "full", "value": 1%s}'
            % (b"0" * 400)
        ),
        b'{"op": "full", "shape": [2], "device": "cpu", "params": {"value": 1%s}}' % (b"0" * 400),
        # A fill value the dtype cannot hold fails in torch: refused at submission too.
        json.dumps({**ADD, "op": "full", "dtype": "float16", "params": {"value": 1e5}}).encode(),
        _scenario(
            b'{"do": "create", "name": "x", "shape": [2], "fn": "full", "value": 256, '
            b'"dtype": "uint8"}'
        ),
        json.dumps({**ADD, "requirements": {"gpu_name": "H\x00200"}}).encode(),
        json.dumps({**ADD, "params": {"other_shape": ["a\x00"]}}).encode(),
    ]
    for body in cases:
        response = client.post(
            "/v1/experiments", content=body, headers={"Content-Type": "application/json"}
        )
        assert 400 <= response.status_code < 500, (
            body[:80],
            response.status_code,
            response.text[:200],
        )
        error = response.json()["error"]
        assert error["type"] and error["message"]
    assert client.get("/v1/experiments").json()["items"] == []


def _scenario(step: bytes) -> bytes:
    return b'{"op": "scenario", "device": "cpu", "steps": [' + step + b"]}"


def test_forged_cursors_and_nul_in_urls_get_4xx(client: httpx.Client) -> None:
    for stamp in (b"2999-01-01T00:00:00", b"9999-12-31T23:59:59-05:00", b"not a time"):
        cursor = base64.urlsafe_b64encode(stamp + b"|x").decode().rstrip("=")
        for path in ("/v1/experiments", "/ui/"):
            response = client.get(path, params={"cursor": cursor})
            assert response.status_code == 400, (path, stamp, response.text[:200])
            assert "not a cursor this API returned" in response.text  # JSON, or a page
    for params in ({"op": "a\x00b"}, {"tag": "\x00"}, {"device": "cpu\x00"}):
        response = client.get("/v1/experiments", params=params)
        assert response.status_code == 422, (params, response.text[:200])
        assert response.json()["error"]["type"] == "validation_error"
    assert client.get("/v1/experiments/a%00b").status_code == 422
    assert client.get("/v1/experiments").status_code == 200


def test_unicode_tags_round_trip(client: httpx.Client) -> None:
    tags = ["ünïcödé", "显存", "🔥gpu"]
    made = client.post("/v1/experiments", json={**ADD, "tags": tags}).json()
    assert client.get(f"/v1/experiments/{made['id']}").json()["spec"]["tags"] == tags
    found = client.get("/v1/experiments", params={"tag": "显存"}).json()["items"]
    assert [e["id"] for e in found] == [made["id"]]


def test_a_sweep_counts_against_the_queue_cap(database_url: str) -> None:
    with LiveServer(make_settings(database_url, max_queued_per_token=4)) as live:
        with httpx.Client(base_url=live.url) as c:
            grid = {"shape": [[8, 8], [16, 16], [32, 32]]}
            assert c.post("/v1/sweeps", json={"spec": ADD, "grid": grid}).status_code == 202
            refused = c.post("/v1/sweeps", json={"spec": ADD, "grid": grid})
            assert refused.status_code == 429, refused.text
            assert len(c.get("/v1/experiments").json()["items"]) == 3
