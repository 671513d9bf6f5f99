"""The worker loop against the real API over HTTP (a scripted runner, no torch): an
outcome the API refuses is stored as a short `report_refused` failure, and the worker
goes on to the next experiment."""

from typing import Any

import httpx
import pytest

from app.contract import ErrorType, Status
from tests.conftest import LiveServer, make_settings
from tests.helpers import submit
from tests.workers.test_loop import FakeRunner, succeeded
from workers.client import ApiClient
from workers.loop import WorkerLoop
from workers.runner import Outcome

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
