"""How fast the service settles a worker's end, quiet and on a busy machine: an idle
worker's exit after SIGTERM, and an expired lease shown re-queued with no worker polling.

    python bench/stop_and_expiry.py [--device cpu|cuda] [--runs 3] [--lease-s 3]
                                    [--load 8] [--database-url URL]

Runs `vramlab serve` (lease ``--lease-s``, so the reaper's usual round is longer than a
lease only by its defaults) and `vramlab worker` with its default flags as processes,
twice: on the machine as it is, then with ``--load`` busy processes beside it (a Python
busy loop each, as ``stress-ng --cpu N`` would run; 0: no loaded pass). Each pass:

- SIGTERM: a worker registered and waiting for work (its claim's long poll) is sent
  SIGTERM; the time until its process has exited.
- expiry: a worker runs a long experiment (``sleep``) and is killed with SIGKILL, its
  forkserver and child with it, so nothing heartbeats or claims; the lease's expiry is
  read from the database, and the API is asked every 20 ms until the experiment shows
  ``queued`` (or ``lost``): the time from the expiry to that answer, and to the reaper's
  round that settled it (the row's ``available_at``).

Prints each figure beside the issue's target (2 s) with the load average of its pass.
"""

import argparse
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0
CLI = [sys.executable, "-m", "app.cli"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` busy loops beside the benchmark (stress-ng's ``--cpu`` where it is
    not installed)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(processes)]
    for proc in procs:
        proc.start()
    try:
        if processes:
            time.sleep(20)  # the load average follows over tens of seconds
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


@contextmanager
def api(database_url: str, lease_s: float, log: Path) -> Iterator[tuple[str, httpx.Client]]:
    port = _free_port()
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": database_url,
        "VRAMLAB_LEASE_SECONDS": str(lease_s),
        "VRAMLAB_DIAGNOSTIC_OPS": "1",  # the `sleep` op: an experiment that lasts
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*CLI, "serve", "--port", str(port), "--log-level", "warning"],
            env=env,
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            deadline = time.monotonic() + 180
            while True:
                try:
                    if client.get("/v1/workers").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the API did not start; see {log}")
                time.sleep(0.2)
            yield url, client
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def start_worker(url: str, device: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    with log.open("ab") as out:
        # A session of its own: SIGKILL reaches its forkserver and children too.
        return subprocess.Popen(
            [*CLI, "worker", "--api", url, "--device", device, "--name", name],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


def wait_live(client: httpx.Client, name: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while True:
        workers = client.get("/v1/workers").json()
        if any(w["live"] and w["name"].partition("/")[0] == name for w in workers):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker {name} did not register (exit {proc.poll()})")
        time.sleep(0.2)


def sigterm_exit(url: str, client: httpx.Client, device: str, log: Path, n: int) -> float:
    proc = start_worker(url, device, f"stop-{n}", log)
    try:
        wait_live(client, f"stop-{n}", proc)
        time.sleep(1.0)  # in its claim's long poll by now
        began = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        return time.perf_counter() - began
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _moment(engine: sa.Engine, column: str, exp_id: str) -> datetime:
    """A timestamp of the experiment's row (``lease_expires_at``; ``available_at``, which
    a requeue sets to the reaper's round's time)."""
    with engine.connect() as conn:
        value = conn.execute(
            sa.text(f"SELECT {column} FROM experiments WHERE id = :id"), {"id": exp_id}
        ).scalar_one()
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def expiry_seen(
    url: str, client: httpx.Client, engine: sa.Engine, device: str, log: Path, n: int
) -> tuple[float, float]:
    """Seconds from the lease's expiry to the API showing it settled, and to the reaper's
    round that settled it."""
    proc = start_worker(url, device, f"kill-{n}", log)
    try:
        wait_live(client, f"kill-{n}", proc)
        spec: dict[str, Any] = {
            "op": "sleep",
            "shape": [4],
            "device": "cuda:0" if device == "cuda" else "cpu",
            "params": {"seconds": 60},
            "warmup": 0,
            "repeat": 1,
            "trace": "none",
        }
        response = client.post("/v1/experiments", json=spec)
        if response.status_code != 202:
            raise RuntimeError(f"the experiment was refused: {response.text}")
        exp_id = response.json()["id"]
        deadline = time.monotonic() + 300
        while client.get(f"/v1/experiments/{exp_id}").json()["status"] != "running":
            if time.monotonic() > deadline:
                raise RuntimeError("the experiment never ran")
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker, its forkserver and its child
        proc.wait()
    expires = _moment(engine, "lease_expires_at", exp_id)  # no heartbeat moves it any more
    deadline = time.monotonic() + 120
    while True:
        status = client.get(f"/v1/experiments/{exp_id}").json()["status"]
        seen = datetime.now(UTC)
        if status in ("queued", "lost"):
            settled = _moment(engine, "available_at", exp_id) if status == "queued" else seen
            client.post(f"/v1/experiments/{exp_id}/cancel")
            return (seen - expires).total_seconds(), (settled - expires).total_seconds()
        if time.monotonic() > deadline:
            raise RuntimeError(f"still {status} two minutes after its lease expired")
        time.sleep(0.02)


def one_pass(args: argparse.Namespace, label: str, log: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-stop-"))
    database_url = args.database_url or f"sqlite:///{tmp / 'bench.db'}"
    engine = sa.create_engine(database_url)
    exits, seen, loads = [], [], []
    with api(database_url, args.lease_s, log) as (url, client):
        for i in range(args.runs):
            exits.append(sigterm_exit(url, client, args.device, log, i))
            loads.append(os.getloadavg()[0])
            shown, round_at = expiry_seen(url, client, engine, args.device, log, i)
            seen.append(shown)
            loads.append(os.getloadavg()[0])
            print(
                f"  {label} run {i}: exit {exits[-1]:.2f} s after SIGTERM, re-queued "
                f"{shown:+.2f} s after expiry (the reaper's round {round_at:+.2f} s), "
                f"load {loads[-1]:.1f}",
                flush=True,
            )
    engine.dispose()
    return {"label": label, "exits": exits, "seen": seen, "load": (min(loads), max(loads))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease-s", type=float, default=3.0)
    parser.add_argument("--load", type=int, default=8, help="busy processes beside it; 0: none")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="vramlab-stop-log-")) / "service.log"
    passes = [one_pass(args, "quiet", log)]
    if args.load:
        with busy(args.load):
            passes.append(one_pass(args, f"{args.load} busy", log))
    print(f"\nworker --device {args.device}, default flags; lease {args.lease_s:g} s")
    print(
        f"{'pass':<10} {'load avg':>10} {'SIGTERM to exit s':>18} {'expiry to queued s':>19}",
        end="",
    )
    print(f" {'target':>7}")
    print(f"{'':<10} {'':>10} {'median (max)':>18} {'median (max)':>19}")
    for p in passes:
        lo, hi = p["load"]
        exits = f"{statistics.median(p['exits']):.2f} ({max(p['exits']):.2f})"
        seen = f"{statistics.median(p['seen']):.2f} ({max(p['seen']):.2f})"
        print(f"{p['label']:<10} {f'{lo:.1f}-{hi:.1f}':>10} {exits:>18} {seen:>19} {TARGET_S:7g}")
    print(f"(log: {log})")


if __name__ == "__main__":
    main()
