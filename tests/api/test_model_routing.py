"""Model experiments and fit trials go to workers of the device they name: in a fleet of
a CPU worker and a CUDA worker (both speaking the worker protocol), CUDA model work is
claimed by the CUDA worker only, CPU model work by either."""

import time
from typing import Any

import httpx

from tests.conftest import LiveServer, make_settings
from tests.helpers import CPU_CAPS, CUDA_CAPS, claim, register

MODEL = {"op": "model", "shape": [], "params": {"model": "tiny-gpt2", "seq_len": 32}}


def _fleet(client: httpx.Client) -> tuple[str, str]:
    return register(client, CPU_CAPS, "cpu-box"), register(client, CUDA_CAPS, "gpu-box")


def test_a_cuda_model_experiment_is_claimed_by_a_cuda_worker_only(database_url: str) -> None:
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        cpu, gpu = _fleet(client)
        made = client.post("/v1/experiments", json={**MODEL, "device": "cuda"})
        assert made.status_code == 202, made.text
        assert made.json()["queue"]["runnable"] is True
        assert claim(client, cpu) is None  # the CPU worker is offered nothing
        claimed = claim(client, gpu)
        assert claimed is not None and claimed["id"] == made.json()["id"]
        assert claimed["spec"]["device"] == "cuda:0"


def test_a_cuda_model_experiment_with_only_a_cpu_worker_waits_saying_why(
    database_url: str,
) -> None:
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        cpu = register(client, CPU_CAPS, "cpu-box")
        made = client.post("/v1/experiments", json={**MODEL, "device": "cuda:1"})
        assert made.status_code == 202, made.text
        queue = made.json()["queue"]
        assert queue["runnable"] is False and "cuda" in queue["reason"]
        assert claim(client, cpu) is None


def test_a_cpu_model_experiment_is_claimed_by_the_cpu_worker(database_url: str) -> None:
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        cpu, _gpu = _fleet(client)
        made = client.post("/v1/experiments", json={**MODEL, "device": "cpu"})
        assert made.status_code == 202, made.text
        claimed = claim(client, cpu)
        assert claimed is not None and claimed["id"] == made.json()["id"]


def _first_trial(client: httpx.Client, worker: str, fit_id: str) -> dict[str, Any] | None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        fit = client.get(f"/v1/fits/{fit_id}").json()
        if any(v["trials"] for v in fit["variants"]):
            return claim(client, worker, wait_s=0.5)
        time.sleep(0.1)
    raise AssertionError("the fit queued no trial")


def test_a_cuda_fits_trials_go_to_the_cuda_worker(database_url: str) -> None:
    settings = make_settings(database_url, model_predictions=False, fit_check_seconds=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        cpu, gpu = _fleet(client)
        made = client.post(
            "/v1/fits",
            json={"spec": {**MODEL, "device": "cuda"}, "capacity_bytes": 64 * 2**20},
        )
        assert made.status_code == 202, made.text
        assert _first_trial(client, cpu, made.json()["id"]) is None
        trial = claim(client, gpu, wait_s=0.5)
        assert trial is not None and trial["spec"]["device"] == "cuda:0"
        assert trial["spec"]["params"]["capacity_bytes"] == 64 * 2**20
