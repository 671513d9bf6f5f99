"""The ``vramlab`` client commands: submit, show, ls, cancel, trace, sweep, compare,
presets, run, fit, fits, fit-show, fit-cancel, plan, gpus and record.

They speak the HTTP API (through :class:`vramlab.Client`), so they work against a
remote service: the server from ``--api`` or ``VRAMLAB_API_URL``, a token from
``--token`` or ``VRAMLAB_TOKEN``. Tables for people; ``--json`` for scripts. Status lines
and progress bars go to stderr. The server's own ``vramlab`` (serve, up, worker, migrate,
token) adds these commands to its own.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from vramlab.commands import experiments, fits, plans, presets, record, sweeps, traces


def common_parser() -> argparse.ArgumentParser:
    """The flags every client command takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api",
        default=os.environ.get("VRAMLAB_API_URL", "http://127.0.0.1:8000"),
        help="the API's URL (default: VRAMLAB_API_URL or http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--token", default=os.environ.get("VRAMLAB_TOKEN"), help="API token (VRAMLAB_TOKEN)"
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def register(sub: Any) -> None:
    """Add the client commands to ``vramlab``'s subparsers."""
    common = common_parser()
    experiments.register_submit(sub, common)
    presets.register(sub, common)
    experiments.register(sub, common)  # run, show, cancel, ls
    traces.register(sub, common)
    sweeps.register(sub, common)  # sweep, compare
    fits.register(sub, common)
    plans.register(sub, common)  # plan, gpus
    record.register(sub, common)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vramlab", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # One line per HTTP request would bury the status lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
