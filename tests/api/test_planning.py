"""Work per request is bounded: scenarios plan in time linear in their steps, a spec's
total work has a limit with a clear 422, and planning happens before the write
transaction, so a concurrent submit (or a worker's claim) is answered meanwhile.

Planning speed is measured in bench/planning.py, not asserted here."""

import threading
from typing import Any

import httpx
import pytest

from app.catalog.scenario.bounds import MAX_TENSOR_STEPS
from app.experiments import specs
from app.sweeps import service as sweeps
from tests.api.test_auth import bearer, create_token
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD


def scenario(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"op": "scenario", "shape": [1], "dtype": "float32", "device": "cpu", "steps": steps}


# The issue's 740-byte scenario: 40,960 named tensors, then 4,000 cheap steps (40 s to
# accept before, each of the 4,000 steps summing every named tensor).
ISSUE_740 = scenario(
    [{"do": "create", "name": f"t{i}", "shape": [1], "count": 4096} for i in range(10)]
    + [{"do": "repeat", "times": 4000, "steps": [{"do": "empty_cache"}]}]
)
HEAVY = scenario(
    [
        {
            "do": "repeat",
            "times": 19_000,
            "steps": [{"do": "create", "name": "t", "shape": [1], "count": 4096}],
        }
    ]
)


def test_the_issues_scenario_is_accepted_with_its_prediction(client: httpx.Client) -> None:
    r = client.post("/v1/experiments", json=ISSUE_740)
    assert r.status_code == 202, r.text
    prediction = r.json()["prediction"]
    assert prediction["peak_named_bytes"] == 40_960 * 4
    assert len(prediction["steps"]) == 11


def test_a_spec_past_the_work_bound_is_422_naming_it(client: httpx.Client) -> None:
    r = client.post("/v1/experiments", json=HEAVY)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["details"][0]["field"] == "steps"
    assert f"{MAX_TENSOR_STEPS:,} tensor-steps" in error["details"][0]["message"]


def test_a_sweep_plans_a_shared_scenario_once_and_bounds_the_rest(
    client: httpx.Client,
) -> None:
    heavy_ok = scenario(
        [
            {
                "do": "repeat",
                "times": 30,
                "steps": [{"do": "create", "name": "t", "shape": [1], "count": 4096}],
            }
        ]
    )
    # Points that differ outside the steps share one plan: 200 of them cost one.
    same = client.post(
        "/v1/sweeps", json={"spec": heavy_ok, "grid": {"repeat": list(range(1, 201))}}
    )
    assert same.status_code == 202, same.text
    # Points that each need their own heavy plan are bounded in sum.
    grid = {"dtype": ["float32", "float16", "bfloat16", "float64", "int32", "int64", "int8"]}
    # Each point alone is within the planner's bound (about 1,800 steps planned one by one,
    # the list halving each iteration); seven of them are not.
    exp = {"do": "op", "name": "x", "fn": "exp", "args": ["x"]}
    halve = {"do": "delete", "name": "xs", "every": 2}
    heavy_each = scenario(
        [
            {"do": "create", "name": "xs", "shape": [1], "count": 4096},
            {"do": "create", "name": "x", "shape": [8]},
            {"do": "repeat", "times": 100, "steps": [halve, *[exp] * 119]},
        ]
    )
    refused = client.post("/v1/sweeps", json={"spec": heavy_each, "grid": grid})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["error"]["details"][0]
    assert f"more than {sweeps.MAX_SWEEP_PLANNED_STEPS} steps one by one" in detail["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/experiments", ISSUE_740),
        ("/v1/sweeps", {"spec": ISSUE_740, "grid": {"repeat": [1, 2]}}),
    ],
)
def test_a_submit_is_answered_while_another_is_being_planned(
    database_url: str, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    # Hold one scenario's planning open; before, it ran inside the write transaction, so
    # on SQLite every other submit (and claim, and heartbeat) waited behind it.
    planning, release = threading.Event(), threading.Event()
    real = specs.plan_scenario

    def held(steps: Any, dtype: str, device: str) -> Any:
        planning.set()
        release.wait(60)
        return real(steps, dtype, device)

    monkeypatch.setattr(specs, "plan_scenario", held)
    statuses: list[int] = []
    with LiveServer(make_settings(database_url)) as live:

        def heavy() -> None:
            with httpx.Client(base_url=live.url, timeout=90) as c:
                statuses.append(c.post(path, json=body).status_code)

        thread = threading.Thread(target=heavy)
        thread.start()
        try:
            assert planning.wait(30)
            with httpx.Client(base_url=live.url, timeout=20) as c:
                light = c.post("/v1/experiments", json=ADD)
                assert light.status_code == 202, light.text
                register = c.post(
                    "/v1/worker/register",
                    json={"name": "w", "capabilities": {"device_types": ["cpu"]}},
                )
                assert register.status_code == 200, register.text
        finally:
            release.set()
            thread.join(90)
    assert statuses == [202]


def test_the_caller_is_checked_before_anything_is_planned(database_url: str) -> None:
    """A caller without the right token learns only that (401/403), whatever its spec
    would cost to plan: planning is work the service does for callers it knows."""
    reader = create_token(database_url, "read")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        for spec in (HEAVY, ISSUE_740):
            anonymous = c.post("/v1/experiments", json=spec)
            assert anonymous.status_code == 401, anonymous.text
            read_only = c.post("/v1/experiments", json=spec, headers=bearer(reader))
            assert read_only.status_code == 403, read_only.text
