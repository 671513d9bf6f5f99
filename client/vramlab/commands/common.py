"""What every client command shares: its Client from ``--api``/``--token``, the one-line
report of a failure, and the flags several commands take."""

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import httpx

from vramlab.client import Client
from vramlab.errors import ClientError
from vramlab.names import Isolation

Command = Callable[[argparse.Namespace], int]


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.api, args.token)


def value(text: str) -> Any:
    """A flag's value as JSON, or as the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def reported(func: Command) -> Command:
    """The command, with its failures said in one line on stderr (exit 1)."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ClientError as exc:
            print(f"vramlab: {exc}", file=sys.stderr)
            return 1
        except httpx.TransportError as exc:
            print(f"vramlab: cannot reach {args.api}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            # Ctrl-C: end the line a status line left open and exit as shells expect.
            sys.stderr.write("\n")
            return 130

    return wrapped


def wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="wait until it has finished")
    p.add_argument(
        "--give-up",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with --wait: stop (exit 1, saying why) once no live worker has been able to "
        "run it for this long (default 30)",
    )
    p.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)


def isolation_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--isolation",
        choices=list(Isolation),
        help="clean (a process of its own, the default) or shared (a worker's long-lived "
        "process: much faster for many small experiments)",
    )
