"""Trace exports through the real API: a synthetic 1M-event trace uploaded over the
worker protocol (PUT trace chunks, as a worker does), then read back in every format.

    python bench/trace_export.py [--events 1000000] [--chunk 50000] [--baseline DIR]
        [--repeat N] [--format memory_viz ...] [--stacks]

Starts `vramlab serve` on a temporary SQLite file, registers as a worker, claims one
experiment and uploads the trace in gzip NDJSON chunks, then streams `ndjson`,
`memory_viz` and `chrome` exports. Prints, per format, the bytes, the time, MB/s of the
export, MB/s of the trace (its NDJSON size over the time) and the API process's resident
memory at its highest during the export against before it, and the CPU seconds (user +
system) the API process spent on it (and on the upload, a chunk); beside each export, the
reference measured in the same round: the stored chunks read from the database file and
gunzipped in this process (what any export must at least do), as MB/s of the trace. The
summary gives medians over ``--repeat`` rounds, each export's MB/s over the reference's,
and whether it meets the issue's target (MB/s of the export: ndjson and memory_viz >= 50,
chrome >= 20), saying so when it does not.

`--baseline DIR` (another checkout of vramlab, e.g. the main branch) starts a second
`vramlab serve` from DIR on the same database file (with `--no-migrate`: ours migrated it,
to a revision DIR may not know) and streams each format from both in turn, `--repeat`
times, so the two are measured side by side under the same load; it prints the
baseline's time over ours for each format (the median of the repeats), and its MB/s and
CPU. `--format` measures only the formats named. `--stacks` records the trace as a
worker does with ``"trace": "stacks"``: every event carries its Python frames (a free
its block's, as PyTorch's ``context="alloc"`` records them), from a few hundred distinct
stacks.
"""

import argparse
import gzip
import itertools
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
from service import ROOT, _free_port

CAPS = {
    "device_types": ["cpu", "cuda"],
    "gpus": [{"index": 0, "name": "bench GPU", "total_memory": 80 * 2**30}],
    "torch": "bench",
}
SPEC = {"op": "add", "shape": [1000, 1000], "dtype": "float32", "device": "cuda"}
MEMORY_KEYS = [
    "allocated_before",
    "allocated_after",
    "allocated_peak",
    "reserved_before",
    "reserved_after",
    "reserved_peak",
    "delta_allocated",
    "host_rss_before",
    "host_rss_after",
]


def _stacks(rnd: random.Random, n: int = 300) -> list[list[dict[str, Any]]]:
    """Distinct Python stacks as the tracer writes them: innermost first, 8 to 24 deep."""
    files = [f"/opt/venv/lib/python3.11/site-packages/torch/nn/modules/m{i}.py" for i in range(40)]
    names = ["forward", "_call_impl", "_wrapped_call_impl", "linear", "train_step", "<module>"]
    return [
        [
            {"filename": rnd.choice(files), "line": rnd.randint(1, 2000), "name": rnd.choice(names)}
            for _ in range(rnd.randint(8, 24))
        ]
        for _ in range(n)
    ]


def synthetic(n: int, seed: int = 0, stacks: bool = False) -> Iterator[dict[str, Any]]:
    """A CUDA-like trace: segments, allocations of common sizes, frees in random order;
    with ``stacks``, every event's frames (a free's are its allocation's)."""
    rnd = random.Random(seed)
    table = _stacks(random.Random(seed + 1)) if stacks else []
    frames_of: dict[int, list[dict[str, Any]]] = {}
    live: list[tuple[int, int]] = []
    addr, t, seq = 0x7F0000000000, 0.0, 0
    while seq < n:
        phase = ("setup", "op", "after")[min(2, seq * 3 // n)]
        r = rnd.random()
        rows: list[tuple[str, int, int]]
        if r < 0.02:
            size = 2**21 * rnd.randint(1, 10)
            rows = [("segment_alloc", addr, size)]
            addr += size + 4096
        elif r < 0.55 or not live:
            size = rnd.choice([512, 1024, 4096, 65536, 2**20, 4_000_000])
            live.append((addr, size))
            rows = [("alloc", addr, size)]
            addr += size + 512
        else:
            block, size = live.pop(rnd.randrange(len(live)))
            rows = [("free_requested", block, size), ("free_completed", block, size)]
        for action, where, size in rows:
            if seq >= n:
                break
            t += rnd.random() * 3
            event: dict[str, Any] = {
                "seq": seq,
                "t_us": round(t, 3),
                "action": action,
                "addr": where,
                "size": size,
                "device": "cuda:0",
                "stream": 0,
                "phase": phase,
            }
            if stacks:
                if action in ("alloc", "segment_alloc"):
                    frames_of[where] = rnd.choice(table)
                event["frames"] = frames_of.get(where, [])
                if action == "free_completed":
                    frames_of.pop(where, None)
            yield event
            seq += 1


class PeakRss:
    """The highest resident memory of a process while inside, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> "PeakRss":
        self.cpu = _cpu(self.proc)
        self.before = self.proc.memory_info().rss
        self.peak = self.before
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu = _cpu(self.proc) - self.cpu  # seconds of CPU (user + system) inside


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--baseline", type=Path, default=None, help="a vramlab checkout")
    parser.add_argument("--repeat", type=int, default=1, help="exports of each format")
    parser.add_argument("--stacks", action="store_true", help="every event with its frames")
    parser.add_argument(
        "--format",
        action="append",
        choices=sorted(TARGETS),
        help="only this format (repeatable; all when not given)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-"))
    database = f"sqlite:///{tmp / 'bench.db'}"
    with ExitStack() as stack:
        ours = stack.enter_context(_serve(ROOT, database, tmp / "api.log"))
        servers = {"ours": ours}
        upload = _upload(*ours, args.events, args.chunk, args.stacks)
        if args.baseline is not None:
            # Ours migrated the database: the baseline may not know its newest revision.
            base = _serve(args.baseline.resolve(), database, tmp / "baseline.log", migrate=False)
            servers["baseline"] = stack.enter_context(base)
        formats = args.format or ["ndjson", "memory_viz", "chrome"]
        measure(servers, *upload, args.repeat, tmp / "bench.db", formats)


class _serve:
    """``vramlab serve`` from the checkout ``root`` on ``database``: (client, pid)."""

    def __init__(self, root: Path, database: str, log: Path, migrate: bool = True) -> None:
        self.root, self.database, self.log, self.migrate = root, database, log, migrate

    def __enter__(self) -> tuple[httpx.Client, int]:
        port = _free_port()
        env = {
            **os.environ,
            "VRAMLAB_DATABASE_URL": self.database,
            "VRAMLAB_LEASE_SECONDS": "3600",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(self.root), os.environ.get("PYTHONPATH")) if p
            ),
            "PYTHONDONTWRITEBYTECODE": "1",  # leave another checkout as it is
        }
        cli = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
        self.api = subprocess.Popen(
            [*cli, "--log-level", "warning", *([] if self.migrate else ["--no-migrate"])],
            env=env,
            cwd=self.root,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.client.get("/readyz").status_code == 200:
                    return self.client, self.api.pid
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.api.poll() is not None:
                raise RuntimeError(f"the API did not start; see {self.log}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.api.terminate()
        self.api.wait(timeout=60)


def _upload(
    client: httpx.Client, pid: int, n_events: int, chunk: int, stacks: bool = False
) -> tuple[str, int]:
    """Queue, claim and upload the synthetic trace as a worker does: (experiment, bytes)."""
    client.post("/v1/experiments", json=SPEC).raise_for_status()
    reply = client.post(
        "/v1/worker/register", json={"name": "bench", "hostname": "bench", "capabilities": CAPS}
    )
    reply.raise_for_status()
    claimed = client.post(
        "/v1/worker/claim", json={"worker_id": reply.json()["worker_id"], "wait_s": 5}
    ).json()
    exp_id, token = claimed["id"], claimed["lease_token"]
    events = synthetic(n_events, stacks=stacks)
    ndjson_bytes, upload_s, upload_cpu, seq = 0, 0.0, 0.0, 0
    api = psutil.Process(pid)
    while True:
        lines = [
            json.dumps(e, separators=(",", ":")).encode() for e in itertools.islice(events, chunk)
        ]
        if not lines:
            break
        text = b"\n".join(lines) + b"\n"
        ndjson_bytes += len(text)
        body = gzip.compress(text, compresslevel=6)
        started, cpu = time.perf_counter(), _cpu(api)
        response = client.put(
            f"/v1/worker/experiments/{exp_id}/trace/{seq}",
            content=body,
            headers={"X-Lease-Token": token, "Content-Type": "application/gzip"},
        )
        upload_s += time.perf_counter() - started
        upload_cpu += _cpu(api) - cpu
        response.raise_for_status()
        seq += 1
    result = {"memory": dict.fromkeys(MEMORY_KEYS, 0)}
    client.post(
        f"/v1/worker/experiments/{exp_id}/result",
        json={
            "lease_token": token,
            "status": "succeeded",
            "result": result,
            "trace_events": n_events,
        },
    ).raise_for_status()
    print(
        f"\ntrace: {n_events:,} events{' with stacks' if stacks else ''}, "
        f"{ndjson_bytes / 1e6:.1f} MB of NDJSON in {seq} chunks; "
        f"uploaded in {upload_s:.1f} s of API time ({ndjson_bytes / 1e6 / upload_s:.1f} MB/s), "
        f"{upload_cpu:.2f} s of API CPU ({upload_cpu / seq * 1000:.0f} ms a chunk)"
    )
    return exp_id, ndjson_bytes


TARGETS = {"ndjson": 50.0, "memory_viz": 50.0, "chrome": 20.0}  # MB/s of the export


def measure(
    servers: dict[str, tuple[httpx.Client, int]],
    exp_id: str,
    ndjson_bytes: int,
    repeat: int,
    database: Path,
    formats: list[str],
) -> None:
    print(
        f"{'format':<11} {'server':<9} {'MB':>8} {'s':>7} {'MB/s':>7} {'trace MB/s':>11} "
        f"{'API RSS MB':>16} {'gunzip MB/s':>12} {'API CPU s':>10}"
    )
    for fmt in formats:
        times: dict[str, list[float]] = {name: [] for name in servers}
        cpus: dict[str, list[float]] = {name: [] for name in servers}
        refs: list[float] = []
        peaks: list[float] = []
        befores: list[float] = []
        size = 0
        for _ in range(repeat):
            for name, (client, pid) in servers.items():
                ref = _reference(database, exp_id)
                refs.append(ref)
                size, elapsed, rss = _export(client, pid, exp_id, fmt)
                times[name].append(elapsed)
                cpus[name].append(rss.cpu)
                if name == "ours":
                    peaks.append(rss.peak / 1e6)
                    befores.append(rss.before / 1e6)
                print(
                    f"{fmt:<11} {name:<9} {size / 1e6:8.1f} {elapsed:7.2f} "
                    f"{size / 1e6 / elapsed:7.1f} {ndjson_bytes / 1e6 / elapsed:11.1f} "
                    f"{rss.before / 1e6:7.0f} -> {rss.peak / 1e6:5.0f} "
                    f"{ndjson_bytes / 1e6 / ref:12.1f} {rss.cpu:10.2f}"
                )
        took = statistics.median(times["ours"])
        mbs, ref_mbs = size / 1e6 / took, ndjson_bytes / 1e6 / statistics.median(refs)
        verdict = "meets" if mbs >= TARGETS[fmt] else "BELOW"
        print(
            f"{fmt:<11} median {took:.2f} s, {mbs:.1f} MB/s of the export "
            f"({ndjson_bytes / 1e6 / took:.1f} of the trace); gunzip reference "
            f"{ref_mbs:.1f} MB/s of the trace: trace MB/s / reference "
            f"{ndjson_bytes / 1e6 / took / ref_mbs:.2f}; API CPU "
            f"{statistics.median(cpus['ours']):.2f} s; API RSS "
            f"{statistics.median(befores):.0f} -> {max(peaks):.0f} MB at most; "
            f"{verdict} its target of {TARGETS[fmt]:.0f} MB/s"
        )
        if "baseline" in times:
            ratio = statistics.median(times["baseline"]) / took
            base_cpu = statistics.median(cpus["baseline"])
            print(
                f"{fmt:<11} baseline time / ours: {ratio:.2f}x; baseline median "
                f"{statistics.median(times['baseline']):.2f} s, "
                f"{size / 1e6 / statistics.median(times['baseline']):.1f} MB/s, "
                f"API CPU {base_cpu:.2f} s"
            )


def _reference(database: Path, exp_id: str) -> float:
    """Seconds to read the stored chunks from the database file and gunzip them."""
    started = time.perf_counter()
    with sqlite3.connect(database) as conn:
        rows = conn.execute(
            "SELECT data FROM trace_chunks WHERE experiment_id = ? ORDER BY seq", (exp_id,)
        )
        for (data,) in rows:
            zlib.decompress(data, wbits=31)
    return time.perf_counter() - started


def _export(client: httpx.Client, pid: int, exp_id: str, fmt: str) -> tuple[int, float, PeakRss]:
    size = 0
    with PeakRss(pid) as rss:
        started = time.perf_counter()
        with client.stream(
            "GET", f"/v1/experiments/{exp_id}/trace", params={"format": fmt}
        ) as response:
            response.raise_for_status()
            for piece in response.iter_raw():
                size += len(piece)
        elapsed = time.perf_counter() - started
    return size, elapsed, rss


if __name__ == "__main__":
    main()
