"""How long the API takes to plan a scenario, and whether a concurrent submit is answered
meanwhile: the issue's 740-byte scenario, specs at the planner's limits, and a sweep.

    python bench/planning.py [--no-service] [--rounds 5]

First plans each spec in this process (the API's own code, no HTTP) and prints the best
of ``--rounds`` runs, or the 422 the API gives it. Then, unless --no-service, starts
`vramlab serve` on a temporary SQLite file, submits the heaviest accepted spec from
several threads and, meanwhile, times light submits side by side with the same light
submits on an idle service.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.config import Settings  # noqa: E402
from app.core.errors import InvalidSpec  # noqa: E402
from app.experiments.spec_schemas import ExperimentSpec  # noqa: E402
from app.experiments.specs import accept  # noqa: E402
from app.sweeps import service as sweeps  # noqa: E402
from app.sweeps.schemas import SweepIn  # noqa: E402

LIGHT = {"op": "add", "shape": [8, 8], "dtype": "float32", "device": "cpu"}


def scenario(steps: list[dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    return {"op": "scenario", "shape": [1], "dtype": "float32", "device": device, "steps": steps}


def create(name: str, count: int) -> dict[str, Any]:
    return {"do": "create", "name": name, "shape": [1], "count": count}


def repeat(times: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"do": "repeat", "times": times, "steps": steps}


X = {"do": "create", "name": "x", "shape": [4, 8]}
EXP = {"do": "op", "name": "x", "fn": "exp", "args": ["x"]}
TRANSPOSE = {"do": "op", "name": "x", "fn": "transpose_contiguous", "args": ["x"]}
HALVE = {"do": "delete", "name": "xs", "every": 2}
ISSUE_740 = scenario(
    [create(f"t{i}", 4096) for i in range(10)]
    + [{"do": "repeat", "times": 4000, "steps": [{"do": "empty_cache"}]}]
)
CASES: list[tuple[str, dict[str, Any]]] = [
    ("issue's 740-byte scenario", ISSUE_740),
    ("64 creates of 4096", scenario([create(f"t{i}", 4096) for i in range(64)])),
    (
        "repeat 19000 x create 4096",
        scenario([{"do": "repeat", "times": 19_000, "steps": [create("t", 4096)]}]),
    ),
    (
        "63 x 4096 named, then 20000 steps",
        scenario(
            [create(f"t{i}", 4096) for i in range(63)]
            + [{"do": "repeat", "times": 19_000, "steps": [{"do": "synchronize"}]}]
        ),
    ),
    (
        "x = exp(x) 20000 times",
        scenario(
            [
                {"do": "create", "name": "x", "shape": [64, 64]},
                {
                    "do": "repeat",
                    "times": 19_990,
                    "steps": [{"do": "op", "name": "x", "fn": "exp", "args": ["x"]}],
                },
            ]
        ),
    ),
    (
        "nested repeats, 20000 steps",
        scenario(
            [
                {
                    "do": "repeat",
                    "times": 100,
                    "steps": [
                        {
                            "do": "repeat",
                            "times": 66,
                            "steps": [
                                {"do": "create", "name": "a", "shape": [32]},
                                {"do": "op", "name": "b", "fn": "add", "args": ["a", "a"]},
                                {"do": "delete", "name": "a"},
                            ],
                        }
                    ],
                }
            ]
        ),
    ),
    (
        "500 steps written, each run once",
        scenario([X, repeat(1, [EXP] * 498)]),
    ),
    (
        "repeat 20 x a 498-step body",
        scenario([X, repeat(20, [TRANSPOSE] * 498)]),
    ),
    (
        "halving a list of 4096, 120-step body",
        scenario([create("xs", 4096), X, repeat(38, [HALVE, *[EXP] * 119])]),
    ),
]


def plan_seconds(spec: dict[str, Any], settings: Settings, rounds: int) -> tuple[float, str]:
    parsed = ExperimentSpec.model_validate(spec)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        try:
            accept(parsed, settings)
            outcome = "accepted"
        except InvalidSpec as exc:
            outcome = f"422 {exc.message[:70]}"
        times.append(time.perf_counter() - t0)
    return min(times), outcome


def sweep_seconds(body: dict[str, Any], settings: Settings, rounds: int) -> tuple[float, str]:
    parsed = SweepIn.model_validate(body)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        try:
            outcome = f"accepted, {len(sweeps.plan(parsed, settings, lambda: 'cpu'))} points"
        except InvalidSpec as exc:
            outcome = f"422 {exc.message[:70]}"
        times.append(time.perf_counter() - t0)
    return min(times), outcome


def light_latencies(client: httpx.Client, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v1/experiments", json=LIGHT)
        r.raise_for_status()
        out.append(time.perf_counter() - t0)
    return out


def service_figures(heavy: dict[str, Any], port: int, n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-bench-"))
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
        "VRAMLAB_MAX_QUEUED_PER_TOKEN": "100000",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--log-level", "warning"]
    log = (tmp / "serve.log").open("wb")
    api = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.get("/healthz")
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"serve did not start; see {tmp}") from None
                    time.sleep(0.2)
            idle = light_latencies(client, n)
            heavy_times: list[float] = []
            stop = threading.Event()

            def load() -> None:
                with httpx.Client(base_url=client.base_url, timeout=120) as c:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        c.post("/v1/experiments", json=heavy).raise_for_status()
                        heavy_times.append(time.perf_counter() - t0)

            threads = [threading.Thread(target=load) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.5)
            loaded = light_latencies(client, n)
            stop.set()
            for t in threads:
                t.join()
    finally:
        api.terminate()
        api.wait(30)
    print()
    print(f"{'light submit (SQLite)':34} {'median s':>9} {'max s':>9}")
    print(f"{'idle service':34} {statistics.median(idle):9.4f} {max(idle):9.4f}")
    print(
        f"{'while 2 threads submit the heaviest':34} "
        f"{statistics.median(loaded):9.4f} {max(loaded):9.4f}"
    )
    print(f"ratio loaded/idle (median): {statistics.median(loaded) / statistics.median(idle):.2f}")
    if heavy_times:
        print(f"heaviest spec's submit: median {statistics.median(heavy_times):.4f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=40, help="light submits per side")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--no-service", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    print(f"{'spec':36} {'plan s':>8}  outcome")
    slowest: tuple[float, dict[str, Any]] = (0.0, LIGHT)
    for name, spec in CASES:
        seconds, outcome = plan_seconds(spec, settings, args.rounds)
        print(f"{name:36} {seconds:8.4f}  {outcome}")
        if outcome == "accepted" and seconds > slowest[0]:
            slowest = (seconds, spec)
    slow = CASES[-1][1]
    for name, grid in (
        (
            "sweep: 1000 points, one plan",
            {"repeat": list(range(1, 201)), "warmup": [0, 1, 2, 3, 4]},
        ),
        ("sweep: 4 dtypes, 4 plans", {"dtype": ["float32", "float16", "bfloat16", "float64"]}),
        (
            "sweep: 7 dtypes, 7 plans",
            {"dtype": ["float32", "float16", "bfloat16", "float64", "int8", "int32", "int64"]},
        ),
    ):
        seconds, outcome = sweep_seconds({"spec": slow, "grid": grid}, settings, args.rounds)
        print(f"{name:36} {seconds:8.4f}  {outcome}")
    if not args.no_service:
        service_figures(slowest[1], args.port, args.n)


if __name__ == "__main__":
    main()
