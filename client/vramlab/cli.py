"""The ``vramlab`` client commands: submit, show, ls, cancel, trace, sweep, compare,
presets, run, fit, fits, fit-show, fit-cancel, plan, gpus and record.

They speak the HTTP API (through :class:`vramlab.Client`), so they work against a
remote service: the server from ``--api`` or ``VRAMLAB_API_URL``, a token from
``--token`` or ``VRAMLAB_TOKEN``. Tables for people; ``--json`` for scripts. Status lines
and progress bars go to stderr.

The other distributions add their commands to this one ``vramlab`` through the entry
point group ``vramlab.commands``: each entry point names a function that takes the
subparsers (``register(sub)``). The worker's (``vramlab-worker``) adds ``worker``; the
server's (``vramlab``) adds ``serve``, ``up``, ``migrate``, ``token`` and ``predictor``.
Installed together, they make one command; no distribution but this one owns the script.
"""

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
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


DESCRIPTION = (
    "Run GPU memory experiments with PyTorch and read what was measured: the commands of "
    "each vramlab distribution installed here (the client's; the worker's and the server's "
    "where they are installed too)."
)
# The entry point group through which the worker and the server add their commands.
COMMANDS_GROUP = "vramlab.commands"


def command_sets(checkout: Mapping[str, str] | None = None) -> list[EntryPoint]:
    """The installed distributions' sets of commands, by name (the server's, the worker's):
    the order in which ``vramlab --help`` lists their commands, before the client's.
    ``checkout`` names sets to take from the import path where no installed distribution
    declares them (``python -m app.cli`` in a checkout that is on PYTHONPATH only)."""
    found = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
    for name, value in (checkout or {}).items():
        found.setdefault(name, EntryPoint(name, value, COMMANDS_GROUP))
    return [found[name] for name in sorted(found)]


def build_parser(checkout: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vramlab", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for found in command_sets(checkout):
        try:
            add = found.load()
        except ImportError as exc:
            if found.dist is not None:  # a distribution half removed: the rest still works
                print(
                    f"vramlab: the commands of {found.dist.name} did not load: {exc}",
                    file=sys.stderr,
                )
            continue  # one from the checkout that is not on the path: not there
        add(sub)
    register(sub)
    return parser


def main(argv: Sequence[str] | None = None, checkout: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # One line per HTTP request would bury the status lines and the worker's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser(checkout).parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
