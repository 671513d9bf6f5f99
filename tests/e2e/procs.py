"""Starting, waiting for and stopping the real `vramlab` processes in tests."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

VRAMLAB = [sys.executable, "-m", "app.cli"]
TERMINAL = ("succeeded", "failed", "cancelled")


def env_for(database_url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "VRAMLAB_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A vramlab process in its own session, so that killing its group takes its children."""
    return subprocess.Popen(
        [*VRAMLAB, *args],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never became ready")


def live_workers(url: str) -> list[dict[str, Any]]:
    try:
        return [w for w in httpx.get(f"{url}/v1/workers", timeout=5).json() if w["live"]]
    except httpx.TransportError:
        return []


def wait_worker(url: str, proc: subprocess.Popen[bytes], name: str, seconds: float = 120) -> None:
    """Until the worker ``name`` has registered and is live (one of its loops, named
    ``name/0``... where it runs several): from then on it has its signal handlers, so a
    SIGTERM stops it cleanly (before, Python's default kills it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        if any(w["name"].partition("/")[0] == name for w in live_workers(url)):
            return
        time.sleep(0.2)
    raise RuntimeError(f"worker {name} never registered with {url}")


def wait_done(client: httpx.Client, exp_id: str, seconds: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    exp: dict[str, Any] = {}
    while time.monotonic() < deadline:
        exp = client.get(f"/v1/experiments/{exp_id}").json()
        if exp["status"] in TERMINAL:
            return exp
        time.sleep(0.2)
    raise AssertionError(f"experiment {exp_id} did not finish: {exp}")


def wait_status(client: httpx.Client, exp_id: str, status: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if client.get(f"/v1/experiments/{exp_id}").json()["status"] == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"experiment {exp_id} never reached {status}")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and everything it started (the forkserver, the running child)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
