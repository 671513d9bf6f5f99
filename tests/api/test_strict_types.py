"""Booleans are not numbers and not strings: a field that takes a number refuses
``false``, a query that takes a name refuses one it does not know (422, naming the
field); on SQLite and PostgreSQL."""

import httpx
import pytest

from tests.helpers import ADD, register, submit


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    assert field in [d["field"] for d in response.json()["error"]["details"]]


def test_a_claim_with_a_boolean_wait_is_refused(client: httpx.Client) -> None:
    worker = register(client)
    for wait in (False, True, "1"):
        response = client.post("/v1/worker/claim", json={"worker_id": worker, "wait_s": wait})
        _refused(response, "wait_s")
    # Numbers, whole or not, still wait.
    for wait in (0, 0.0):
        response = client.post("/v1/worker/claim", json={"worker_id": worker, "wait_s": wait})
        assert response.status_code == 204, response.text


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"repeat": True}, "repeat"),
        ({"warmup": False}, "warmup"),
        ({"timeout_s": True}, "timeout_s"),
        ({"priority": "1"}, "priority"),
        ({"shape": [True, 4]}, "shape[0]"),
        ({"allocator": {"expandable_segments": "true"}}, "allocator.expandable_segments"),
        ({"requirements": {"min_memory_bytes": True}}, "requirements.min_memory_bytes"),
    ],
)
def test_a_spec_with_a_boolean_for_a_number_is_refused(
    client: httpx.Client, change: dict[str, object], field: str
) -> None:
    _refused(client.post("/v1/experiments", json={**ADD, **change}), field)


def test_a_trace_filter_takes_only_actions_it_knows(client: httpx.Client) -> None:
    exp = submit(client)["id"]
    _refused(client.get(f"/v1/experiments/{exp}/trace", params={"action": "false"}), "action[0]")
    message = client.get(f"/v1/experiments/{exp}/trace", params={"action": "allok"}).text
    assert "'alloc'" in message
    ok = client.get(f"/v1/experiments/{exp}/trace", params={"action": ["alloc", "free"]})
    assert ok.status_code in (200, 404), ok.text
