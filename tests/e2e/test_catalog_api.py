"""The catalog through the API to a real worker: every preset, a representative set of
ops and a scenario, all on ONE `vramlab serve` + `vramlab worker --device cpu` pair."""

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.catalog.presets.articles import PRESETS
from tests.conftest import free_port
from tests.e2e.procs import env_for, start, stop, wait_done, wait_ready
from tests.op_cases import CASES

pytestmark = pytest.mark.slow
# One per family; the worker tests (tests/workers) run every op.
REPRESENTATIVE = (
    "randn",
    "where",
    "softmax",
    "conv2d",
    "einsum",
    "narrow",
    "cat",
    "to",
    "module_train_step",
    "mixed_device",
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("catalog-api")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(f"sqlite:///{tmp / 'api.db'}", VRAMLAB_CLAIM_WAIT_SECONDS="5")
    api = start(["serve", "--port", str(port)], env, tmp / "api.log")
    worker = None
    try:
        wait_ready(url, api)
        worker = start(["worker", "--api", url, "--device", "cpu"], env, tmp / "worker.log")
        with httpx.Client(base_url=url, timeout=30) as c:
            yield c
    finally:
        if worker is not None:
            stop(worker)
        stop(api)


def test_presets_are_listed_with_their_question_and_article(client: httpx.Client) -> None:
    listed = client.get("/v1/presets").json()
    assert [p["name"] for p in listed] == list(PRESETS)
    assert all(p["question"] and p["article_id"] in ("000", "001", "002", "003") for p in listed)
    assert all(p["article"] == f"docs/findings.md#article-{p['article_id']}" for p in listed)
    assert all(p["spec"]["device"] == "cuda" for p in listed)


def test_every_preset_runs_on_the_cpu_worker_or_is_refused(client: httpx.Client) -> None:
    queued: dict[str, str] = {}
    for name, preset in PRESETS.items():
        response = client.post(f"/v1/presets/{name}/runs", json={"device": "cpu", "size": "small"})
        if preset.needs_cuda:
            assert response.status_code == 422, response.text
            assert "needs a CUDA device" in response.json()["error"]["message"]
            continue
        assert response.status_code == 202, response.text
        assert response.json()["preset"] == name
        queued[name] = response.json()["id"]
    done = {name: wait_done(client, exp_id) for name, exp_id in queued.items()}
    for name, exp in done.items():
        if name == "inplace_add_requires_grad":
            assert exp["status"] == "failed" and exp["error"]["type"] == "autograd_error"
            continue
        assert exp["status"] == "succeeded", (name, exp["error"])
        assert exp["result"]["notes"], name
        assert f"preset:{name}" in exp["spec"]["tags"]
    holes = done["fragmentation_holes"]["result"]
    assert [s["do"] for s in holes["steps"]] == ["create", "delete", "create", "empty_cache"]
    assert done["fragmentation_holes"]["spec"]["steps"][0]["count"] == 64
    matrix = done["dtype_support_matrix"]["result"]["details"]["dtype_support"]["matrix"]
    assert "bfloat16" in matrix


def test_unknown_preset_is_404_and_bad_override_422(client: httpx.Client) -> None:
    assert client.post("/v1/presets/nope/runs").status_code == 404
    bad = client.post("/v1/presets/elementwise_add/runs", json={"size": "huge"})
    assert bad.status_code == 422


def test_representative_ops_run_through_the_api(client: httpx.Client) -> None:
    ids = {}
    for op in REPRESENTATIVE:
        shape, params, dtype = CASES[op]
        spec = {"op": op, "shape": shape, "params": params, "dtype": dtype, "device": "cpu"}
        response = client.post("/v1/experiments", json=spec)
        assert response.status_code == 202, response.text
        ids[op] = response.json()["id"]
    for op, exp_id in ids.items():
        exp = wait_done(client, exp_id)
        assert exp["status"] == "succeeded", (op, exp["error"])
        assert "placement" in exp["result"]
        if exp["prediction"]["exact"]:
            assert (
                exp["result"]["memory"]["delta_allocated"] == exp["prediction"]["delta_allocated"]
            )


def test_a_scenario_through_the_api(client: httpx.Client) -> None:
    steps: list[dict[str, Any]] = [
        {"do": "create", "name": "a", "fn": "ones", "shape": [64, 64]},
        {"do": "op", "name": "b", "fn": "matmul", "args": ["a", "a"]},
        {"do": "delete", "name": "a"},
    ]
    body = {"op": "scenario", "device": "cpu", "steps": steps}
    response = client.post("/v1/experiments", json=body)
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["steps"] == steps
    exp = wait_done(client, response.json()["id"])
    assert exp["status"] == "succeeded", exp["error"]
    assert [s["allocated_end"] for s in exp["result"]["steps"]] == [16384, 32768, 16384]
    bad = client.post("/v1/experiments", json={**body, "steps": [{"do": "exec"}]})
    assert bad.status_code == 422
    assert bad.json()["error"]["details"][0]["field"] == "steps[0].do"
    no_steps = client.post("/v1/experiments", json={"op": "add", "shape": [2], "steps": steps})
    assert no_steps.status_code == 422
