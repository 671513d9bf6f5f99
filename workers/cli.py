"""The ``vramlab worker`` command: check what the worker needs, then run its loop.

It imports no web stack (FastAPI, SQLAlchemy, uvicorn) and no torch: a GPU host needs
the worker's distribution (``vramlab-worker``) and a URL, and torch loads in the
runner's processes only. That distribution adds this command to the client's ``vramlab``
through the ``vramlab.commands`` entry point group (``register``); ``python -m
workers.cli`` runs it alone (``vramlab up`` starts its local worker so).
"""

import argparse
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from vramlab.contract import MAX_CLAIM_BATCH
from workers.pacing import PACE_S

log = logging.getLogger("vramlab.worker")
# What a worker cannot run a single experiment without (the `worker` extra).
NEEDS = {"torch": "PyTorch", "psutil": "psutil (host memory figures)"}
EXIT_UNFIT = 3  # the host cannot run a worker as asked; it did not register
EXIT_REFUSED = 4  # the API refused the worker itself (a wrong token, a bad registration)


class Unfit(Exception):
    """This host cannot be the worker asked for; the message says why and what to do."""


def check_packages() -> None:
    missing = [what for name, what in NEEDS.items() if importlib.util.find_spec(name) is None]
    if missing:
        raise Unfit(
            f"missing {', '.join(missing)}: install the worker's packages "
            "(pip install vramlab-worker) in this Python environment"
        )


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``worker`` to ``vramlab`` (the ``vramlab.commands`` entry point)."""
    p = sub.add_parser("worker", help="run a worker that claims experiments from an API")
    p.add_argument("--api", default=os.environ.get("VRAMLAB_API_URL", "http://127.0.0.1:8000"))
    p.add_argument("--token", default=None, help="worker token (default: VRAMLAB_WORKER_TOKEN)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--name", default=None)
    p.add_argument("--max-experiments", type=int, default=None, help="exit after this many")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        choices=range(1, 65),
        metavar="N",
        help="experiments run at once on this host's device, any kind together (default: "
        "by device, 4 on a GPU and 2 on the CPU (1 on a 1-core host), where only "
        "shared-isolation experiments run together and any other runs alone)",
    )
    p.add_argument(
        "--spares",
        type=int,
        default=None,
        choices=range(1, 65),
        metavar="K",
        help="warm spare children kept ready per device, each with its CUDA context made "
        "(default: by device, 2 on a GPU and 1 on the CPU, or the concurrency given where "
        "it is more); where transformers is installed, one warm model child per device "
        "besides, ready from the start",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=16,
        choices=range(1, MAX_CLAIM_BATCH + 1),
        metavar="K",
        help="the most experiments one claim of each loop takes, reported together a few at "
        "a time: as many as the loop runs in about half a second (tiny shared-process "
        "experiments: many; long ones: one). 1: one claim and one report per experiment "
        "(default 16)",
    )
    p.add_argument(
        "--pace-ms",
        type=int,
        default=round(PACE_S * 1000),
        choices=range(0, 1001),
        metavar="MS",
        help="under a stream of short experiments, the least time between the loops' claims "
        "after one that emptied the queue, and between their reports, so that experiments "
        "arriving one by one are claimed and reported several at a time; a lone experiment "
        f"never waits for it. 0: every loop claims and reports on its own (default "
        f"{round(PACE_S * 1000)})",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="no warm spare or model children: fork each experiment's child when it is claimed",
    )
    p.add_argument(
        "--alive-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="keep this file's modification time at the moment by which the worker will have "
        'made progress again, for a liveness probe: `test "$(stat -c %%Y PATH)" -ge '
        '"$(date +%%s)"` fails only once the loop has stalled, never during a long '
        "experiment (default: none)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="log every HTTP call to the API (an idle worker's claims: one per long poll)",
    )
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.alive import START_S, Pulse
    from workers.client import ApiClient, Refused
    from workers.crew import install_signal_handlers, run_all
    from workers.loop import WorkerLoop
    from workers.pacing import ClaimTurns, ReportGroup
    from workers.quota import Quota
    from workers.runner import Runner

    logging.getLogger("httpx").setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        check_packages()
    except Unfit as exc:
        log.error("vramlab worker cannot start: %s", exc)
        return EXIT_UNFIT
    token = args.token or os.environ.get("VRAMLAB_WORKER_TOKEN")
    runner = Runner(
        device=args.device, warm=not args.cold, concurrency=args.concurrency, spares=args.spares
    )
    clients: list[ApiClient] = []
    loops: list[WorkerLoop] = []  # made once the host is probed (concurrency by device)
    signalled = install_signal_handlers(loops)
    pulse = Pulse(args.alive_file)
    try:
        # The runner's start and capabilities probe run before registering: a host without
        # what was asked for (a CUDA device) never takes work.
        pulse.due("start", START_S)
        try:
            runner.start()
            capabilities = runner.capabilities()
        except RuntimeError as exc:
            log.error("vramlab worker cannot start: %s", exc)
            return EXIT_UNFIT
        pulse.done("start")
        concurrency = runner.concurrency
        clients += [ApiClient(args.api, token=token) for _ in range(concurrency)]
        name = args.name or socket.gethostname()
        paced = args.pace_ms > 0 and args.batch > 1
        turns = ClaimTurns(args.pace_ms / 1000) if paced else None
        group = ReportGroup(args.pace_ms / 1000) if paced and concurrency > 1 else None
        # --max-experiments is the worker's, whatever its loops: they share it.
        quota = None if args.max_experiments is None else Quota(args.max_experiments)
        loops += [
            WorkerLoop(
                client,
                runner,
                name=name if concurrency == 1 else f"{name}/{i}",
                quota=quota,
                batch=args.batch,
                turns=turns,
                group=group,
                pulse=pulse,
            )
            for i, client in enumerate(clients)
        ]
        for loop in loops:
            loop.capabilities = capabilities
            if signalled.is_set():  # a signal during the start: stop before claiming
                loop.stopping.set()
        try:
            run_all(loops)
        except Refused as exc:
            log.error("vramlab worker: the API at %s refused this worker: %s", args.api, exc)
            return EXIT_REFUSED
    finally:
        runner.close()
        for client in clients:
            client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="vramlab-worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
