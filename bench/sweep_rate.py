"""A user's sweep through the real service: 1,000 tiny `add`s whose spec sets only
``isolation: shared`` (the trace and everything else at the spec's defaults), `vramlab
serve` and `vramlab worker` with their default flags, and a client reading the sweep's
progress 10 times a second as a progress bar does.

    python bench/sweep_rate.py [--device cpu|cuda] [--points 1000] [--runs 1]
                               [--database-url URL] [--worker-arg=--concurrency=4 ...]

Times submit to the sweep's last stored result (its progress says done), and prints
seconds and points a second beside the reference: the same op in a loop in one process
(the ceiling no service reaches). Targets (issue 32): >= 200 points a second and <= 5 s
on a GPU host; <= 10 s on the 2-core CPU machine.
"""

import argparse
import statistics
import threading
import time
from typing import Any

import httpx
from service import running_service

TARGET_RATE_GPU = 200.0
TARGET_S = {"cuda": 5.0, "cpu": 10.0}
READS_PER_S = 10


DTYPES = ["float32", "float16", "bfloat16", "float64", "int32"]


def body(points: int) -> dict[str, Any]:
    # Tiny shapes by dtype (a grid key takes at most 200 values); the spec names only the
    # op, its shape and isolation: the trace (events), device, repeats stay at defaults.
    dtypes = DTYPES[: max(1, min(len(DTYPES), -(-points // 200)))]
    shapes = -(-points // len(dtypes))
    return {
        "spec": {"op": "add", "shape": [1], "isolation": "shared"},
        "grid": {"dtype": dtypes, "shape": [[n] for n in range(1, shapes + 1)]},
    }


def reference(device: str, points: int) -> float:
    """Points a second of the op in a loop in one process (a tensor pair a point)."""
    import torch

    dev = torch.device("cuda" if device == "cuda" else "cpu")
    grid = body(points)["grid"]
    pairs = [
        (torch.ones(n, dtype=dt, device=dev), torch.ones(n, dtype=dt, device=dev))
        for dt in (getattr(torch, d) for d in grid["dtype"])
        for [n] in grid["shape"]
    ]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for a, b in pairs:
        torch.add(a, b)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return len(pairs) / (time.perf_counter() - began)


def one_sweep(client: httpx.Client, points: int) -> tuple[float, int, dict[str, int]]:
    """Seconds from submit to done, the progress reads made meanwhile, the counts."""
    reads = 0
    stop = threading.Event()
    sweep_id: list[str] = []

    def reader() -> None:
        nonlocal reads
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            while not stop.is_set():
                if sweep_id:
                    c.get(f"/v1/sweeps/{sweep_id[0]}/progress").raise_for_status()
                    reads += 1
                stop.wait(1 / READS_PER_S)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    began = time.perf_counter()
    response = client.post("/v1/sweeps", json=body(points))
    response.raise_for_status()
    sweep_id.append(response.json()["id"])
    seen = None
    while True:  # the bench's own wait: a long-poll, answered at each change
        params = {} if seen is None else {"seen": seen, "wait": 10}
        progress = client.get(f"/v1/sweeps/{sweep_id[0]}/progress", params=params).json()
        if progress["done"]:
            break
        seen = progress["version"]
    took = time.perf_counter() - began
    stop.set()
    thread.join()
    return took, reads, progress["progress"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1, help="sweeps, one after another")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--worker-arg", action="append", default=[], help="a worker flag (default: none)"
    )
    args = parser.parse_args()
    worker_args = [a for arg in args.worker_arg for a in arg.split("=", 1)]
    ref = reference(args.device, args.points)
    times: list[float] = []
    with running_service(args.device, worker_args=worker_args, database_url=args.database_url) as c:
        c.post("/v1/sweeps", json=body(4)).raise_for_status()  # the worker's children start
        time.sleep(2)
        for _ in range(args.runs):
            took, reads, counts = one_sweep(c, args.points)
            times.append(took)
            print(f"  sweep: {took:.2f} s, {reads} progress reads, {counts}")
    took = statistics.median(times)
    rate = args.points / took
    target_s = TARGET_S[args.device]
    flags = " ".join(worker_args) or "(default flags)"
    print(f"\n{args.points}-point sweep, shared isolation, default trace, worker {flags}")
    print(f"{'':<34} {'seconds':>9} {'points/s':>10}")
    print(f"{'service, progress read 10x/s':<34} {took:9.2f} {rate:10.0f}")
    print(f"{'the op in a loop, one process':<34} {args.points / ref:9.4f} {ref:10.0f}")
    verdict = "met" if took <= target_s else "BELOW target"
    line = f"target: <= {target_s:g} s"
    if args.device == "cuda":
        line += f" and >= {TARGET_RATE_GPU:g} points/s"
        verdict = "met" if took <= target_s and rate >= TARGET_RATE_GPU else "BELOW target"
    print(f"{line}: {verdict} ({rate / ref:.3f}x the loop)")


if __name__ == "__main__":
    main()
