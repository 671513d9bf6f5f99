"""``vramlab trace``: download an experiment's trace (json, ndjson, memory_viz, chrome)."""

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from vramlab.commands.common import client_of, reported


def cmd_trace(args: argparse.Namespace) -> int:
    to_file = args.output not in (None, "-")
    with client_of(args) as client, ExitStack() as stack:
        exp_id = client.resolve_id(args.id)
        out = stack.enter_context(Path(args.output).open("wb")) if to_file else sys.stdout.buffer
        client.trace(exp_id, out, args.format)
    if to_file:
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("trace", parents=[common], help="download an experiment's trace")
    p.add_argument("id")
    p.add_argument("--format", choices=["json", "ndjson", "memory_viz", "chrome"], default="ndjson")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.set_defaults(func=reported(cmd_trace))
