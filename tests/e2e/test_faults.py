"""Faults that must leave every experiment finished exactly once or back in the queue.

Real processes: the API and CPU workers started as `vramlab serve` / `vramlab worker`,
killed with SIGKILL (process group: the worker, its forkserver and the running child),
an API restarted, a PostgreSQL of the test's own restarted under load. Each test prints
one summary line; docs/reliability.md quotes them.
"""

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.pg import PrivatePostgres
from tests.e2e.procs import env_for, kill_group, start, stop, wait_done, wait_ready, wait_status

pytestmark = pytest.mark.slow
SLEEP = {"op": "sleep", "shape": [1024], "device": "cpu", "warmup": 0, "repeat": 1}


@dataclass
class Service:
    url: str
    env: dict[str, str]
    logs: Path
    api: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_api(self) -> None:
        port = self.url.rsplit(":", 1)[1]
        self.api = start(["serve", "--port", port, "--no-migrate"], self.env, self.logs / "api.log")
        wait_ready(self.url, self.api)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        # One loop each: a kill then ends exactly the experiment it was seen running.
        args = ["worker", "--api", self.url, "--device", "cpu", "--name", name]
        args += ["--concurrency", "1"]
        return start(args, self.env, self.logs / f"{name}.log")

    def log_tail(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in sorted(self.logs.glob("*.log")))


@contextmanager
def running(database_url: str, tmp_path: Path) -> Iterator[Service]:
    url = f"http://127.0.0.1:{free_port()}"
    env = env_for(
        database_url,
        VRAMLAB_DIAGNOSTIC_OPS="true",
        VRAMLAB_LEASE_SECONDS="3",
        VRAMLAB_MAX_ATTEMPTS="10",
        VRAMLAB_CLAIM_WAIT_SECONDS="2",
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    api = start(["serve", "--port", url.rsplit(":", 1)[1]], env, logs / "api.log")
    svc = Service(url, env, logs, api)
    try:
        wait_ready(url, api)
        yield svc
    finally:
        for proc in svc.workers:
            stop(proc)
        stop(svc.api)


@pytest.fixture
def service(database_url: str, tmp_path: Path) -> Iterator[Service]:
    with running(database_url, tmp_path) as svc:
        yield svc


def submit_many(client: httpx.Client, n: int, seconds: float) -> list[str]:
    spec = {**SLEEP, "params": {"seconds": seconds}}
    return [client.post("/v1/experiments", json=spec).json()["id"] for _ in range(n)]


def busy_worker(
    client: httpx.Client, name: str, killed: set[str], seconds: float = 120
) -> str | None:
    """Wait until a live worker of that name, not one already killed, is running one;
    ``None`` once nothing waits in the queue any more (on a busy machine the other worker may
    have run them all while this one was starting)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for w in client.get("/v1/workers").json():
            if w["name"] == name and w["id"] not in killed and w["state"] == "busy":
                return str(w["id"])
        queued = client.get("/v1/experiments", params={"status": "queued", "limit": 1}).json()
        if not queued["items"]:
            return None
        time.sleep(0.05)
    raise AssertionError(f"worker {name} never got busy")


def finished(client: httpx.Client, ids: list[str]) -> list[dict[str, Any]]:
    return [wait_done(client, i, seconds=240) for i in ids]


def test_workers_killed_mid_experiment_lose_nothing(service: Service) -> None:
    service.workers = [service.start_worker("steady"), service.start_worker("doomed")]
    killed: set[str] = set()
    with httpx.Client(base_url=service.url, timeout=30) as client:
        # Long enough that a kill seen "busy" lands inside an experiment, not between two.
        ids = submit_many(client, 12, seconds=1.5)
        for _ in range(3):
            busy = busy_worker(client, "doomed", killed)
            if busy is None:
                break
            killed.add(busy)
            kill_group(service.workers[1])
            service.workers[1] = service.start_worker("doomed")
        done = finished(client, ids)
    assert killed, "the doomed worker was never seen running one"
    statuses = [e["status"] for e in done]
    assert statuses == ["succeeded"] * len(ids), service.log_tail()
    assert all(e["result"]["memory"]["allocated_after"] >= 4096 for e in done)
    # Each re-run came from a killed worker's expired lease: some, and never more than kills.
    reruns = sum(e["attempts"] - 1 for e in done)
    assert 1 <= reruns <= len(killed)
    print(
        f"\nkill test: submitted {len(ids)}, workers killed {len(killed)}, re-runs {reruns}, lost 0"
    )


def test_a_hung_child_times_out_and_the_worker_goes_on(service: Service) -> None:
    service.workers = [service.start_worker("w")]
    with httpx.Client(base_url=service.url, timeout=30) as client:
        hung = client.post(
            "/v1/experiments", json={**SLEEP, "params": {"seconds": 600}, "timeout_s": 1}
        ).json()
        after = client.post("/v1/experiments", json={**SLEEP, "params": {"seconds": 0}}).json()
        timed_out = wait_done(client, hung["id"])
        assert timed_out["status"] == "failed" and timed_out["error"]["type"] == "timeout"
        assert wait_done(client, after["id"])["status"] == "succeeded"


def test_cancel_stops_a_running_experiment(service: Service) -> None:
    service.workers = [service.start_worker("w")]
    with httpx.Client(base_url=service.url, timeout=30) as client:
        long = client.post("/v1/experiments", json={**SLEEP, "params": {"seconds": 600}}).json()
        wait_status(client, long["id"], "running")
        client.post(f"/v1/experiments/{long['id']}/cancel")
        cancelled = wait_done(client, long["id"], seconds=30)
        assert cancelled["status"] == "cancelled"
        after = client.post("/v1/experiments", json={**SLEEP, "params": {"seconds": 0}}).json()
        assert wait_done(client, after["id"])["status"] == "succeeded"


def test_an_api_restart_loses_nothing(service: Service) -> None:
    service.workers = [service.start_worker("w")]
    with httpx.Client(base_url=service.url, timeout=30) as client:
        ids = submit_many(client, 6, seconds=1.0)
        wait_status(client, ids[0], "running")
        kill_group(service.api)
        time.sleep(1.0)
        service.start_api()
        done = finished(client, ids)
    assert [e["status"] for e in done] == ["succeeded"] * len(ids), service.log_tail()
    print(f"\nAPI restart: submitted {len(ids)}, API killed once, lost 0")


def test_a_postgres_restart_under_load_loses_nothing(database_url: str, tmp_path: Path) -> None:
    """On a PostgreSQL cluster of the test's own (initdb in a temporary folder, its own
    port), stopped and started under load: the machine's cluster is never touched."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL restart: runs once, with the postgres engine")
    with PrivatePostgres(tmp_path / "pg") as pg, running(pg.url, tmp_path) as service:
        _restart_under_load(service, pg)


def _restart_under_load(service: Service, pg: "PrivatePostgres") -> None:
    service.workers = [service.start_worker("w")]
    saw_503 = None
    with httpx.Client(base_url=service.url, timeout=30) as client:
        ids = submit_many(client, 8, seconds=0.3)
        pg.ctl("stop", "-m", "fast")
        try:
            deadline = time.monotonic() + 20
            while saw_503 is None and time.monotonic() < deadline:
                r = client.get("/v1/experiments")
                if r.status_code == 503:
                    saw_503 = r
                time.sleep(0.1)
        finally:
            pg.ctl("start")
        done = finished(client, ids)
    assert saw_503 is not None and saw_503.headers["retry-after"]
    assert saw_503.json()["error"]["type"] == "unavailable"
    assert [e["status"] for e in done] == ["succeeded"] * len(ids), service.log_tail()
    print(f"\nPostgreSQL restart: submitted {len(ids)}, answered 503 while down, lost 0")
