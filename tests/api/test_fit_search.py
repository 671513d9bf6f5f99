"""How a fit search walks to its edge, driven through the worker protocol by a worker
that answers by rule (a value fits up to an edge; one variant times out) instead of
running models: predictions from the real predictor, trials as ordinary experiments."""

import time
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.helpers import claim, register, succeed
from vramlab.units import human_bytes

pytest.importorskip("transformers")

CAPACITY = 17_235_192  # tiny-gpt2 at seq_len 32 is predicted to fit a batch of 16 in this
# (dropout off: the figure this capacity was measured for; training keeps the config's
# dropout otherwise)
SPEC = {
    "op": "model",
    "shape": [],
    "device": "cpu",
    "params": {"model": "tiny-gpt2", "seq_len": 32, "dropout": 0.0},
}


def run_by_rule(
    client: httpx.Client,
    fit_id: str,
    edge: dict[str, int],
    vary: str = "batch_size",
    capacity: int = CAPACITY,
) -> dict[str, Any]:
    """Play the worker until the fit ends: a trial succeeds while the varied value is at
    most the edge for its micro_batches; bf16 trials time out."""
    worker = register(client)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fit: dict[str, Any] = client.get(f"/v1/fits/{fit_id}").json()
        if fit["status"] not in ("queued", "running"):
            return fit
        claimed = claim(client, worker, wait_s=0.5)
        if claimed is None:
            continue
        params = claimed["spec"]["params"]
        assert params["capacity_bytes"] == capacity
        if params["precision"] == "bf16":
            error = {"type": "timeout", "message": "ran past its timeout_s"}
        elif params[vary] <= edge[str(params["micro_batches"])]:
            assert succeed(client, claimed, model=None).status_code == 200
            continue
        else:
            error = {"type": "oom", "message": "out of memory"}
        body = {"lease_token": claimed["lease_token"], "status": "failed", "error": error}
        r = client.post(f"/v1/worker/experiments/{claimed['id']}/result", json=body)
        assert r.status_code == 200, r.text
    raise AssertionError("the fit never ended")


@pytest.mark.parametrize(
    ("edge", "tried"),
    [
        # Below the prediction: down by 1, 2, 4, 8, then bisect.
        (5, [16, 15, 13, 9, 1, 5, 7, 6]),
        # Above it: up by 1, 2, 4, 8, 16, then bisect.
        (40, [16, 17, 19, 23, 31, 47, 39, 43, 41, 40]),
        # Right at it: two trials.
        (16, [16, 17]),
    ],
)
@pytest.mark.one_engine
def test_trials_gallop_from_the_prediction_then_bisect_to_the_edge(
    database_url: str, edge: int, tried: list[int]
) -> None:
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        made = client.post(
            "/v1/fits",
            json={
                "spec": SPEC,
                "capacity_bytes": CAPACITY,
                "variants": [{}, {"micro_batches": 4}, {"precision": "bf16"}],
            },
        )
        assert made.status_code == 202, made.text
        fit = run_by_rule(client, made.json()["id"], {"1": edge, "4": 4 * edge})
    plain, micro, bf16 = fit["variants"]
    assert plain["predicted_max_fitting"] == 16
    assert plain["max_fitting"] == edge and plain["first_failing"] == edge + 1
    assert sorted(t["value"] for t in plain["trials"]) == sorted(tried)
    # micro_batches=4: every value tried is a multiple of 4, and the edge is one step.
    assert all(t["value"] % 4 == 0 for t in micro["trials"])
    assert micro["max_fitting"] == 4 * edge and micro["first_failing"] == 4 * edge + 4
    # A failure other than running out of memory stops that variant alone, saying why.
    assert bf16["state"] == "failed" and "timeout" in bf16["error"]
    assert len(bf16["trials"]) == 1
    assert fit["status"] == "failed" and "variant 2" in fit["error"]


def test_the_search_stops_at_max_value(database_url: str) -> None:
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        made = client.post(
            "/v1/fits", json={"spec": SPEC, "capacity_bytes": CAPACITY, "max_value": 3}
        )
        assert made.status_code == 202, made.text
        fit = run_by_rule(client, made.json()["id"], {"1": 40})
    (variant,) = fit["variants"]
    assert fit["status"] == "succeeded"
    assert variant["predicted_max_fitting"] == 3
    assert variant["max_fitting"] == 3 and variant["first_failing"] is None
    assert variant["upper_bound"] == 3 and "upper bound" in variant["note"]


@pytest.mark.one_engine
def test_the_plot_draws_the_predicted_curve_before_any_trial(database_url: str) -> None:
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        made = client.post("/v1/fits", json={"spec": SPEC, "capacity_bytes": CAPACITY})
        assert made.status_code == 202, made.text
        fit_id = made.json()["id"]
        deadline = time.monotonic() + 120  # no worker: the search predicts, then waits
        while time.monotonic() < deadline:
            [variant] = client.get(f"/v1/fits/{fit_id}").json()["variants"]
            if variant["predicted_max_fitting"] is not None:
                break
            time.sleep(0.2)
        svg = client.get(f"/v1/fits/{fit_id}/plot", params={"format": "svg"}).text
    points = variant["predicted_points"]
    assert not any(t["status"] == "succeeded" for t in variant["trials"])
    assert [p["value"] for p in points][:2] == [1, 2]
    assert max(p["value"] for p in points) > variant["predicted_max_fitting"] == 16
    fits = [p for p in points if (p["peak_reserved"] or p["peak_allocated"]) <= CAPACITY]
    assert max(p["value"] for p in fits) == 16
    assert "as given: predicted peak" in svg


def test_when_even_the_smallest_value_runs_out_of_memory_it_says_what_that_needs(
    database_url: str,
) -> None:
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        made = client.post("/v1/fits", json={"spec": SPEC, "capacity_bytes": 2**20})
        assert made.status_code == 202, made.text
        fit = run_by_rule(client, made.json()["id"], {"1": 0}, capacity=2**20)
        page = client.get(f"/ui/fits/{fit['id']}").text
    (variant,) = fit["variants"]
    assert variant["predicted_max_fitting"] == 0
    assert variant["max_fitting"] is None and variant["first_failing"] == 1
    [one] = [p for p in variant["predicted_points"] if p["value"] == 1]
    needs = human_bytes(one["peak_reserved"] or one["peak_allocated"])
    assert variant["note"].startswith(f"none fits: even 1 needs {needs}")
    assert f"even 1 needs {needs}" in page


@pytest.mark.one_engine
def test_a_sequence_length_stops_at_the_models_positions(database_url: str) -> None:
    """tiny-gpt2 has 256 positions: a capacity it never fills ends the search there,
    with no first failing value and a note saying why."""
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        spec = {**SPEC, "params": {"model": "tiny-gpt2", "batch_size": 1}}
        made = client.post(
            "/v1/fits", json={"spec": spec, "capacity_bytes": 64 * 2**20, "vary": "seq_len"}
        )
        assert made.status_code == 202, made.text
        fit = run_by_rule(client, made.json()["id"], {"1": 10**6}, "seq_len", 64 * 2**20)
    (variant,) = fit["variants"]
    assert fit["status"] == "succeeded"
    assert variant["predicted_max_fitting"] == 256
    assert variant["max_fitting"] == 256 and variant["first_failing"] is None
    assert variant["upper_bound"] == 256 and "256 positions" in variant["note"]
    assert [t["value"] for t in variant["trials"]] == [256]


@pytest.mark.one_engine
@pytest.mark.slow
def test_a_cuda_fit_is_predicted_on_what_the_allocator_reserves(database_url: str) -> None:
    """On CUDA the predicted edge is where the capped allocator's reserved peak passes the
    capacity (its segments' free holes included), not where the allocated peak does."""
    from workers.models.predict import predict

    params = {"model": "gpt2", "config": {"n_layer": 2}, "seq_len": 128, "dropout": 0.0}
    capacity = predict({**params, "batch_size": 3}, "cuda")["peak_reserved"] + 2**20

    def last(figure: str) -> int:
        batch = 0
        while True:
            answer = predict(
                {**params, "batch_size": batch + 1, "capacity_bytes": capacity}, "cuda"
            )
            if answer[figure] > capacity:
                return batch
            batch += 1

    reserved, allocated = last("peak_reserved"), last("peak_allocated")
    assert 1 <= reserved < allocated  # the case tells the two apart
    settings = make_settings(database_url, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        spec = {"op": "model", "shape": [], "device": "cuda", "params": params}
        made = client.post("/v1/fits", json={"spec": spec, "capacity_bytes": capacity})
        assert made.status_code == 202, made.text
        deadline = time.monotonic() + 300  # the search predicts in the background
        while time.monotonic() < deadline:
            [variant] = client.get(f"/v1/fits/{made.json()['id']}").json()["variants"]
            if variant["predicted_max_fitting"] is not None:
                break
            time.sleep(0.5)
    assert variant["predicted_max_fitting"] == reserved
