"""How fast the driver makes CUDA contexts: one process after another, and K at once.

    python bench/context_rate.py [--k 1,2,4,8] [--n 8]

A clean experiment needs a fresh process with its own CUDA context, so a worker's rate
of clean experiments is bound by how many contexts the driver makes a second. Each
process here is forked from a parent that has imported torch (as the worker's forkserver
has) and does what a warm spare does before its experiment: start CUDA and make a first
allocation. For each K, N processes are started K at a time; prints contexts a second
and each one's start-up time (p50).
"""

import argparse
import multiprocessing as mp
import statistics
import time


def _start(q: "mp.Queue[float]") -> None:
    import torch

    t0 = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    q.put(time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k", default="1,2,4,8")
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    import torch  # noqa: F401  (the forkserver's parent has it loaded)

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    print(f"{'at once':>7} {'contexts/s':>11} {'p50 start s':>12}")
    for k in (int(x) for x in args.k.split(",")):
        q: mp.Queue[float] = ctx.Queue()
        times: list[float] = []
        started = time.perf_counter()
        for first in range(0, args.n, k):
            procs = [ctx.Process(target=_start, args=(q,)) for _ in range(min(k, args.n - first))]
            for p in procs:
                p.start()
            times += [q.get(timeout=120) for _ in procs]
            for p in procs:
                p.join()
        wall = time.perf_counter() - started
        print(f"{k:7d} {args.n / wall:11.1f} {statistics.median(times):12.3f}", flush=True)


if __name__ == "__main__":
    main()
