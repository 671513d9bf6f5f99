"""What every client command shares: its Client from ``--api``/``--token``, the one-line
report of a failure, and the flags several commands take."""

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

from vramlab.client import Client
from vramlab.errors import ApiError, ClientError
from vramlab.experiment_view import prediction_lines
from vramlab.names import Isolation
from vramlab.units import parse_bytes

Command = Callable[[argparse.Namespace], int]


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.api, args.token)


def value(text: str) -> Any:
    """A flag's value as JSON, or as the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def param_value(key: str, text: str) -> Any:
    """A ``KEY=VALUE`` param's value: a size for a ``*_bytes`` key (``24GiB``, ``80GB``),
    else as ``value`` reads it."""
    if key.endswith("_bytes"):
        try:
            return parse_bytes(text)
        except ValueError as exc:
            raise ClientError(f"{key}: {exc}") from None
    return value(text)


def reported(func: Command) -> Command:
    """The command, with its failures said in one line on stderr (exit 1)."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ApiError as exc:
            said = str(exc)
            if exc.status_code == 401:
                given = "the token given was refused" if args.token else "no token was given"
                said += f" ({given}: pass one with --token or set VRAMLAB_TOKEN)"
            print(f"vramlab: {said}", file=sys.stderr)
            if exc.prediction is not None:  # refused for its size: what holds the memory
                for line in prediction_lines(exc.prediction):
                    print(line, file=sys.stderr)
            return 1
        except ClientError as exc:
            print(f"vramlab: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            # The reader left (`vramlab ls | head`): stop quietly, as a shell's own tools
            # do; what is still buffered goes nowhere instead of raising again at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 141  # 128 + SIGPIPE, as a shell gives it
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
