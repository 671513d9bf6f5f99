"""Several hosts for real: PostgreSQL, two API replicas and two CPU workers, each its own
container on the compose network (docker-compose.yml plus tests/deploy/several-hosts.yml).

A worker is cut off the network mid-experiment (`docker network disconnect`): its lease
expires, the other worker, claiming through the other API replica, finishes the
experiment; reconnected, the cut-off worker's late report is refused and changes nothing.
The experiment is queued on one replica and claimed through the other.
"""

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.deploy.test_compose import LOCAL_TORCH, ROOT, Stack, _engine

pytestmark = [pytest.mark.deploy, pytest.mark.slow]
PROJECT = "vramlab-hosts"


@pytest.fixture(scope="module")
def hosts(pytestconfig: pytest.Config) -> Iterator[tuple[Stack, str]]:
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    compose = [*_engine(), "-f", "docker-compose.yml", "-f", "tests/deploy/several-hosts.yml"]
    port, port2 = free_port(), free_port()
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": PROJECT,
        "DOCKER_BUILDKIT": "0",
        "COMPOSE_DOCKER_CLI_BUILD": "1",
        "VRAMLAB_PORT": str(port),
        "VRAMLAB_PORT2": str(port2),
        "VRAMLAB_WORKER_TOKEN": secrets.token_hex(16),
        "VRAMLAB_SESSION_SECRET": secrets.token_hex(32),
        "POSTGRES_PASSWORD": secrets.token_hex(12),
        "VRAMLAB_DIAGNOSTIC_OPS": "true",
        "VRAMLAB_LEASE_SECONDS": "4",
    }
    if LOCAL_TORCH:  # as in test_compose: the CPU wheel on disk, PyTorch's index out of reach
        shutil.copy2(LOCAL_TORCH[-1], ROOT / "deploy" / "wheels" / LOCAL_TORCH[-1].name)
        env["TORCH_CPU_PIP_ARGS"] = "--find-links /wheels"
    s = Stack(compose, env, f"http://127.0.0.1:{port}", say)
    s.run("down", "-v", "--remove-orphans", check=False)
    subprocess.run(["bash", str(ROOT / "deploy" / "standins.sh")], check=True, timeout=900)
    try:
        with s.step("several hosts: build (cached), up"):
            s.run("build", "api", "worker-cpu")
            s.run("up", "-d")
            s.wait_ready()
            Stack(compose, env, f"http://127.0.0.1:{port2}", say).wait_ready()
        out = s.run("exec", "-T", "api", "vramlab", "token", "create", "--name", "hosts")
        s.token = out.strip().splitlines()[0]
        yield s, f"http://127.0.0.1:{port2}"
    finally:
        s.run("down", "-v", "--remove-orphans", check=False)


def test_a_cut_off_worker_loses_its_lease_and_its_late_report_is_refused(
    hosts: tuple[Stack, str], tmp_path: Path
) -> None:
    stack, url2 = hosts
    network = f"{PROJECT}_default"
    worker_a = stack.container("worker-cpu")
    spec = {"op": "sleep", "shape": [1024], "device": "cpu", "params": {"seconds": 6}}
    with stack.client() as api1, httpx.Client(base_url=url2, headers=api1.headers) as api2:
        # Queued on replica 2; worker A claims through replica 1: one queue.
        exp_id = api2.post("/v1/experiments", json=spec).json()["id"]
        deadline = time.monotonic() + 60
        while (exp := api1.get(f"/v1/experiments/{exp_id}").json())["status"] != "running":
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.1)
        first_worker = exp["worker_id"]
        with stack.step("cut worker A off mid-experiment; B finishes it through api2"):
            subprocess.run(["docker", "network", "disconnect", network, worker_a], check=True)
            stack.run("up", "-d", "worker-b")
            done = stack.wait_done(api2, exp_id, seconds=120)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        # A worker's loops register as NAME/0, NAME/1... where it runs several.
        workers = {w["id"]: w["name"].partition("/")[0] for w in api1.get("/v1/workers").json()}
        assert workers[done["worker_id"]] == "worker-b" and done["worker_id"] != first_worker
        with stack.step("reconnect A: its late calls are refused"):
            subprocess.run(["docker", "network", "connect", network, worker_a], check=True)
            # What the worker logs when the API refuses what it sends late: its report (or
            # its trace upload), or a heartbeat that finds the lease gone.
            refusals = (
                f"report of {exp_id} refused: the lease was lost",
                "report refused: the lease was lost",
                "refused: the lease was lost",
                f"lease on {exp_id} lost",
            )
            deadline = time.monotonic() + 90
            while True:
                log = subprocess.run(
                    ["docker", "logs", worker_a],
                    stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True,
                ).stdout  # fmt: skip
                seen = [line for line in log.splitlines() if any(r in line for r in refusals)]
                if seen:
                    break
                assert time.monotonic() < deadline, log[-3000:]
                time.sleep(0.5)
            stack.say(f"deploy hosts: worker A, reconnected: {seen[0].strip()[-120:]}")
        assert api1.get(f"/v1/experiments/{exp_id}").json() == done
        assert api2.get(f"/v1/experiments/{exp_id}").json() == done
        # Worker A goes on: it claims and runs the next one.
        stack.run("stop", "worker-b")
        again = api1.post("/v1/experiments", json={**spec, "params": {"seconds": 0}}).json()
        after = stack.wait_done(api1, again["id"])
        workers = {w["id"]: w["name"].partition("/")[0] for w in api1.get("/v1/workers").json()}
        assert after["status"] == "succeeded" and worker_a.startswith(workers[after["worker_id"]])
