"""Whether a submit costs more as its submitter's queue grows (it should not).

    python bench/queue_growth.py [--blocks 8] [--block 500] [--engine postgres]
                                 [--baseline PATH]

Starts the real ``vramlab serve`` on a fresh database and submits ``--blocks`` blocks of
``--block`` experiments one after another from one client (no worker: the queue only
grows), printing the milliseconds per submit of each block beside the queue's length.
The quota check counts the submitter's queued experiments; once that count was a scan
of them, and ms/submit grew with the queue. ``--baseline PATH`` also measures
``vramlab serve`` from another checkout (the code before a change), block by block in
turns with this one. The cap is left at its default (10,000).
"""

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api import SPEC, VRAMLAB_SERVE, database, free_port, process, python_path  # noqa: E402


def block(client: httpx.Client, n: int) -> float:
    """Milliseconds per submit over ``n`` sequential submits."""
    start = time.perf_counter()
    for _ in range(n):
        client.post("/v1/experiments", json=SPEC).raise_for_status()
    return (time.perf_counter() - start) * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--engine", default="postgres", choices=("postgres", "sqlite"))
    parser.add_argument("--baseline", type=Path, help="another vramlab checkout, measured too")
    args = parser.parse_args()
    roots = {"vramlab": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        clients: dict[str, httpx.Client] = {}
        for name, root in roots.items():
            url = stack.enter_context(database(args.engine, Path(tmp), name))
            port = free_port()
            env = {**os.environ, "VRAMLAB_DATABASE_URL": url, **python_path(root)}
            serve = [*VRAMLAB_SERVE, "--port", str(port), "--log-level", "warning"]
            ready = f"http://127.0.0.1:{port}/readyz"
            stack.enter_context(process(serve, env, Path(tmp) / f"{name}.log", ready, cwd=root))
            clients[name] = stack.enter_context(
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
            )
        for c in clients.values():
            block(c, 20)  # warm up: connections, caches (they stay queued)
        print(f"{args.engine}: ms/submit per block of {args.block} sequential submits")
        print("queued before  " + "  ".join(f"{name:>9}" for name in clients))
        for i in range(args.blocks):
            ms = {name: block(c, args.block) for name, c in clients.items()}
            queued = 20 + i * args.block
            print(f"{queued:>13,}  " + "  ".join(f"{ms[name]:>9.2f}" for name in clients))


if __name__ == "__main__":
    main()
