"""A throwaway vramlab service for benchmarks: `vramlab serve` and `vramlab worker` as
processes on a temporary SQLite file (or a database URL given), ready when a live worker
has registered."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def running_service(
    device: str,
    port: int | None = None,
    worker_args: Sequence[str] = (),
    database_url: str | None = None,
    serve: Sequence[str] | None = None,
) -> Iterator[httpx.Client]:
    """``serve``: the API's command line instead of `vramlab serve` (its port appended
    after ``--port``), such as bench/profiled_serve.py."""
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-"))
    # A free port unless told: a fixed one may belong to another service on this host,
    # which the benchmark would then measure instead.
    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": database_url or f"sqlite:///{tmp / 'bench.db'}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        # As under `vramlab up`: the model predictor's children start with the API.
        "VRAMLAB_MODEL_PREDICTOR_START": os.environ.get("VRAMLAB_MODEL_PREDICTOR_START", "true"),
    }
    predictor_start = env["VRAMLAB_MODEL_PREDICTOR_START"].lower() in ("1", "true", "on", "yes")
    cli = [sys.executable, "-m", "app.cli"]
    log = (tmp / "service.log").open("wb")
    api_command = [*serve, "--port", str(port)] if serve else [*cli, "serve", "--port", str(port)]
    api = subprocess.Popen(
        [*api_command, "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=log,
    )
    worker = subprocess.Popen(
        [*cli, "worker", "--api", url, "--device", device, *worker_args],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            deadline = time.monotonic() + 180
            while True:
                try:
                    workers = client.get("/v1/workers").json()
                    if sum(1 for w in workers if w["live"]) >= _loops(worker_args) and (
                        not predictor_start or _predictor_ready(client)
                    ):
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"service did not start; see {tmp / 'service.log'}")
                time.sleep(0.2)
            yield client
    finally:
        for proc in (worker, api):
            proc.terminate()
            proc.wait(timeout=60)


def _predictor_ready(client: httpx.Client) -> bool:
    """Whether a lane of the API's model predictor has started (or none can: no torch)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("vramlab_predictor_lanes_ready "):
            return float(line.split()[1]) >= 1
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _loops(worker_args: Sequence[str]) -> int:
    args = list(worker_args)
    return int(args[args.index("--concurrency") + 1]) if "--concurrency" in args else 1


def run_to_end(client: httpx.Client, spec: dict[str, Any], poll_s: float = 0.005) -> dict[str, Any]:
    response = client.post("/v1/experiments", json=spec)
    response.raise_for_status()
    exp_id = response.json()["id"]
    while True:
        exp: dict[str, Any] = client.get(f"/v1/experiments/{exp_id}").json()
        if exp["status"] not in ("queued", "running"):
            return exp
        time.sleep(poll_s)
