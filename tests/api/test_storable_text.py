"""Text that no database stores (NUL, which PostgreSQL refuses; a lone UTF-16 surrogate,
which no UTF-8 database holds) is a 422 wherever it is sent: in any string of any JSON
body, in a form, in a query or path parameter. Each string of a valid body of each
operation is replaced in turn, on SQLite and on PostgreSQL, with tokens on."""

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.api.test_auth import bearer, create_token
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, CPU_CAPS, MEMORY

BAD = ("a\x00b", "\ud800", "x\udfffy")
PRESET = "gpu_copy_stays_alive"


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every string in ``value`` (dict values and list items)."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, (*path, i))


def _replaced(value: Any, path: tuple[Any, ...], new: str) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    return [_replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _bodies(exp_id: str, lease: str, worker_id: str) -> list[tuple[str, dict[str, Any]]]:
    result = {
        "memory": MEMORY,
        "notes": ["a note"],
        "environment": {"torch": "2.13", "hostname": "h", "device": "cpu"},
        "phases": [{"name": "op", "memory": MEMORY}],
    }
    outcome = {"lease_token": lease, "status": "succeeded", "result": result}
    failed = {"lease_token": lease, "status": "failed", "error": {"type": "oom", "message": "m"}}
    worker = f"/v1/worker/experiments/{exp_id}"
    return [
        ("/v1/experiments", {**ADD, "tags": ["t"], "params": {"other_shape": [2]}}),
        (
            "/v1/worker/register",
            {
                "name": "w",
                "hostname": "h",
                "capabilities": {
                    **CPU_CAPS,
                    "device_types": ["cpu", "cuda"],
                    "gpus": [{"index": 0, "name": "H100", "total_memory": 2**30}],
                    "cuda": "13.0",
                    "flag": "on",
                },
            },
        ),
        ("/v1/worker/claim", {"worker_id": worker_id, "wait_s": 0}),
        ("/v1/worker/claims", {"worker_id": worker_id, "wait_s": 0, "max": 2}),
        ("/v1/worker/stop", {"worker_id": worker_id}),
        (f"{worker}/heartbeat", {"lease_token": lease, "progress": {"state": "running"}}),
        (f"{worker}/release", {"lease_token": lease}),
        (f"{worker}/result", outcome),
        (f"{worker}/result", failed),
        ("/v1/worker/results", {"results": [{**outcome, "experiment_id": exp_id}]}),
        ("/v1/sweeps", {"spec": ADD, "grid": {"dtype": ["float32", "float16"]}}),
        (
            "/v1/fits",
            {
                "spec": {"op": "model", "device": "cpu", "params": {"model": "gpt2"}},
                "requirements": {"gpu_name": "H100"},
                "variants": [{"precision": "bf16-autocast"}],
            },
        ),
        (f"/v1/presets/{PRESET}/runs", {"device": "cpu", "dtype": "float32", "tags": ["t"]}),
        (
            "/v1/plans",
            {
                "spec": {"op": "model", "params": {"model": "gpt2", "config": {"k": "v"}}},
                "gpus": ["H100"],
                "variants": [{"precision": "bf16-autocast"}],
            },
        ),
    ]


def test_text_no_database_stores_is_422_everywhere(database_url: str) -> None:
    admin = create_token(database_url, "admin")
    settings = make_settings(database_url, auth="on", claim_wait_seconds=0.2)
    with (
        LiveServer(settings) as live,
        httpx.Client(base_url=live.url, headers=bearer(admin), timeout=30) as c,
    ):
        worker_id = c.post(
            "/v1/worker/register", json={"name": "w", "capabilities": CPU_CAPS}
        ).json()["worker_id"]
        assert c.post("/v1/experiments", json=ADD).status_code == 202
        claimed = c.post("/v1/worker/claim", json={"worker_id": worker_id, "wait_s": 0}).json()
        bodies = _bodies(claimed["id"], claimed["lease_token"], worker_id)
        # Every operation that takes a JSON body is here: one added later fails this first.
        documented = {
            path
            for path, operations in c.get("/openapi.json").json()["paths"].items()
            for op in operations.values()
            if "application/json" in op.get("requestBody", {}).get("content", {})
        }
        covered = {
            p.replace(claimed["id"], "{experiment_id}").replace(PRESET, "{name}") for p, _ in bodies
        }
        assert covered == documented, documented ^ covered
        answers: list[tuple[str, tuple[Any, ...], str, int]] = []
        for path, body in bodies:
            for where in _strings(body):
                for bad in BAD:
                    sent = json.dumps(_replaced(body, where, bad)).encode()
                    r = c.post(path, content=sent, headers={"Content-Type": "application/json"})
                    answers.append((path, where, bad, r.status_code))
        wrong = [a for a in answers if a[3] != 422]
        assert not wrong, wrong
        # The experiment is still the worker's: nothing above changed it.
        assert c.get(f"/v1/experiments/{claimed['id']}").json()["status"] == "running"
        # A URL: a NUL is refused before any route; a lone surrogate's bytes are not UTF-8,
        # so they are read as U+FFFD, which every database stores.
        assert c.post(f"/v1/worker/experiments/{claimed['id']}%00/release").status_code == 422
        assert c.get(f"/v1/experiments?worker_id={worker_id}%00").status_code == 422
        assert c.get("/v1/experiments?tag=%ED%A0%80").json()["items"] == []


@pytest.mark.parametrize("bad", BAD)
def test_text_no_database_stores_is_refused_in_the_pages_forms(database_url: str, bad: str) -> None:
    with (
        LiveServer(make_settings(database_url)) as live,
        httpx.Client(base_url=live.url, timeout=30, headers={"Origin": live.url}) as c,
    ):
        for url, form in (
            (f"/ui/presets/{PRESET}/run", {"device": bad, "size": "small"}),
            ("/ui/signin", {"token": bad}),
        ):
            sent = "&".join(f"{k}={_form_quote(v)}" for k, v in form.items())
            r = c.post(
                url,
                content=sent.encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert 400 <= r.status_code < 500, (url, r.status_code, r.text[:300])


def _form_quote(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")
