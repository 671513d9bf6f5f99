"""What making a CUDA context costs a fresh process, step by step, and what changes it.

    python bench/context_cost.py [--n 12]

A clean experiment needs a process with its own CUDA context, so back-to-back clean
experiments run at the rate the driver makes contexts (bench/context_rate.py). This
times, in processes forked from a parent that has imported torch (as the worker's
forkserver has), each step of a first allocation through the driver API directly
(cuInit, the primary context, a first cuMemAlloc) and through torch, one process after
another, with the process exiting after it or held until all are made (is a context's
teardown in the way of the next one's making?), and with environment variables that
change what a context sets up (CUDA_DEVICE_MAX_CONNECTIONS: how many hardware queues it opens).
Prints a table of medians in milliseconds.
"""

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def _driver_steps(q: "mp.Queue[dict[str, float]]", hold: Any, env: dict[str, str]) -> None:
    os.environ.update(env)  # read by the driver at cuInit
    cuda = ctypes.CDLL("libcuda.so.1")
    times: dict[str, float] = {}
    t = time.perf_counter()
    assert cuda.cuInit(0) == 0
    times["cuInit"] = time.perf_counter() - t
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    t = time.perf_counter()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    times["context"] = time.perf_counter() - t
    ptr = ctypes.c_uint64()
    t = time.perf_counter()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 20)) == 0
    times["first alloc"] = time.perf_counter() - t
    q.put(times)
    if hold is not None:
        hold.wait(120)


def _torch_start(q: "mp.Queue[dict[str, float]]", hold: Any, env: dict[str, str]) -> None:
    os.environ.update(env)  # read by the driver at cuInit
    import torch

    t = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    q.put({"torch start": time.perf_counter() - t})
    if hold is not None:
        hold.wait(120)


def _series(
    ctx: Any, target: Callable[..., None], n: int, hold: bool, env: dict[str, str]
) -> tuple[dict[str, float], float]:
    q = ctx.Queue()
    release = ctx.Event() if hold else None
    procs = []
    rows = []
    began = time.perf_counter()
    try:
        for _ in range(n):
            p = ctx.Process(target=target, args=(q, release, env))
            p.start()
            rows.append(q.get(timeout=120))
            if hold:
                procs.append(p)
            else:
                p.join()
        wall = time.perf_counter() - began
    finally:
        if release is not None:
            release.set()
        for p in procs:
            p.join()
    keys = list(rows[0])
    return {k: statistics.median(r[k] for r in rows) for k in keys}, n / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=12)
    args = parser.parse_args()
    import torch  # noqa: F401  (the forkserver's parent has it loaded)

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    one = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    two = {"CUDA_DEVICE_MAX_CONNECTIONS": "2"}
    cases = [
        ("driver, exit after", _driver_steps, False, {}),
        ("driver, held", _driver_steps, True, {}),
        ("driver, MAX_CONNECTIONS=1", _driver_steps, False, one),
        ("driver, held, MAX_CONNECTIONS=1", _driver_steps, True, one),
        ("driver, held, MAX_CONNECTIONS=2", _driver_steps, True, two),
        ("torch, exit after", _torch_start, False, {}),
        ("torch, held", _torch_start, True, {}),
        ("torch, MAX_CONNECTIONS=1", _torch_start, False, one),
        ("torch, held, MAX_CONNECTIONS=1", _torch_start, True, one),
    ]
    print(f"{'case':<32} {'per second':>10}  medians (ms)")
    for label, target, hold, env in cases:
        medians, rate = _series(ctx, target, args.n, hold, env)
        steps = "  ".join(f"{k} {v * 1000:.1f}" for k, v in medians.items())
        print(f"{label:<32} {rate:10.1f}  {steps}", flush=True)


if __name__ == "__main__":
    main()
