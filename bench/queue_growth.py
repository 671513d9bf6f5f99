"""Whether a submit costs more as its submitter's queue grows (it should not).

    python bench/queue_growth.py [--blocks 8] [--block 500] [--engine postgres]
                                 [--baseline PATH]

Starts the real ``vramlab serve`` on a fresh database and submits ``--blocks`` blocks of
``--block`` experiments one after another from one client (no worker: the queue only
grows), printing the milliseconds per submit of each block beside the queue's length,
and the CPU milliseconds per submit of the server and of its database's PostgreSQL
backends (which move far less than wall time with the load others put on the machine).
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
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.config import normalise_database_url  # noqa: E402
from bench.api import (  # noqa: E402
    SPEC,
    VRAMLAB_SERVE,
    cpu_seconds,
    database,
    free_port,
    process,
    python_path,
)


class Server:
    """A running ``vramlab serve``: its client, and the CPU it and its database used."""

    def __init__(self, client: httpx.Client, pid: int, url: str) -> None:
        self.client, self.pid = client, pid
        self.admin = create_engine(normalise_database_url(url)) if "postgres" in url else None

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: the server's, and its database's live backends' (0 on SQLite)."""
        backends = 0.0
        if self.admin is not None:
            with self.admin.connect() as c:
                pids = c.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalars()
                backends = sum(cpu_seconds(p) or 0.0 for p in pids)
        return cpu_seconds(self.pid) or 0.0, backends


def block(server: Server, n: int) -> tuple[float, float, float]:
    """Milliseconds per submit over ``n`` sequential submits: wall, server CPU, database
    CPU."""
    cpu0, db0 = server.cpu()
    start = time.perf_counter()
    for _ in range(n):
        server.client.post("/v1/experiments", json=SPEC).raise_for_status()
    wall = time.perf_counter() - start
    cpu1, db1 = server.cpu()
    return wall * 1000 / n, (cpu1 - cpu0) * 1000 / n, (db1 - db0) * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--engine", default="postgres", choices=("postgres", "sqlite"))
    parser.add_argument("--baseline", type=Path, help="another vramlab checkout, measured too")
    args = parser.parse_args()
    roots = {"vramlab": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        servers: dict[str, Server] = {}
        for name, root in roots.items():
            url = stack.enter_context(database(args.engine, Path(tmp), name))
            port = free_port()
            env = {**os.environ, "VRAMLAB_DATABASE_URL": url, **python_path(root)}
            serve = [*VRAMLAB_SERVE, "--port", str(port), "--log-level", "warning"]
            ready = f"http://127.0.0.1:{port}/readyz"
            pid = stack.enter_context(
                process(serve, env, Path(tmp) / f"{name}.log", ready, cwd=root)
            )
            client = stack.enter_context(
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
            )
            servers[name] = Server(client, pid, url)
        for server in servers.values():
            block(server, 20)  # warm up: connections, caches (they stay queued)
        print(f"{args.engine}: ms per submit, blocks of {args.block} sequential submits")
        print(
            "queued before  "
            + "  ".join(f"{n + ' wall / server CPU / db CPU':>36}" for n in servers)
        )
        for i in range(args.blocks):
            ms = {name: block(server, args.block) for name, server in servers.items()}
            queued = 20 + i * args.block
            print(
                f"{queued:>13,}  "
                + "  ".join(f"{'{:.2f} / {:.2f} / {:.2f}'.format(*ms[n]):>36}" for n in servers)
            )
        for server in servers.values():
            if server.admin is not None:
                server.admin.dispose()


if __name__ == "__main__":
    main()
