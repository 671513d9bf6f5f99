"""Starting the runner's children: the forkserver's preloads, what a child runs first,
and retries while a dying forkserver is replaced. Torch-free: imports happen in the
child."""

from __future__ import annotations

import json
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    SpawnContext,
    SpawnProcess,
)
from typing import Any

from workers import allocator
from workers.children import Child

PRELOAD = ["torch", "workers.child"]
START_ATTEMPTS = 4


def child_entry(kind: str, conn: Connection, args: tuple[Any, ...]) -> None:
    """Runs in the child. Imports happen here so this module stays torch-free."""
    try:
        if kind == "experiment":
            # Before torch loads (in a fresh interpreter), so that even the backend applies.
            allocator.set_env(allocator.conf_string(args[0].get("allocator") or {}))
            from workers.child import main

            main(args[0], conn, args[1], args[2], None, args[3])
        elif kind == "spare":  # a warm spare (a model's: args[1]), or a new shared process
            from workers.child import serve

            serve(args[0], conn, *args[1:])
        elif kind == "probe":
            from workers.probe import capabilities

            conn.send_bytes(json.dumps({"result": capabilities()}).encode())
        else:  # "ping": proves the forkserver is up with its modules loaded
            conn.send_bytes(b"{}")
    finally:
        conn.close()


def preload() -> list[str]:
    """Torch and the child's modules, plus vramlab's modules that this process imported.

    Each child re-runs the parent's main module before it starts (the stdlib's main
    fix-up: ``python -m app.cli`` or the ``vramlab`` script imports app.cli, pydantic and
    settings, half a second on a busy host); with those imported once in the forkserver,
    the re-run finds them in sys.modules and costs about a millisecond.
    """
    ours = sorted(m for m in list(sys.modules) if m.partition(".")[0] in ("app", "workers"))
    return [*PRELOAD, *(m for m in ours if m not in PRELOAD)]


def spawn(ctx: ForkServerContext | SpawnContext, kind: str, args: tuple[Any, ...]) -> Child:
    """Start a child of ``kind`` with its end of a new pipe; return it with ours."""
    # A spare also reads its spec from the pipe; other children only write to it.
    ours, theirs = ctx.Pipe(duplex=kind == "spare")
    try:
        proc = start_child(ctx, kind, theirs, args)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()  # the child holds the only other end now: EOF means it is gone
    return Child(proc, ours)


def start_child(
    ctx: ForkServerContext | SpawnContext,
    kind: str,
    sender: Connection,
    args: tuple[Any, ...],
) -> ForkServerProcess | SpawnProcess:
    last: BaseException | None = None
    for attempt in range(START_ATTEMPTS):
        proc = ctx.Process(
            target=child_entry, args=(kind, sender, args), name=f"vramlab-{kind}", daemon=True
        )
        try:
            proc.start()
            return proc
        except (EOFError, OSError) as exc:
            # The forkserver died or is dying. The stdlib starts a new one once the old
            # one has exited and can be reaped: give it a moment, then try again.
            last = exc
            time.sleep(0.2 * (attempt + 1))
    raise RuntimeError("could not start a child: the forkserver keeps failing") from last
