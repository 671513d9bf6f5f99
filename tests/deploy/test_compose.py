"""The compose stack as a user deploys it: built, started and used end to end.

deploy/engine.sh finds, starts or installs a Docker engine (the tests skip, saying why,
only when none can be had); deploy/standins.sh makes python:3.12-slim and postgres:16
when no registry answers. Then docker-compose.yml is built (every untagged image it
leaves is a stage's, which docs/deploy.md's prune finds) and brought up with its CPU
worker, and a user: makes a token, submits through the API, sees the CPU worker
container run it, reads the result and its trace, has a model spec predicted by the
predictor container, opens /docs, /ui and /ui/; finds every container healthy and the
logs free of health checks and profiler lines; restarts the api and postgres containers;
kills the worker mid-experiment, as the OOM killer would and with `docker kill`; takes
the stack down and up again with its volume. Each step's time is printed.
Select with ``pytest -m deploy``.
"""

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.deploy, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")
LOCAL_TORCH = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    url: str
    say: Any
    token: str = ""

    def run(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        done = subprocess.run(
            [*self.compose, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n"
                f"{done.stderr[-3000:]}\n{self.logs()}"
            )
        return done.stdout

    def logs(self) -> str:
        done = subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail", "40"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout[-6000:]

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).strip()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.say(f"deploy step {name}: {time.monotonic() - t0:.1f} s")

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token}"}
        )

    def wait_ready(self, seconds: float = 240) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the api never became ready\n{self.logs()}")

    def wait_done(self, client: httpx.Client, exp_id: str, seconds: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        exp: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                exp = client.get(f"/v1/experiments/{exp_id}").json()
            except httpx.TransportError:
                exp = {"status": "unreachable"}
            if exp.get("status") in TERMINAL:
                return exp
            time.sleep(0.5)
        raise AssertionError(f"experiment {exp_id} did not finish: {exp}\n{self.logs()}")


def _engine() -> list[str]:
    if shutil.which("docker") is None and shutil.which("apt-get") is None:
        pytest.skip("no Docker engine here and no apt-get to install one")
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "engine.sh")], capture_output=True, text=True, timeout=900
    )
    if done.returncode == 3:
        pytest.skip(f"no Docker engine can be had here: {done.stderr.strip()[-500:]}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1].split()


@pytest.fixture(scope="module")
def stack(pytestconfig: pytest.Config) -> Iterator[Stack]:
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:  # to the terminal as it happens, past pytest's capture
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    t0 = time.monotonic()
    compose = _engine()
    say(f"deploy step engine ({' '.join(compose)}): {time.monotonic() - t0:.1f} s")
    port = free_port()
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": "vramlab-e2e",
        "DOCKER_BUILDKIT": "0",
        "COMPOSE_DOCKER_CLI_BUILD": "1",
        "VRAMLAB_PORT": str(port),
        "VRAMLAB_WORKER_TOKEN": secrets.token_hex(16),
        "VRAMLAB_SESSION_SECRET": secrets.token_hex(32),
        "POSTGRES_PASSWORD": secrets.token_hex(12),
        "VRAMLAB_DIAGNOSTIC_OPS": "true",
        "VRAMLAB_LEASE_SECONDS": "5",
    }
    if LOCAL_TORCH:  # PyTorch's index is out of reach here: the CPU wheel on disk instead
        shutil.copy2(LOCAL_TORCH[-1], ROOT / "deploy" / "wheels" / LOCAL_TORCH[-1].name)
        env["TORCH_CPU_PIP_ARGS"] = "--find-links /wheels"
    s = Stack(compose, env, f"http://127.0.0.1:{port}", say)
    s.run("down", "-v", "--remove-orphans", check=False)
    with s.step("base images (stand-ins if no registry)"):
        done = subprocess.run(
            ["bash", str(ROOT / "deploy" / "standins.sh")],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    # Every image the engine lists before the build: untagged ones (an earlier build's
    # stages) and tagged ones, which a rebuild may leave untagged (the api, both workers,
    # whatever an earlier run built): neither is this build's leftover.
    before = set(_images())
    with s.step("build"):
        s.run("build")
    # The untagged images this build leaves are its stages' (the next build's cache, which
    # later runs and test_hosts.py use): docs/deploy.md's prune must find every one.
    stages = set(_images("--filter", "dangling=true", "--filter", f"label={STAGE_LABEL}"))
    left = set(_images("--filter", "dangling=true")) - before
    assert left <= stages, f"untagged images of the build without the stage label: {left - stages}"
    say(f"deploy build stages kept (their cache): {len(stages)}, {_size(stages) / 1e9:.2f} GB")
    for image in ("vramlab-api:latest", "vramlab-worker-cpu:latest"):
        size = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", image],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        say(f"deploy image {image}: {int(size) / 1e6:.0f} MB")
        if image.startswith("vramlab-api"):
            assert int(size) <= 250 * 10**6
    try:
        with s.step("up and healthy"):
            s.run("up", "-d")
            s.wait_ready()
        with s.step("token"):
            out = s.run(
                "exec", "-T", "api", "vramlab", "token", "create",
                "--scope", "read", "--scope", "submit", "--name", "e2e",
            )  # fmt: skip
            s.token = out.strip().splitlines()[0]
        yield s
    finally:
        s.run("down", "-v", "--remove-orphans", check=False)


ADD = {"op": "add", "shape": [1000, 1000], "dtype": "float32", "device": "cpu", "tags": ["deploy"]}
# What docs/deploy.md's prune of the build stages selects.
STAGE_LABEL = next(
    line.split("--filter label=")[1].split()[0]
    for line in (ROOT / "docs" / "deploy.md").read_text().splitlines()
    if line.startswith("docker image prune")
)


def _images(*filters: str) -> list[str]:
    done = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", *filters],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted(set(done.stdout.split()))


def _size(images: set[str]) -> int:
    """What these images hold above the base image they share (each image's size counts
    its parents' layers)."""
    if not images:
        return 0
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", "python:3.12-slim", *images],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    base, *sizes = (int(n) for n in done.stdout.split())
    return sum(size - base for size in sizes)


def _state(container: str, field: str) -> str:
    done = subprocess.run(
        ["docker", "inspect", "-f", "{{" + field + "}}", container],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_user_submits_and_the_cpu_worker_container_runs_it(stack: Stack) -> None:
    with stack.step("submit, run, result, trace, /docs, /ui/"), stack.client() as client:
        assert httpx.post(f"{stack.url}/v1/experiments", json=ADD).status_code == 401
        accepted = client.post("/v1/experiments", json=ADD)
        assert accepted.status_code == 202, accepted.text
        exp = stack.wait_done(client, accepted.json()["id"])
        assert exp["status"] == "succeeded", exp
        assert exp["result"]["memory"]["delta_allocated"] >= 4_000_000
        assert exp["result"]["environment"]["torch"].startswith("2.13.0")
        worker = next(w for w in client.get("/v1/workers").json() if w["id"] == exp["worker_id"])
        # The worker's default name is its host's: the worker container's (NAME/0... for
        # each of its loops where it runs several).
        assert stack.container("worker-cpu").startswith(worker["name"].partition("/")[0])
        trace = client.get(
            f"/v1/experiments/{exp['id']}/trace", params={"action": "alloc", "min_size": 4_000_000}
        )
        assert any(e["size"] == 4_000_000 for e in trace.json()["events"]), trace.text[:500]
        docs = client.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        assert client.get("/openapi.json").json()["paths"]
        ui = client.get("/ui/")
        assert ui.status_code == 200 and exp["id"] in ui.text
        assert client.get("/ui", follow_redirects=True).url.path == "/ui/"
        bounced = httpx.get(f"{stack.url}/ui")  # no token: to sign in, as /ui/ does
        assert bounced.status_code == 303 and bounced.headers["location"] == "/ui/signin"


def test_a_model_spec_is_predicted_and_planned_through_the_stack(stack: Stack) -> None:
    """The api image has no torch: the predictor container answers for it (issue 29)."""
    spec = {
        "op": "model",
        "shape": [],
        "device": "cpu",
        "params": {"model": "gpt2", "batch_size": 1, "seq_len": 32, "config": {"n_layer": 2}},
        "tags": ["deploy"],
    }
    with stack.step("a model spec's prediction, from the predictor container"):
        with stack.client() as client:
            accepted = client.post("/v1/experiments", json=spec, timeout=300)
            assert accepted.status_code == 202, (accepted.text, stack.logs())
            prediction = accepted.json()["prediction"]
            assert prediction.get("peak_allocated", 0) > 0, prediction
            assert prediction["categories"]["parameters"] > 0
            client.post(f"/v1/experiments/{accepted.json()['id']}/cancel")
            refused = client.post(
                "/v1/experiments",
                json={**spec, "params": {**spec["params"], "config": {"n_head": 0}}},
                timeout=300,
            )
            assert refused.status_code == 422, refused.text
    with stack.step("a plan for two GPUs, its edges from the predictor container"):
        with stack.client() as client:
            plan = {
                "spec": {"op": "model", "params": {"model": "gpt2", "batch_size": 4}},
                "gpus": ["RTX 4090", "H100"],
                "suggest": False,
            }
            answered = client.post("/v1/plans", json=plan, timeout=300)
            assert answered.status_code == 200, (answered.text, stack.logs())
            edges = [a["predicted_max_fitting"] for a in answered.json()["answers"]]
            assert answered.json()["predicted"] is True
            assert 4 < edges[0] < edges[1], edges  # the 24 GB card holds less than 80 GB


def test_every_container_is_healthy_and_the_logs_hold_no_routine_noise(stack: Stack) -> None:
    with stack.step("healthy: api and worker (its alive file)"):
        deadline = time.monotonic() + 120
        for service in ("postgres", "api", "predictor", "worker-cpu"):
            container = stack.container(service)
            while _state(container, ".State.Health.Status") != "healthy":
                assert time.monotonic() < deadline, (service, stack.logs())
                time.sleep(0.5)
    api_checks = _state(stack.container("api"), "json .State.Health.Log")
    assert json.loads(api_checks), "the engine ran no health check of the api"
    api_log = stack.run("logs", "--no-color", "api")
    assert "GET /v1/experiments" in api_log  # the access log is on
    assert "/readyz" not in api_log, api_log[-3000:]  # the engine's checks, every 5 s
    worker_log = stack.run("logs", "--no-color", "worker-cpu")
    assert "succeeded" in worker_log and "USDT" not in worker_log, worker_log[-3000:]


def test_restarting_the_api_and_the_database_loses_nothing(stack: Stack) -> None:
    with stack.client() as client:
        before = client.post("/v1/experiments", json=ADD).json()
        before = stack.wait_done(client, before["id"])
        with stack.step("restart api"):
            stack.run("restart", "api")
            stack.wait_ready()
        assert client.get(f"/v1/experiments/{before['id']}").json() == before
        with stack.step("restart postgres"):
            stack.run("restart", "postgres")
            stack.wait_ready()
        assert client.get(f"/v1/experiments/{before['id']}").json() == before
        with stack.step("a new experiment after both restarts"):
            after = client.post("/v1/experiments", json=ADD)
            assert after.status_code == 202, after.text
            assert stack.wait_done(client, after.json()["id"])["status"] == "succeeded"


def _running(client: httpx.Client, exp_id: str, stack: Stack) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while (exp := client.get(f"/v1/experiments/{exp_id}").json())["status"] != "running":
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.2)
    return exp


def _wait(condition: Any, what: str, stack: Stack, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}\n{stack.logs()}"
        time.sleep(0.2)


def test_a_worker_killed_mid_experiment_is_started_again_or_stays_stopped_as_documented(
    stack: Stack,
) -> None:
    """docs/deploy.md: a worker whose process dies is started again by the engine; one that
    `docker kill` stopped stays stopped until `up -d`. Either way it stops counting as live
    once it misses its heartbeats, and its experiment ends, never stays `running`."""
    spec = {"op": "sleep", "shape": [1024], "device": "cpu", "params": {"seconds": 8}}
    with stack.client() as client:

        def live(worker_id: str) -> bool:
            return any(w["id"] == worker_id and w["live"] for w in client.get("/v1/workers").json())

        exp = _running(client, client.post("/v1/experiments", json=spec).json()["id"], stack)
        container = stack.container("worker-cpu")
        restarts = int(_state(container, ".RestartCount"))
        with stack.step("the worker's process killed mid-experiment (as by the OOM killer)"):
            try:
                os.kill(int(_state(container, ".State.Pid")), signal.SIGKILL)
            except (PermissionError, ProcessLookupError) as exc:  # an engine elsewhere
                pytest.skip(f"the engine's processes cannot be signalled from here: {exc}")
            _wait(lambda: not live(exp["worker_id"]), "the killed worker stayed live", stack, 60)
            _wait(
                lambda: int(_state(container, ".RestartCount")) > restarts,
                "the engine did not start the worker again",
                stack,
            )
            done = stack.wait_done(client, exp["id"])
        ok = done["status"] == "succeeded" and done["attempts"] >= 2
        lost = done["status"] == "failed" and done["error"]["type"] == "lost"
        assert ok or lost, json.dumps(done)[:2000]
        stack.say(f"deploy kill: experiment {done['status']} after {done['attempts']} attempts")

        exp = _running(client, client.post("/v1/experiments", json=spec).json()["id"], stack)
        restarts = int(_state(container, ".RestartCount"))
        with stack.step("docker kill -s KILL: the worker no longer counts as live"):
            subprocess.run(["docker", "kill", "-s", "KILL", container], check=True)

            waiting = client.post("/v1/experiments", json=ADD).json()["id"]

            def counted() -> tuple[int, bool]:
                queue = client.get(f"/v1/experiments/{waiting}").json()["queue"]
                return queue["live_workers"], queue["runnable"]

            _wait(lambda: counted() == (0, False), "a submit counted the killed worker", stack, 60)
        assert _state(container, ".State.Status") == "exited"  # a stop by hand: it stays
        assert int(_state(container, ".RestartCount")) == restarts
        with stack.step("up -d starts it again; the experiment ends"):
            stack.run("up", "-d")
            done = stack.wait_done(client, exp["id"])
        assert done["status"] in ("succeeded", "failed") and done["attempts"] >= 2, done
        assert stack.wait_done(client, waiting)["status"] == "succeeded"


def test_down_and_up_keeps_the_database_volume(stack: Stack) -> None:
    with stack.client() as client:
        kept = stack.wait_done(client, client.post("/v1/experiments", json=ADD).json()["id"])
    with stack.step("down (volume kept)"):
        stack.run("down")
    with stack.step("up again and healthy"):
        stack.run("up", "-d")
        stack.wait_ready()
    with stack.client() as client:
        assert client.get(f"/v1/experiments/{kept['id']}").json() == kept
        listed = client.get("/v1/experiments", params={"tag": "deploy"}).json()
        assert len(listed["items"] if isinstance(listed, dict) else listed) >= 3
        with stack.step("a new experiment after down and up"):
            again = client.post("/v1/experiments", json=ADD)
            assert stack.wait_done(client, again.json()["id"])["status"] == "succeeded"


def test_a_backup_restores_into_a_new_volume(stack: Stack, tmp_path: Path) -> None:
    """docs/deploy.md's recipe: pg_dump while it runs; `down -v` loses everything; the
    dump restored into the new, empty database brings it back."""
    with stack.client() as client:
        kept = stack.wait_done(client, client.post("/v1/experiments", json=ADD).json()["id"])
    dump = tmp_path / "vramlab.dump"
    with stack.step("backup (pg_dump)"):
        with dump.open("wb") as out:
            subprocess.run(
                [*stack.compose, "exec", "-T", "postgres",
                 "pg_dump", "-U", "vramlab", "-d", "vramlab", "-Fc"],
                cwd=ROOT, env=stack.env, stdout=out, check=True, timeout=300,
            )  # fmt: skip
    assert dump.stat().st_size > 1000
    with stack.step("down -v, up: an empty database"):
        stack.run("down", "-v")
        stack.run("up", "-d")
        stack.wait_ready()
    with stack.client() as client:
        assert client.get(f"/v1/experiments/{kept['id']}").status_code == 401  # no tokens left
    with stack.step("restore (pg_restore) and up"):
        stack.run("stop", "api", "worker-cpu")
        with dump.open("rb") as dumped:
            subprocess.run(
                [*stack.compose, "exec", "-T", "postgres", "pg_restore", "-U", "vramlab",
                 "-d", "vramlab", "--clean", "--if-exists"],
                cwd=ROOT, env=stack.env, stdin=dumped, check=True, timeout=300,
                capture_output=True,
            )  # fmt: skip
        stack.run("up", "-d")
        stack.wait_ready()
    with stack.client() as client:
        assert client.get(f"/v1/experiments/{kept['id']}").json() == kept
        again = client.post("/v1/experiments", json=ADD)
        assert stack.wait_done(client, again.json()["id"])["status"] == "succeeded"
