"""``vramlab record [--api URL] [--token T] [--name N] [--max-entries N] [--stacks
python|all] -- python train.py ARGS``: run a program of yours with PyTorch's allocation
history on, upload the snapshot it leaves, print its page.

Your program runs here, on your machine, as you would run it; the service never runs
it. The recording is switched on by a ``sitecustomize`` (``vramlab/recorder_boot``) put
first on the program's PYTHONPATH; it dumps at exit and at the first out-of-memory error.
The upload is gzipped as it streams. The exit status is the program's (128 + N for one
killed by signal N, as a shell gives it).
"""

import argparse
import shutil
import sys
from typing import Any

import httpx

from vramlab import recorder
from vramlab.commands.common import client_of
from vramlab.errors import ClientError
from vramlab.names import Figure


def _say(text: str) -> None:
    print(f"vramlab record: {text}", file=sys.stderr)


def status(code: int) -> int:
    """The exit status a shell gives a program's: 128 + N for one killed by signal N."""
    return 128 - code if code < 0 else code


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _say("give the program after --, e.g. -- python train.py")
        return 2
    try:
        with recorder.recorded(command, args.stacks, args.max_entries) as done:
            if done.path is None:
                said = (
                    f"was killed by signal {-done.code} before it could dump"
                    if done.code < 0
                    else "left no snapshot (no CUDA?)"
                )
                _say(f"the program {said}; nothing uploaded")
                return status(done.code)  # the program's status, as the docs promise
            code = done.code
            if code != 0:
                said = f"was stopped by signal {-code}" if code < 0 else f"exited with code {code}"
                _say(
                    f"the program {said}: the snapshot holds what it recorded "
                    f"until then (marked partial, tagged failed)"
                )
            if args.keep:
                shutil.copyfile(done.path, args.keep)
            size = done.path.stat().st_size
            _say(f"uploading {size / 2**20:.1f} MiB to {args.api}")
            try:
                with client_of(args) as client:
                    snap = client.upload_snapshot(
                        done.path,
                        args.name or done.name,
                        [*(args.tag or []), *done.tags],
                        program_exit=code,
                    )
            except (ClientError, httpx.HTTPError) as exc:
                _say(f"upload failed: {exc}")
                if args.keep:
                    _say(f"the snapshot is kept at {args.keep}")
                return status(code) or 1
    except FileNotFoundError:
        _say(f"no such program: {command[0]}")
        return 127
    peak = snap["memory"].get(Figure.ALLOCATED_PEAK) or 0
    print(
        f"snapshot {snap['id']}: peak {peak / 2**20:.1f} MiB allocated, {snap['entries']} entries"
    )
    print(f"{args.api.rstrip('/')}/ui/snapshots/{snap['id']}")
    return status(code)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "record",
        parents=[common],
        help="run your program with PyTorch's allocation history on and upload its snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", help="the snapshot's name (default: the command)")
    p.add_argument("--tag", action="append", help="repeatable")
    p.add_argument(
        "--max-entries", type=int, default=None, help="PyTorch's ring buffer (default: no limit)"
    )
    p.add_argument(
        "--stacks",
        choices=["python", "all"],
        default="all",
        help="'all' adds C++ frames, which categories need to see backward (default)",
    )
    p.add_argument("--keep", help="also write the snapshot to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program and its args")
    p.set_defaults(func=run)
