"""Why wrk run by hand and bench/api.py disagree about submits: one change at a time.

    python bench/submit_ways.py [--engines sqlite,postgres] [--seconds 5] [--connections 1,16,64]

bench/api.py reports vramlab's submits at 0.8 to 1.0 times the bare app (bench/bare_app.py);
wrk run by hand against `vramlab serve` (one thread, keep-alive, a small `add` body) gave
0.59 to 0.68. This starts both servers as each way does and measures them side by side,
walking from bench/api.py's way to the by-hand way one change at a time, so that each
change's share of the gap is its own row:

1. ``bench/api.py``: `vramlab serve --log-level warning`, the queue cap raised, wrk with
   ``-t min(c, 2)`` after two one-second warm-ups of each server;
2. ``wrk -t1``: wrk with one thread at every connection count;
3. ``no warm-up``: the first seconds of each server measured too;
4. ``serve's defaults``: `vramlab serve` as a user starts it: its default log level (an
   access line for each submit) and the default queue cap (10,000 queued a submitter:
   past it, 429);
5. ``by hand``: all of these, and vramlab measured first, then the bare app (not
   interleaved), as a person does by hand.

Each row's servers are fresh (new databases), and the bare app is measured the same way
beside vramlab in that row. Printed per engine and connection count: submits a second,
the bare app's, their ratio, non-2xx answers, and each server's CPU ms a request.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.config import normalise_database_url  # noqa: E402
from bench.api import (  # noqa: E402
    BARE_BODY,
    SPEC,
    VRAMLAB_SERVE,
    database,
    free_port,
    process,
    python_path,
    wrk,
)


@dataclass(frozen=True)
class Way:
    name: str
    one_thread: bool = False
    warm_up: bool = True
    defaults: bool = False  # serve's log level and queue cap
    vramlab_first: bool = False  # not interleaved: vramlab's rounds, then the bare app's


WAYS = (
    Way("bench/api.py"),
    Way("wrk -t1", one_thread=True),
    Way("no warm-up", one_thread=True, warm_up=False),
    Way("serve's defaults", one_thread=True, warm_up=False, defaults=True),
    Way("by hand", one_thread=True, warm_up=False, defaults=True, vramlab_first=True),
)


def measure(
    way: Way, engine: str, connections: tuple[int, ...], seconds: int, tmp: Path
) -> dict[int, dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    with ExitStack() as stack:
        url = stack.enter_context(database(engine, tmp, f"ways{uuid.uuid4().hex[:6]}"))
        env = {
            **os.environ,
            "VRAMLAB_DATABASE_URL": url,
            "BARE_DATABASE_URL": normalise_database_url(url).replace(".db", "-bare.db"),
            **python_path(ROOT),
        }
        if not way.defaults:
            env["VRAMLAB_MAX_QUEUED_PER_TOKEN"] = str(10**9)
        log = tmp / f"{engine}.log"
        port, bport = free_port(), free_port()
        level = [] if way.defaults else ["--log-level", "warning"]
        vpid = stack.enter_context(
            process(
                [*VRAMLAB_SERVE, "--port", str(port), *level],
                env,
                log,
                f"http://127.0.0.1:{port}/readyz",
                cwd=ROOT,
            )
        )
        bpid = stack.enter_context(
            process(
                [sys.executable, str(ROOT / "bench" / "bare_app.py"), "--port", str(bport)],
                env,
                log,
                f"http://127.0.0.1:{bport}/docs",
            )
        )
        targets = {
            "vramlab": (f"http://127.0.0.1:{port}/v1/experiments", SPEC, vpid),
            "bare": (f"http://127.0.0.1:{bport}/items", BARE_BODY, bpid),
        }
        threads = 1 if way.one_thread else None

        def run(name: str, c: int) -> dict[str, Any]:
            target, body, pid = targets[name]
            return wrk(target, c, seconds, tmp, body, pid, threads=threads)

        if way.vramlab_first:
            for name in targets:
                for c in connections:
                    out.setdefault(c, {})[name] = run(name, c)
            return out
        for c in connections:
            if way.warm_up:
                for _ in range(2):
                    for target, body, _pid in targets.values():
                        wrk(target, c, 1, tmp, body, threads=threads)
            out[c] = {name: run(name, c) for name in targets}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgres")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument(
        "--ways", default=None, help="comma-separated names of the ways to run (default: all)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="each way this many times")
    args = parser.parse_args()
    chosen = [w for w in WAYS if args.ways is None or w.name in args.ways.split(",")]
    if shutil.which("wrk") is None:
        sys.exit("bench/submit_ways.py needs wrk (apt-get install wrk)")
    connections = tuple(int(c) for c in args.connections.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="vramlab-submit-ways-"))
    try:
        for engine in args.engines.split(","):
            print(f"\n== {engine} ==")
            print(
                f"{'way':<18} {'conns':>5} {'vramlab/s':>10} {'bare/s':>8} {'ratio':>6} "
                f"{'non-2xx':>8}  CPU ms a request (vramlab / bare)",
                flush=True,
            )
            for way in [w for _ in range(args.repeat) for w in chosen]:
                for c, got in measure(way, engine, connections, args.seconds, tmp).items():
                    v, b = got["vramlab"], got["bare"]
                    cpu = (
                        f"{v['cpu_ms']:.2f} / {b['cpu_ms']:.2f}"
                        if v["cpu_ms"] is not None and b["cpu_ms"] is not None
                        else ""
                    )
                    print(
                        f"{way.name:<18} {c:>5} {v['rps']:>10.0f} {b['rps']:>8.0f} "
                        f"{v['rps'] / b['rps']:>6.2f} {v['non2xx']:>8}  {cpu}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
