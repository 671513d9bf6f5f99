"""End to end: the real `vramlab` processes, started as the README starts them."""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.procs import (
    VRAMLAB,
    env_for,
    kill_group,
    live_workers,
    start,
    stop,
    wait_done,
    wait_ready,
    wait_worker,
)
from tests.helpers import cuda_available

pytestmark = pytest.mark.slow


@pytest.fixture
def service(database_url: str, tmp_path: Path) -> Iterator[str]:
    """`vramlab serve` and `vramlab worker --device cpu`, each its own process."""
    yield from _service(database_url, tmp_path, "cpu")


@pytest.fixture
def cuda_service(tmp_path: Path) -> Iterator[str]:
    if not cuda_available():
        pytest.skip("needs a CUDA GPU")
    yield from _service(f"sqlite:///{tmp_path / 'cuda.db'}", tmp_path, "cuda")


@pytest.fixture
def capped_service(tmp_path: Path) -> Iterator[str]:
    """The CPU service with VRAMLAB_MAX_EXPERIMENT_BYTES at 64 MiB."""
    url = f"sqlite:///{tmp_path / 'capped.db'}"
    yield from _service(url, tmp_path, "cpu", VRAMLAB_MAX_EXPERIMENT_BYTES=str(64 * 2**20))


def _service(database_url: str, tmp_path: Path, device: str, **extra: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(
        database_url, VRAMLAB_DIAGNOSTIC_OPS="true", VRAMLAB_CLAIM_WAIT_SECONDS="5", **extra
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    api = subprocess.Popen(
        [*VRAMLAB, "serve", "--port", str(port)],
        env=env,
        stdout=(logs / "api.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_ready(url, api)
        worker = subprocess.Popen(
            [*VRAMLAB, "worker", "--api", url, "--device", device, "--name", "e2e"],
            env=env,
            stdout=(logs / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        wait_worker(url, worker, "e2e")
        yield url
        assert stop(worker) == 0, (logs / "worker.log").read_text()[-3000:]
    finally:
        if worker is not None:
            stop(worker)
        stop(api)


def test_add_on_cpu_is_measured_end_to_end(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        spec = {
            "op": "add",
            "shape": [1000, 1000],
            "dtype": "float32",
            "device": "cpu",
            "tags": ["e2e"],
        }
        accepted = client.post("/v1/experiments", json=spec)
        assert accepted.status_code == 202
        exp = wait_done(client, accepted.json()["id"])
        assert exp["status"] == "succeeded", exp["error"]
        assert exp["attempts"] == 1 and exp["worker_id"]
        memory = exp["result"]["memory"]
        assert all(
            isinstance(memory[k], int)
            for k in ("allocated_before", "allocated_after", "host_rss_after")
        )
        assert memory["delta_allocated"] >= 4_000_000
        assert exp["result"]["environment"]["torch"]
        assert exp["result"]["notes"]
        trace = client.get(
            f"/v1/experiments/{exp['id']}/trace", params={"action": "alloc", "min_size": 4_000_000}
        )
        assert any(e["size"] == 4_000_000 for e in trace.json()["events"])
        workers = client.get("/v1/workers").json()
        # One worker: one loop, or the host's default of several (e2e/0, e2e/1).
        assert {w["name"].partition("/")[0] for w in workers if w["live"]} == {"e2e"}


def test_a_crashing_child_fails_and_the_worker_goes_on(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        crash = client.post(
            "/v1/experiments", json={"op": "abort", "shape": [4], "device": "cpu"}
        ).json()
        after = client.post(
            "/v1/experiments", json={"op": "empty", "shape": [256, 256], "device": "cpu"}
        ).json()
        crashed = wait_done(client, crash["id"])
        assert crashed["status"] == "failed" and crashed["error"]["type"] == "crashed"
        assert wait_done(client, after["id"])["status"] == "succeeded"


def test_shared_experiments_reuse_a_process_and_a_crash_fails_only_its_own(service: str) -> None:
    add = {"op": "add", "shape": [1000, 1000], "device": "cpu", "isolation": "shared"}
    crash = {"op": "abort", "shape": [4], "device": "cpu", "isolation": "shared"}
    with httpx.Client(base_url=service, timeout=30) as client:
        # One after another: the worker's loops (two on a 2-core host) share its idle
        # shared processes, so each finds the one the experiment before it left.
        first, second, crashed, after = (
            wait_done(client, client.post("/v1/experiments", json=spec).json()["id"])
            for spec in (add, add, crash, add)
        )
    assert crashed["status"] == "failed" and crashed["error"]["type"] == "crashed"
    for exp in (first, second, after):
        assert exp["status"] == "succeeded", exp["error"]
        assert exp["spec"]["isolation"] == "shared"
        assert exp["result"]["environment"]["isolation"] == "shared"
        assert exp["result"]["memory"]["delta_allocated"] == exp["prediction"]["delta_allocated"]
    befores = [e["result"]["environment"]["experiments_before"] for e in (first, second, after)]
    assert befores == [0, 1, 0]  # the crash took its process; the next started a new one


def test_the_byte_cap_holds_on_the_run_and_the_worker_goes_on(capped_service: str) -> None:
    # The case: predicted at about 2.6 MB, float64 conv2d on the CPU asks for
    # 1 GB of im2col. At a 64 MiB cap the child is stopped by its OS limit, not the host.
    conv = {
        "op": "conv2d",
        "shape": [1, 8, 128, 128],
        "dtype": "float64",
        "device": "cpu",
        "params": {"out_channels": 8, "kernel_size": 31, "padding": 15},
    }
    with httpx.Client(base_url=capped_service, timeout=30) as client:
        first = client.post("/v1/experiments", json=conv)
        assert first.status_code == 202, first.text
        after = client.post(
            "/v1/experiments", json={"op": "add", "shape": [512, 512], "device": "cpu"}
        )
        capped = wait_done(client, first.json()["id"])
        assert capped["status"] == "failed"
        assert capped["error"]["type"] == "memory_limit", capped["error"]
        assert capped["error"]["details"]["limit_bytes"] == 64 * 2**20
        assert capped["error"]["details"]["requested_bytes"] > 64 * 2**20
        assert capped["result"]["memory"]["host_rss_after"] is not None  # figures kept
        assert wait_done(client, after.json()["id"])["status"] == "succeeded"


def readme_bodies() -> list[dict[str, Any]]:
    """The JSON bodies of the README's curl examples, as written there."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return [json.loads(body) for body in re.findall(r"-d '(\{.*?\})'", text, flags=re.S)]


def test_vramlab_up_runs_the_readme_examples_as_written(tmp_path: Path) -> None:
    """`vramlab up` on this GPU-less machine: the README's examples name no device, run on
    the CPU worker `up` started, and say which device they ran on."""
    spec, sweep = readme_bodies()[:2]
    assert "device" not in spec and "device" not in sweep["spec"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    env = env_for(f"sqlite:///{tmp_path / 'up.db'}")
    up = subprocess.Popen(
        [*VRAMLAB, "up", "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(url, up)
        with httpx.Client(base_url=url, timeout=30) as client:
            exp = wait_done(client, client.post("/v1/experiments", json=spec).json()["id"])
            assert exp["status"] == "succeeded", exp
            assert exp["spec"]["device"] == "cpu"
            assert exp["result"]["environment"]["device"] == "cpu"
            assert exp["result"]["memory"]["delta_allocated"] >= 1000 * 500 * 4
            made = client.post("/v1/sweeps", json=sweep)
            assert made.status_code == 202, made.text
            points = client.get(f"/v1/sweeps/{made.json()['id']}").json()["rows"]
            done = [wait_done(client, p["experiment_id"]) for p in points]
            assert {d["status"] for d in done} == {"succeeded"}, done
    finally:
        code = stop(up)
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.cuda
def test_readme_examples_on_cuda(cuda_service: str) -> None:
    """The README's matmul and an add on CUDA through the real service."""
    with httpx.Client(base_url=cuda_service, timeout=30) as client:
        add = {"op": "add", "shape": [1000, 1000], "dtype": "float32", "device": "cuda"}
        matmul = {
            "op": "matmul",
            "shape": [1000, 2000],
            "params": {"other_shape": [2000, 500]},
            "dtype": "float32",
            "device": "cuda",
        }
        ids = [client.post("/v1/experiments", json=s).json()["id"] for s in (add, matmul)]
        done_add, done_matmul = (wait_done(client, i) for i in ids)
        assert done_add["status"] == "succeeded", done_add["error"]
        assert (
            done_add["result"]["memory"]["delta_allocated"]
            == done_add["prediction"]["delta_allocated"]
        )
        assert done_add["result"]["environment"]["gpu_name"]
        assert done_matmul["status"] == "succeeded", done_matmul["error"]
        assert any("cuBLAS" in note for note in done_matmul["result"]["notes"])
        trace = client.get(f"/v1/experiments/{ids[0]}/trace", params={"action": "alloc"}).json()
        assert sum(e["size"] == 4_000_000 for e in trace["events"]) >= 3


def _wait_for_a_worker(url: str, proc: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not live_workers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("the worker never registered")
        time.sleep(0.1)


def test_an_idle_worker_exits_at_once_on_sigterm(database_url: str, tmp_path: Path) -> None:
    """The claim long-polls for 20 s; a signal cuts it short instead of waiting it out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(database_url, VRAMLAB_CLAIM_WAIT_SECONDS="60")
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    worker = None
    try:
        wait_ready(url, api)
        worker = start(["worker", "--api", url, "--device", "cpu"], env, tmp_path / "worker.log")
        _wait_for_a_worker(url, worker)
        began = time.monotonic()
        code = stop(worker)
        took = time.monotonic() - began
        print(f"idle worker: exited {took:.2f} s after SIGTERM")
        assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]
        assert took < 10, f"the idle worker took {took:.1f} s to exit"
        assert live_workers(url) == []  # it said goodbye: not live for another minute
    finally:
        if worker is not None:
            kill_group(worker)
        stop(api)


def test_ctrl_c_stops_vramlab_up_at_once(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    up = start(
        ["up", "--port", str(port), "--device", "cpu"],
        env_for(f"sqlite:///{tmp_path / 'up.db'}"),
        log,
    )
    try:
        wait_ready(url, up)
        _wait_for_a_worker(url, up)
        began = time.monotonic()
        os.killpg(up.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        code = up.wait(timeout=60)
        took = time.monotonic() - began
        print(f"vramlab up: exited {took:.2f} s after Ctrl-C")
        assert code == 0, log.read_text()[-3000:]
        assert took < 10, f"vramlab up took {took:.1f} s to exit"
    finally:
        kill_group(up)


def test_vramlab_up_without_its_worker_stops(tmp_path: Path) -> None:
    """`up --device cuda` on a host with no GPU: the worker refuses to start, and `up`
    says so and exits rather than serve an API that nothing would run work for."""
    if cuda_available():
        pytest.skip("this host has a GPU")
    port = free_port()
    log = tmp_path / "up.log"
    up = start(
        ["up", "--port", str(port), "--device", "cuda"],
        env_for(f"sqlite:///{tmp_path / 'up.db'}"),
        log,
    )
    try:
        code = up.wait(timeout=180)
    finally:
        kill_group(up)
    text = log.read_text()
    assert code != 0, text[-3000:]
    assert "no usable CUDA device" in text and "stopping the API" in text


def test_vramlab_up_is_quiet_and_verbose_says_more(tmp_path: Path) -> None:
    """An idle worker long-polls its claim again and again, and probes ask /readyz every
    few seconds: `up` logs none of those empty claims (neither the API's access line nor
    the worker's HTTP line) nor the health checks unless --verbose; an experiment's
    profiler logs nothing of its own start and stop."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    env = env_for(f"sqlite:///{tmp_path / 'up.db'}", VRAMLAB_CLAIM_WAIT_SECONDS="0.2")
    up = start(["up", "--port", str(port), "--device", "cpu"], env, log)
    try:
        wait_ready(url, up)
        _wait_for_a_worker(url, up)
        seen: set[str] = set()
        deadline = time.monotonic() + 120
        while len(seen) < 10:  # the worker has claimed, found nothing, and claimed again
            assert time.monotonic() < deadline, "the worker stopped claiming"
            seen |= {w["last_seen_at"] for w in live_workers(url)}
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=30) as client:
            spec = {"op": "add", "shape": [64, 64], "device": "cpu"}  # the CPU profiler's
            exp = wait_done(client, client.post("/v1/experiments", json=spec).json()["id"])
            assert exp["status"] == "succeeded", exp
            assert client.get("/healthz").status_code == 200
    finally:
        code = stop(up)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "GET /v1/workers" in text  # the access log is on
    # The one claim that found the experiment is logged; none of the empty ones.
    claims = [line for line in text.splitlines() if "/v1/worker/claim" in line]
    assert len(claims) == 1 and '" 200' in claims[0], text[-3000:]
    assert "/readyz" not in text and "/healthz" not in text, text[-3000:]
    assert "USDT" not in text, text[-3000:]  # kineto's line at each profiler start and stop

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    api = start(["serve", "--port", str(port), "--verbose"], env, log)
    try:
        wait_ready(url, api)
        worker = httpx.post(
            f"{url}/v1/worker/register",
            json={"name": "w", "capabilities": {"device_types": ["cpu"]}},
        ).json()["worker_id"]
        claim = httpx.post(f"{url}/v1/worker/claim", json={"worker_id": worker, "wait_s": 0})
        assert claim.status_code == 204
    finally:
        stop(api)
    assert '"POST /v1/worker/claim HTTP/1.1" 204' in log.read_text()
    assert '"GET /readyz HTTP/1.1" 200' in log.read_text()
