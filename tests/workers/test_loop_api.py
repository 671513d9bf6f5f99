"""The worker loop against the real API over HTTP (a scripted runner, no torch): an
outcome the API refuses is stored as a short `report_refused` failure, and the worker
goes on to the next experiment."""

import importlib.metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.helpers import MEMORY, submit
from tests.workers.test_loop import FakeRunner, succeeded, with_trace
from vramlab.contract import MIN_WORKER_VERSION, ErrorType, Status
from workers.client import ApiClient, Refused
from workers.endings import Outcome
from workers.loop import WorkerLoop

LIMIT = 8 * 1024


class UninformedClient(ApiClient):
    """A worker that does not learn the API's limits (an older one): it sends the
    outcome as it is, and meets the API's own refusal."""

    def register(self, name: str, hostname: str, capabilities: dict[str, Any]) -> dict[str, Any]:
        reply = super().register(name, hostname, capabilities)
        reply.pop("limits", None)
        return reply


@pytest.mark.parametrize("client_class", [ApiClient, UninformedClient])
def test_an_outcome_over_the_apis_limit_is_stored_as_report_refused(
    database_url: str, client_class: type[ApiClient]
) -> None:
    outcomes = iter([succeeded(notes=["x" * 2 * LIMIT]), succeeded()])

    def script(**_: Any) -> Outcome:
        return next(outcomes)

    settings = make_settings(database_url, max_body_bytes=LIMIT, claim_wait_seconds=0.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        first, second = submit(http), submit(http)
        client = client_class(live.url)
        loop = WorkerLoop(client, FakeRunner(script), name="t", wait_s=0, max_experiments=2)
        try:
            assert loop.run() == 2
        finally:
            client.close()
        refused = http.get(f"/v1/experiments/{first['id']}").json()
        assert refused["status"] == Status.FAILED, refused
        assert refused["error"]["type"] == ErrorType.REPORT_REFUSED
        message = refused["error"]["message"]
        assert ("413" if client_class is UninformedClient else f"limit of {LIMIT}") in message
        assert http.get(f"/v1/experiments/{second['id']}").json()["status"] == Status.SUCCEEDED


class CountingClient(ApiClient):
    """Counts what each batch call carried."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.claimed: list[int] = []
        self.reported: list[int] = []
        self.uploads = 0

    def claim_many(self, worker_id: str, wait_s: float, most: int) -> list[dict[str, Any]]:
        got = super().claim_many(worker_id, wait_s, most)
        self.claimed.append(len(got))
        return got

    def report_many(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.reported.append(len(items))
        return super().report_many(items)

    def upload_trace(self, exp_id: str, token: str, seq: int, gz: bytes) -> None:
        self.uploads += 1
        super().upload_trace(exp_id, token, seq, gz)


def test_a_batching_loop_claims_and_reports_many_at_once_and_stores_each_outcome(
    database_url: str,
) -> None:
    n = 24
    count = iter(range(n))

    def script(work_dir: Path, **_: Any) -> Outcome:
        i = next(count)
        if i % 3 == 1:
            return with_trace(work_dir, 30 + i)
        if i % 3 == 2:
            error = {"type": "oom", "message": f"out of memory {i}"}
            return Outcome("failed", {"memory": dict(MEMORY)}, error, None, 0)
        return succeeded(notes=[f"run {i}"])

    settings = make_settings(database_url, claim_wait_seconds=0.0)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        ids = [submit(http)["id"] for _ in range(n)]
        client = CountingClient(live.url)
        loop = WorkerLoop(
            client, FakeRunner(script), name="t", wait_s=0, max_experiments=n, batch=8
        )
        try:
            assert loop.run() == n
        finally:
            client.close()
        # The first claim takes one (nothing ran yet); then whole batches of tiny runs.
        assert client.claimed[0] == 1 and max(client.claimed) == 8 and sum(client.claimed) == n
        assert max(client.reported) > 1 and sum(client.reported) == n
        assert client.uploads == 0  # the small traces went with their batch reports
        for i, exp_id in enumerate(ids):  # claimed in the order submitted
            exp = http.get(f"/v1/experiments/{exp_id}").json()
            assert exp["attempts"] == 1
            if i % 3 == 0:
                assert (exp["status"], exp["result"]["notes"]) == ("succeeded", [f"run {i}"])
            elif i % 3 == 1:
                assert exp["status"] == "succeeded"
                trace = http.get(f"/v1/experiments/{exp_id}/trace").json()
                assert len(trace["events"]) == 30 + i, trace
            else:
                assert exp["status"] == "failed" and exp["error"]["message"] == f"out of memory {i}"


def test_a_worker_says_its_version_and_an_old_one_is_refused_at_register(
    server: LiveServer,
) -> None:
    """The worker's client says its distribution's version at register: the API takes
    this one, and refuses one older than it speaks to, which the loop does not retry."""
    try:
        installed: str | None = importlib.metadata.version("vramlab-worker")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH only
        installed = None
    current = ApiClient(server.url)
    assert current.version == installed
    old = ApiClient(server.url, version="0.0.1")
    new_loop = WorkerLoop(current, FakeRunner(), name="new", wait_s=0)
    old_loop = WorkerLoop(old, FakeRunner(), name="old", wait_s=0)
    new_loop.capabilities = old_loop.capabilities = FakeRunner().capabilities()
    try:
        assert new_loop.register()
        with pytest.raises(Refused) as refused:
            old_loop.register()
    finally:
        current.close()
        old.close()
    assert refused.value.status_code == 400
    assert refused.value.message.startswith("worker_too_old: this worker is vramlab-worker 0.0.1")
    assert f"from vramlab-worker {MIN_WORKER_VERSION} on" in refused.value.message
    names = [w["name"] for w in httpx.get(f"{server.url}/v1/workers", timeout=30).json()]
    assert names == ["new"]
