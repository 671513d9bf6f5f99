"""Model submits under a hostile submitter, and plain reads beside them (issue 31's goal).

    python bench/predictor_load.py [--children 2] [--attack-s 20] [--benign-submitters 1]

A `vramlab serve` (open, on a temporary SQLite file, no worker) predicts with its own
children. A submitter is its address: from 127.0.0.2, a hostile model spec changed every
second (GPT-2 a million blocks deep, T5 with a 100,000-block decoder, an encoder-decoder
just small enough to be traced whole, a config that cannot be built, in turn); from
127.0.0.4, a plain read (``GET /v1/experiments?limit=1``) after another. Five seconds
into the attack, 12 distinct benign model specs (GPT-2 small, CUDA, batch 1 to 12) are
submitted 5 times each at once, from ``--benign-submitters`` addresses (127.0.0.1, then
127.0.1.x). Printed: each benign submit's time to its 202 (and whether it carried its
prediction), what the hostile specs were answered, the reads' p50, p99 and max,
before and during the attack, and the CPU seconds the predictor children used during it
(a figure the machine's load changes less than the wall clock's). Goal: every benign
submit answered in <= 5 s with its prediction; reads' p99 <= 200 ms.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
HOSTILE, READER = "127.0.0.2", "127.0.0.4"


def benign(batch: int) -> dict[str, Any]:
    params = {"model": "gpt2", "batch_size": batch, "seq_len": 128}
    return {"op": "model", "shape": [], "device": "cuda", "params": params}


def hostile(i: int) -> dict[str, Any]:
    kind = i % 4
    if kind == 0:
        params: dict[str, Any] = {"model": "gpt2", "config": {"n_layer": 1_000_000 + i}}
    elif kind == 1:
        params = {"model": "t5", "config": {"num_decoder_layers": 100_000 + i}}
    elif kind == 2:  # stacks of different depths, 47 blocks: traced whole, the costliest
        params = {
            "model": "t5",
            "config": {"num_layers": 24, "num_decoder_layers": 23, "d_ff": 1000 + i},
        }
    else:
        params = {"model": "gpt2", "config": {"n_head": 0, "n_embd": 768 + i}}
    params.update(batch_size=1, seq_len=32)
    return {"op": "model", "shape": [], "device": "cuda", "params": params}


def client(url: str, address: str, timeout: float = 120) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=timeout)


async def reads(url: str, until: asyncio.Event, out: list[float]) -> None:
    async with client(url, READER) as http:
        while not until.is_set():
            start = time.perf_counter()
            r = await http.get("/v1/experiments", params={"limit": 1})
            r.raise_for_status()
            out.append(time.perf_counter() - start)
            await asyncio.sleep(0.05)


async def attack(url: str, until: asyncio.Event, out: list[tuple[float, int, str]]) -> None:
    async with client(url, HOSTILE) as http:
        i = 0

        async def one(spec: dict[str, Any]) -> None:
            start = time.perf_counter()
            r = await http.post("/v1/experiments", json=spec)
            message = r.json().get("error", {}).get("message", "")[:70] if r.is_error else ""
            out.append((time.perf_counter() - start, r.status_code, message))

        tasks = []
        while not until.is_set():
            tasks.append(asyncio.create_task(one(hostile(i))))
            i += 1
            await asyncio.sleep(1.0)
        await asyncio.gather(*tasks)


async def burst(url: str, submitters: int) -> list[tuple[float, int, bool]]:
    addresses = ["127.0.0.1", *(f"127.0.1.{k}" for k in range(1, submitters))]
    clients = [client(url, a) for a in addresses]
    results: list[tuple[float, int, bool]] = []

    async def one(http: httpx.AsyncClient, spec: dict[str, Any]) -> None:
        start = time.perf_counter()
        r = await http.post("/v1/experiments", json=spec)
        predicted = (
            r.status_code == 202 and r.json()["prediction"].get("peak_allocated") is not None
        )
        results.append((time.perf_counter() - start, r.status_code, predicted))

    specs = [benign(b) for b in range(1, 13) for _ in range(5)]
    await asyncio.gather(*(one(clients[n % len(clients)], s) for n, s in enumerate(specs)))
    for c in clients:
        await c.aclose()
    return results


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show_reads(label: str, values: list[float]) -> None:
    ms = [v * 1000 for v in values]
    print(
        f"reads {label}: n={len(ms)} p50={statistics.median(ms):.0f} ms "
        f"p99={pct(ms, 0.99):.0f} ms max={max(ms):.0f} ms"
    )


def children_cpu(api_pid: int) -> float:
    """CPU seconds used so far by the API's predictor children."""
    import psutil

    total = 0.0
    for child in psutil.Process(api_pid).children(recursive=True):
        try:
            if "workers.models.predict" in child.cmdline():
                times = child.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass
    return total


async def scenario(url: str, attack_s: float, submitters: int, api_pid: int) -> None:
    # Warm: each child started (torch imported) and GPT-2 traced once.
    async with client(url, "127.0.0.3", timeout=600) as http:
        warm = await http.post("/v1/experiments", json=benign(64))
        print(f"warm-up submit: {warm.status_code}")
    quiet: list[float] = []
    stop = asyncio.Event()
    reader = asyncio.create_task(reads(url, stop, quiet))
    await asyncio.sleep(5)
    stop.set()
    await reader
    show_reads("alone", quiet)

    cpu_before = children_cpu(api_pid)
    during: list[float] = []
    hostile_out: list[tuple[float, int, str]] = []
    stop = asyncio.Event()
    reader = asyncio.create_task(reads(url, stop, during))
    attacker = asyncio.create_task(attack(url, stop, hostile_out))
    await asyncio.sleep(5)
    results = await burst(url, submitters)
    await asyncio.sleep(max(0.0, attack_s - 5))
    stop.set()
    await asyncio.gather(reader, attacker)
    print(f"predictor children's CPU during the attack: {children_cpu(api_pid) - cpu_before:.1f} s")

    took = [t for t, _, _ in results]
    statuses = sorted({s for _, s, _ in results})
    print(
        f"benign submits: {len(results)}, statuses {statuses}, with prediction "
        f"{sum(p for _, _, p in results)}, time to 202 p50={statistics.median(took):.2f} s "
        f"max={max(took):.2f} s, over 5 s: {sum(t > 5 for t in took)}"
    )
    show_reads("during the attack", during)
    answered: dict[tuple[int, str], list[float]] = {}
    for t, status, message in hostile_out:
        answered.setdefault((status, message.split(":")[0][:60]), []).append(t)
    for (status, message), times in sorted(answered.items()):
        print(f"hostile: {len(times)} x {status} in <= {max(times):.2f} s  {message}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--children", type=int, default=2)
    ap.add_argument("--attack-s", type=float, default=20.0)
    ap.add_argument("--benign-submitters", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-"))
    port = 8000 + os.getpid() % 1000
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
        "VRAMLAB_MODEL_PREDICTOR_CHILDREN": str(args.children),
        "VRAMLAB_OPEN_HOSTS": '["*"]',
        "PYTHONPATH": str(ROOT),
    }
    log = (tmp / "service.log").open("wb")
    api = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the API did not start; see {tmp / 'service.log'}")
            time.sleep(0.2)
        print(f"load before: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")
        asyncio.run(scenario(url, args.attack_s, args.benign_submitters, api.pid))
        print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    finally:
        api.terminate()
        api.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
