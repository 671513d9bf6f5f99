"""Submit-to-succeeded latency of a tiny op: vramlab's clean-child path against a fresh
`python -c` per experiment, measured side by side in one run.

    python bench/latency.py [--device cpu|cuda] [--n 30]

Starts `vramlab serve` and `vramlab worker` on a temporary SQLite file, submits N tiny
experiments one after another and times each from POST to `succeeded`; then times N
fresh interpreters that import torch and run the same op. Prints median and p95 of each
and their ratio.
"""

import argparse
import statistics
import subprocess
import sys
import time

from service import run_to_end, running_service

SPEC = {
    "op": "add",
    "shape": [256, 256],
    "dtype": "float32",
    "warmup": 0,
    "repeat": 1,
    "trace": "events",
}
FRESH = (
    "import torch; d={dev!r}; a=torch.randn(256,256,device=d); b=torch.randn(256,256,device=d); "
    "c=a+b; torch.cuda.synchronize() if d.startswith('cuda') else None; print(c.sum().item())"
)


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def service_latencies(device: str, n: int) -> list[float]:
    out: list[float] = []
    with running_service(device) as client:
        for i in range(n + 1):  # the first pays for one-off imports in the child: not counted
            t0 = time.perf_counter()
            exp = run_to_end(client, {**SPEC, "device": device})
            if exp["status"] != "succeeded":
                raise RuntimeError(f"bench experiment {exp['status']}: {exp.get('error')}")
            if i:
                out.append(time.perf_counter() - t0)
    return out


def fresh_latencies(device: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", FRESH.format(dev=device)], check=True, capture_output=True
        )
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    service = service_latencies(args.device, args.n)
    fresh = fresh_latencies(args.device, args.n)
    sm, fm = statistics.median(service), statistics.median(fresh)
    print(f"\nsubmit-to-succeeded latency, op add 256x256 float32 on {args.device}, n={args.n}")
    print(f"{'path':<44} {'median s':>9} {'p95 s':>9}")
    print(f"{'vramlab (API + worker, forkserver child)':<44} {sm:9.3f} {p95(service):9.3f}")
    print(f"{'fresh python -c per experiment':<44} {fm:9.3f} {p95(fresh):9.3f}")
    print(f"ratio fresh / vramlab (median): {fm / sm:.2f}x")


if __name__ == "__main__":
    main()
