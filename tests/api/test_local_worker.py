"""Right after `vramlab up`, its own worker is still starting: a submit waits for it to
register (it chooses the device) instead of answering that no live worker is connected.
The API is started as `up` starts it (with the local worker's token); the worker is
played over the protocol with that token."""

import threading
from typing import Any

import httpx

from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, CUDA_CAPS

TOKEN = "local-worker-secret"


def test_while_ups_worker_starts_a_submit_does_not_say_no_worker_is_connected(
    database_url: str,
) -> None:
    settings = make_settings(database_url, local_worker_token=TOKEN, local_worker_start_s=0.2)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        made = client.post("/v1/experiments", json=ADD)
    assert made.status_code == 202, made.text
    reason = made.json()["queue"]["reason"]
    assert "no live worker is connected" not in reason
    assert "`vramlab up` started has not registered yet" in reason


def test_a_submit_made_while_ups_worker_starts_waits_for_it(database_url: str) -> None:
    settings = make_settings(database_url, local_worker_token=TOKEN, local_worker_start_s=60)
    spec = {k: v for k, v in ADD.items() if k != "device"}  # the worker decides the device
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=90) as client:
        answers: list[dict[str, Any]] = []
        submit = threading.Thread(
            target=lambda: answers.append(client.post("/v1/experiments", json=spec).json())
        )
        submit.start()
        registered = client.post(
            "/v1/worker/register",
            json={"name": "up", "capabilities": CUDA_CAPS},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert registered.status_code == 200, registered.text
        submit.join(timeout=90)
    [exp] = answers
    assert exp["spec"]["device"] == "cuda:0"  # what the local worker offers
    assert exp["queue"]["runnable"] is True


def test_outside_up_nothing_waits(database_url: str) -> None:
    with LiveServer(make_settings(database_url)) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            made = client.post("/v1/experiments", json=ADD)
    assert made.json()["queue"]["reason"].startswith("no live worker is connected")


def test_a_cuda_preset_run_while_ups_worker_starts_waits_for_its_gpu(database_url: str) -> None:
    """Before, it was refused (409: no live worker has a GPU) on a GPU host at start-up."""
    settings = make_settings(database_url, local_worker_token=TOKEN, local_worker_start_s=60)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=90) as client:
        answers: list[httpx.Response] = []
        run = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/presets/transfer_pinned/runs", json={"size": "small"})
            )
        )
        run.start()
        registered = client.post(
            "/v1/worker/register",
            json={"name": "up", "capabilities": CUDA_CAPS},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert registered.status_code == 200, registered.text
        run.join(timeout=90)
    [made] = answers
    assert made.status_code == 202, made.text
    assert made.json()["spec"]["device"] == "cuda:0"
