"""How long a plan takes on this machine (no GPU), warm: POST /v1/plans through a real
API process, its model predictor already started.

Two sizes, as issue 29 sets them: one model x 2 GPUs x 1 variant (goal: p50 <= 1 s) and
4 GPUs x 4 variants (goal: <= 5 s). Each is timed on fresh specs (a batch size not asked
before, so every step is traced: what a new question costs) and repeated (the
predictor's cache answers: what a page reload or a second user costs):

    python -m bench.plan_speed [--model gpt2] [--seq 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

SIZES: dict[str, tuple[list[str], list[dict[str, Any]], float]] = {
    "1 model x 2 GPUs x 1 variant": (["RTX 4090", "H100"], [{}], 1.0),
    "4 GPUs x 4 variants": (
        ["RTX 4090", "H100", "A100 40GB", "L4"],
        [{}, {"checkpointing": True}, {"precision": "bf16-autocast"}, {"micro_batches": 2}],
        5.0,
    ),
}


def _serve(port: int, db: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VRAMLAB_DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _ask(client: httpx.Client, body: dict[str, Any]) -> tuple[float, int]:
    started = time.perf_counter()
    r = client.post("/v1/plans", json=body)
    r.raise_for_status()
    return time.perf_counter() - started, int(r.json()["predictions"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8391)
    parser.add_argument("--suggest", action="store_true", help="ask for suggestions too")
    parser.add_argument("--quick", action="store_true", help="edges off a curve (verify: false)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc = _serve(args.port, Path(tmp) / "plan.db")
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=300) as client:
                for _ in range(100):
                    try:
                        client.get("/healthz")
                        break
                    except httpx.TransportError:
                        time.sleep(0.2)

                def body(batch: int, gpus: list[str], variants: list[Any]) -> dict[str, Any]:
                    params = {"model": args.model, "batch_size": batch, "seq_len": args.seq}
                    return {
                        "spec": {"op": "model", "params": params},
                        "gpus": gpus,
                        "variants": variants,
                        "suggest": args.suggest,
                        "verify": not args.quick,
                    }

                _ask(client, body(3, ["H100"], [{}]))  # warm: the predictor child starts
                rows = []
                batch = 4
                for name, (gpus, variants, goal) in SIZES.items():
                    fresh: list[float] = []
                    cached: list[float] = []
                    traced: list[int] = []
                    for _ in range(args.rounds):
                        batch += 2
                        seconds, n = _ask(client, body(batch, gpus, variants))
                        fresh.append(seconds)
                        traced.append(n)
                        cached.append(_ask(client, body(batch, gpus, variants))[0])
                    rows.append((name, statistics.median(fresh), statistics.median(traced),
                                 statistics.median(cached), goal))  # fmt: skip
        finally:
            proc.terminate()
            proc.wait()
    print(f"{args.model}, seq {args.seq}, suggestions {'on' if args.suggest else 'off'}, "
          f"edges {'estimated (quick)' if args.quick else 'traced (verify)'}, "
          f"median of {args.rounds}, {os.cpu_count()} CPUs")  # fmt: skip
    print("| plan | new question (s) | steps traced | repeated (s) | goal (s) |")
    print("| --- | --- | --- | --- | --- |")
    for label, fresh_s, steps, cached_s, target in rows:
        print(f"| {label} | {fresh_s:.2f} | {steps:g} | {cached_s:.3f} | {target:g} |")


if __name__ == "__main__":
    main()
