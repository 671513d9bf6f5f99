"""End to end: `vramlab worker --concurrency 2` runs two experiments at once."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.procs import VRAMLAB, env_for, start, stop, wait_done, wait_ready, wait_status

pytestmark = pytest.mark.slow
PAIR = ["--concurrency", "2"]
ONE = ["--max-experiments", "1"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(
        f"sqlite:///{tmp_path / 'c.db'}",
        VRAMLAB_DIAGNOSTIC_OPS="true",
        VRAMLAB_CLAIM_WAIT_SECONDS="5",
    )
    log = tmp_path / "log"
    api = subprocess.Popen(
        [*VRAMLAB, "serve", "--port", str(port)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_ready(url, api)
        worker = subprocess.Popen(
            [*VRAMLAB, "worker", "--api", url, "--device", "cpu", "--name", "pair", *PAIR],
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        yield url
        assert stop(worker) == 0, log.read_text()[-3000:]
    finally:
        if worker is not None:
            stop(worker)
        stop(api)


def test_two_experiments_share_the_device_and_say_so(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        long = {"op": "sleep", "shape": [4], "params": {"seconds": 60}, "device": "cpu"}
        slow = client.post("/v1/experiments", json=long).json()
        wait_status(client, slow["id"], "running", seconds=120)
        quick = {"op": "add", "shape": [64, 64], "device": "cpu"}
        done = wait_done(client, client.post("/v1/experiments", json=quick).json()["id"])
        assert done["status"] == "succeeded", done["error"]
        # The sleep was running the whole time: two experiments shared the CPU.
        assert done["result"]["environment"]["concurrent"] == 2
        assert done["result"]["memory"]["delta_allocated"] == done["prediction"]["delta_allocated"]
        assert client.post(f"/v1/experiments/{slow['id']}/cancel").status_code == 200
        assert wait_done(client, slow["id"])["status"] == "cancelled"
        live = sorted(w["name"] for w in client.get("/v1/workers").json() if w["live"])
        assert live == ["pair/0", "pair/1"]


def test_max_experiments_is_the_workers_whatever_its_loops(tmp_path: Path) -> None:
    """`--max-experiments 1` with two loops: one experiment runs, then the worker exits
    (each loop counted its own, so the idle one waited for work forever)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(f"sqlite:///{tmp_path / 'm.db'}", VRAMLAB_CLAIM_WAIT_SECONDS="1")
    api = start(["serve", "--port", str(port)], env, tmp_path / "log")
    try:
        wait_ready(url, api)
        with httpx.Client(base_url=url, timeout=30) as client:
            quick = {"op": "add", "shape": [64, 64], "device": "cpu"}
            ids = [client.post("/v1/experiments", json=quick).json()["id"] for _ in range(3)]
            done = subprocess.run(
                [*VRAMLAB, "worker", "--api", url, "--device", "cpu", *PAIR, *ONE],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,  # a bound on a hang, not a timing threshold
            )
            assert done.returncode == 0, done.stderr[-3000:]
            statuses = sorted(client.get(f"/v1/experiments/{i}").json()["status"] for i in ids)
            assert statuses == ["queued", "queued", "succeeded"]
    finally:
        stop(api)
