"""Tiny experiments through the real API: single claims and reports against batches,
side by side in one run, on SQLite and on PostgreSQL, with API time per experiment.

    python bench/worker_batches.py [-n 400] [--concurrency 2] [--batch 16]
                                   [--engines sqlite,postgres] [--no-profile]
                                   [--device cpu|cuda] [--submit posts|sweep]
                                   [--modes 1,16] [--pace 0,20] [--reference]

For each database (a temporary SQLite file; a temporary database on the PostgreSQL at
VRAMLAB_BENCH_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/postgres) and
each worker setting (`--batch 1`: one claim and one report per experiment, as before;
`--batch K`: claims and reports in batches) it starts `vramlab serve` and a CPU
`vramlab worker --concurrency N` whose experiments run in shared processes, submits N
tiny `add` experiments at once (one POST each, 4 client threads) and times them from the
first submit to the last finished, by the API's own timestamps. It prints experiments a
second, the API process's CPU time per experiment (submit, claim, report and the
client's polling, all of it) and whether every result's allocator figures are equal to
the single-claim run's. Then, unless --no-profile, it runs each engine's batch setting
again with the API under cProfile (bench/profiled_serve.py: every thread, timed by its
CPU time) and prints where the API's time went, per experiment, by layer and by function.

``--pace 0,20`` runs each batch mode once with each worker ``--pace-ms`` given (0: each
loop claims and reports on its own). Beside each rate it prints how many experiments a
claim took and a batch report carried on average (the API's /metrics counters).

``--submit sweep`` submits one sweep of N points (a grid of N shapes, one POST) instead of
N POSTs, and times it from the POST to the last result seen by the client: the issue's
"1,000-point sweep in <= 10 s". ``--device cuda`` runs the experiments on the GPU.
``--reference`` first times the same op in a loop in one process (the same allocator
figures read after each), the floor any service sits above. Rates below the issue's
targets (>= 200 a second on one GPU; a 1,000-point sweep in <= 10 s) are marked BELOW.
"""

import argparse
import os
import pstats
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from service import ROOT, run_to_end, running_service
from sqlalchemy import create_engine, text

from app.core.config import normalise_database_url
from vramlab.contract import ALLOCATOR_KEYS

SPEC: dict[str, Any] = {
    "op": "add",
    "shape": [64, 64],
    "dtype": "float32",
    "device": "cpu",
    "isolation": "shared",
    "warmup": 0,
    "repeat": 1,
    "trace": "none",
}
TARGET_RATE = 200.0  # experiments a second, shared processes, one GPU
TARGET_SWEEP_S = 10.0  # a 1,000-point sweep, submit to its last result
POSTGRES = os.environ.get(
    "VRAMLAB_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# Where the API's time goes: a function's own time, by the first of these its file holds.
LAYERS = (
    ("sqlalchemy", "SQLAlchemy (ORM, Core, pool)"),
    ("psycopg", "psycopg (PostgreSQL driver)"),
    ("sqlite3", "sqlite3"),
    ("pydantic", "pydantic (validation, serialisation)"),
    ("fastapi", "FastAPI (routing, dependencies)"),
    ("starlette", "Starlette"),
    ("anyio", "anyio (thread pool hops)"),
    ("uvicorn", "uvicorn + h11/httptools"),
    ("h11", "uvicorn + h11/httptools"),
    ("httptools", "uvicorn + h11/httptools"),
    ("asyncio", "asyncio event loop"),
    ("json", "json"),
    ("/app/", "vramlab (app/)"),
)


def _at(stamp: str) -> float:
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@contextmanager
def database(engine: str) -> Iterator[str | None]:
    """None: the service's own temporary SQLite file; else a PostgreSQL database of its own."""
    if engine == "sqlite":
        yield None
        return
    admin_url = normalise_database_url(POSTGRES)
    name = f"vramlab_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _api_cpu_seconds() -> float:
    total = 0.0
    for proc in psutil.Process().children():
        try:
            if "--port" in proc.cmdline() and "worker" not in proc.cmdline():
                total += sum(proc.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def _batch_calls(client: httpx.Client) -> dict[str, tuple[float, float]]:
    """The API's claims that took work and its batch reports so far: (requests, experiments)
    by call, from /metrics."""
    text = client.get("/metrics").text
    found: dict[str, list[float]] = {}
    for name, index in (("vramlab_batch_calls_total", 0), ("vramlab_batch_experiments_total", 1)):
        for call, value in re.findall(rf'^{name}\{{call="(\w+)"\}} (\S+)$', text, re.M):
            found.setdefault(call, [0.0, 0.0])[index] = float(value)
    return {call: (v[0], v[1]) for call, v in found.items()}


def _listed(client: httpx.Client, tag: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"tag": tag, "limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/experiments", params=params).json()
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def _wait_for(client: httpx.Client, tag: str) -> None:
    while True:
        time.sleep(0.1)  # cheap to answer: one unfinished row at most
        waiting = client.get(
            "/v1/experiments", params={"tag": tag, "status": ["queued", "running"], "limit": 1}
        ).json()
        if not waiting["items"]:
            return


def _shape(i: int) -> list[int]:
    return [64, 1 + i]


class Run:
    """One measured run: its rate, wall time, API CPU and every point's figures."""

    def __init__(
        self,
        n: int,
        wall_s: float,
        span_s: float,
        api_ms: float,
        figures: Any,
        calls: dict[str, float],
    ):
        self.n, self.wall_s, self.span_s, self.api_ms, self.figures = (
            n,
            wall_s,
            span_s,
            api_ms,
            figures,
        )
        # Experiments a claim took, and a batch report carried, on average.
        self.calls = calls

    @property
    def rate(self) -> float:
        return self.n / self.span_s


def sweep(client: httpx.Client, n: int, spec: dict[str, Any], submit: str) -> Run:
    """Submit N tiny experiments (N POSTs, or one sweep of N shapes), wait for every result."""
    run_to_end(client, spec)  # the shared processes start: not counted
    tag = f"sweep-{uuid.uuid4().hex[:8]}"
    body = {**spec, "tags": [tag]}
    calls_before = _batch_calls(client)
    cpu_before = _api_cpu_seconds()
    started = time.perf_counter()
    if submit == "sweep":
        # An axis holds at most 200 values: shapes times repeats.
        repeats = -(-n // 200)
        if n % repeats:
            raise SystemExit(f"-n {n}: with --submit sweep, a multiple of {repeats}")
        grid = {
            "shape": [_shape(i) for i in range(n // repeats)],
            "repeat": list(range(1, repeats + 1)),
        }
        response = client.post("/v1/sweeps", json={"spec": body, "grid": grid})
        if response.status_code != 202:
            raise RuntimeError(f"sweep refused: {response.status_code} {response.text[:400]}")
    else:
        with ThreadPoolExecutor(4) as pool:
            for response in pool.map(lambda _: client.post("/v1/experiments", json=body), range(n)):
                response.raise_for_status()
    _wait_for(client, tag)
    wall = time.perf_counter() - started
    cpu_after = _api_cpu_seconds()
    items = _listed(client, tag)
    bad = [e["status"] for e in items if e["status"] != "succeeded"]
    if len(items) != n or bad:
        raise RuntimeError(f"{len(items)} of {n} listed; ended {bad[:5]}")
    first = min(_at(e["created_at"]) for e in items)
    last = max(_at(e["finished_at"]) for e in items)
    figures = {
        (
            tuple(e["spec"]["shape"]),
            e["spec"]["repeat"],
            tuple(e["result"]["memory"][k] for k in ALLOCATOR_KEYS),
        )
        for e in items
    }
    calls_after = _batch_calls(client)
    carried = {}
    for call, (requests, experiments) in calls_after.items():
        before = calls_before.get(call, (0.0, 0.0))
        made = requests - before[0]
        carried[call] = (experiments - before[1]) / made if made else 0.0
    return Run(n, wall, last - first, (cpu_after - cpu_before) * 1000 / n, figures, carried)


def reference_loop(n: int, device: str, submit: str) -> float:
    """The same op N times in a loop in one process, the allocator's figures read after
    each as the worker reads them: experiments a second with no service at all."""
    import torch

    dev = torch.device(device)
    shapes = [_shape(i % 200) if submit == "sweep" else SPEC["shape"] for i in range(n)]
    started = time.perf_counter()
    for shape in shapes:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        a = torch.ones(shape, device=dev)
        b = torch.ones(shape, device=dev)
        c = a + b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.memory_stats(dev)
        del a, b, c
    return n / (time.perf_counter() - started)


def where_the_time_went(path: Path, n: int, top: int = 12) -> None:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    layers: dict[str, float] = {}
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        layer = next((label for key, label in LAYERS if key in filename), "other (C, stdlib)")
        layers[layer] = layers.get(layer, 0.0) + tottime
    print(f"  API CPU under the profiler: {total * 1000 / n:.2f} ms an experiment, by layer:")
    for layer, seconds in sorted(layers.items(), key=lambda kv: -kv[1]):
        print(f"    {layer:<40} {seconds * 1000 / n:6.2f} ms  {seconds / total:5.1%}")
    print(f"  the {top} functions with the most own time (ms an experiment):")
    rows = sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]
    for (filename, line, name), (_cc, calls, tottime, _cumtime, _callers) in rows:
        where = filename.replace(str(ROOT) + "/", "").split("site-packages/")[-1]
        print(f"    {tottime * 1000 / n:6.3f}  {calls / n:6.1f} calls  {name}  ({where}:{line})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=400, help="experiments a sweep (default 400)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--modes", default=None, help="worker --batch values (default 1,BATCH)")
    parser.add_argument(
        "--pace",
        default=None,
        help="worker --pace-ms values to run each batch mode with (default: the worker's own)",
    )
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--submit", default="posts", choices=("posts", "sweep"))
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    spec = {**SPEC, "device": args.device}
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    batches = (args.modes or f"1,{args.batch}").split(",")
    paces = args.pace.split(",") if args.pace else [None]
    modes: list[tuple[str, list[str]]] = []
    for b in batches:
        if b == "1":
            modes.append(("single claims (--batch 1)", ["--batch", "1"]))
            continue
        for pace in paces:
            label = f"batches (--batch {b}" + (f" --pace-ms {pace})" if pace else ")")
            modes.append((label, ["--batch", b] + (["--pace-ms", pace] if pace else [])))
    reference = reference_loop(args.n, args.device, args.submit) if args.reference else None
    rows: list[tuple[str, str, Run, bool]] = []
    for engine in engines:
        seen: set[Any] | None = None
        for label, mode_args in modes:
            worker_args = ["--concurrency", str(args.concurrency), *mode_args]
            with (
                database(engine) as url,
                running_service(args.device, worker_args=worker_args, database_url=url) as client,
            ):
                run = sweep(client, args.n, spec, args.submit)
            seen = run.figures if seen is None else seen
            same = run.figures == seen
            rows.append((engine, label, run, same))
            print(
                f"{engine}, {label}: {run.rate:.1f}/s, {run.wall_s:.2f} s submit to last result "
                f"seen, API {run.api_ms:.2f} ms an experiment, experiments a claim "
                f"{run.calls.get('claim', 0):.1f}, a batch report {run.calls.get('report', 0):.1f}",
                flush=True,
            )
    how = "one sweep of N shapes" if args.submit == "sweep" else "N POSTs"
    print(
        f"\n{args.n} tiny shared-process {args.device} experiments (add 64xK float32, {how}), "
        f"worker --concurrency {args.concurrency}, submit to stored result through the real API"
    )
    if reference is not None:
        print(f"reference: the same op in a loop in one process: {reference:.0f}/s")
    print(
        f"{'database':<9} {'worker':<38} {'exp/s':>7} {'x':>6} {'wall s':>7} {'API ms/exp':>11}"
        f" {'a claim':>8} {'a report':>9}  figures"
    )
    for engine in engines:
        mine = [r for r in rows if r[0] == engine]
        base = mine[0][2].rate
        for _, label, run, same in mine:
            marks = []
            if args.device == "cuda" and run.rate < TARGET_RATE:
                marks.append(f"BELOW {TARGET_RATE:.0f}/s")
            if args.submit == "sweep" and args.n >= 1000 and run.wall_s > TARGET_SWEEP_S:
                marks.append(f"BELOW: sweep over {TARGET_SWEEP_S:.0f} s")
            print(
                f"{engine:<9} {label:<38} {run.rate:7.1f} {run.rate / base:6.2f} "
                f"{run.wall_s:7.2f} {run.api_ms:11.2f} {run.calls.get('claim', 0):8.1f} "
                f"{run.calls.get('report', 0):9.1f}  "
                f"{'equal to the first mode' if same else 'DIFFER'}  {' '.join(marks)}"
            )
    if reference is not None:
        best = max(r[2].rate for r in rows)
        print(f"best service rate / one-process loop: {best / reference:.3f}")
    if args.no_profile:
        return
    for engine in engines:
        for label, mode_args in modes:
            out = Path(tempfile.mkdtemp(prefix="vramlab-prof-")) / "api.prof"
            serve = [sys.executable, str(ROOT / "bench" / "profiled_serve.py"), str(out)]
            worker_args = ["--concurrency", str(args.concurrency), *mode_args]
            with database(engine) as url:
                with running_service(
                    args.device, worker_args=worker_args, database_url=url, serve=serve
                ) as client:
                    run = sweep(client, args.n, spec, args.submit)
                print(f"\n{engine}, {label}, API under cProfile ({run.rate:.1f}/s):")
                where_the_time_went(out, args.n)


if __name__ == "__main__":
    main()
