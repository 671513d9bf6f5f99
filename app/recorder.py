"""``vramlab record [--api URL] [--token T] [--name N] [--max-entries N] [--stacks
python|all] -- python train.py ARGS``: run a program of yours with PyTorch's allocation
history on, upload the snapshot it leaves, print its page.

Your program runs here, on your machine, as you would run it; the service never runs
it. The recording is switched on by a ``sitecustomize`` (``app/recorder_boot``) put first
on the program's PYTHONPATH; it dumps at exit and at the first out-of-memory error. The
upload is gzipped as it streams. The exit status is the program's.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from vramlab.contract import Figure

BOOT = Path(__file__).resolve().parent / "recorder_boot"
_BLOCK = 1 << 20


def _gzipped(path: Path) -> Iterator[bytes]:
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            if out := comp.compress(block):
                yield out
    yield comp.flush()


def upload(path: Path, api: str, token: str | None, name: str, tags: list[str]) -> dict[str, Any]:
    headers = {"Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(base_url=api, headers=headers, timeout=httpx.Timeout(600, connect=10)) as c:
        response = c.post(
            "/v1/snapshots", params={"name": name, "tag": tags}, content=_gzipped(path)
        )
    if not response.is_success:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise RuntimeError(f"{response.status_code}: {message}")
    data: dict[str, Any] = response.json()
    return data


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("vramlab record: give the program after --, e.g. -- python train.py", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vramlab-record-") as folder:
        out = Path(folder) / "snapshot.pickle"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT), env.get("PYTHONPATH", "")) if p)
        env["VRAMLAB_RECORD_OUT"] = str(out)
        env["VRAMLAB_RECORD_STACKS"] = args.stacks
        env.pop("VRAMLAB_RECORD_OWNER", None)
        if args.max_entries is not None:
            env["VRAMLAB_RECORD_MAX_ENTRIES"] = str(args.max_entries)
        try:
            code = subprocess.call(command, env=env)
        except FileNotFoundError:
            print(f"vramlab record: no such program: {command[0]}", file=sys.stderr)
            return 127
        oom = out.with_name(out.name + ".oom")
        found = out if out.exists() else oom if oom.exists() else None
        if found is None:
            print("vramlab record: the program left no snapshot (no CUDA?)", file=sys.stderr)
            return code or 1
        if code != 0:
            said = f"was stopped by signal {-code}" if code < 0 else f"exited with code {code}"
            print(
                f"vramlab record: the program {said}: the snapshot holds what it recorded "
                f"until then (tagged failed)",
                file=sys.stderr,
            )
        name = args.name or " ".join(Path(c).name for c in command[:3])[:200]
        tags = list(args.tag or [])
        if code != 0:
            tags.append("failed")
        if found == oom or oom.exists():
            tags.append("oom")
        if args.keep:
            shutil.copyfile(found, args.keep)
        size = found.stat().st_size
        print(f"vramlab record: uploading {size / 2**20:.1f} MiB to {args.api}", file=sys.stderr)
        try:
            snap = upload(found, args.api, args.token, name, tags)
        except (RuntimeError, httpx.HTTPError) as exc:
            print(f"vramlab record: upload failed: {exc}", file=sys.stderr)
            if args.keep:
                print(f"vramlab record: the snapshot is kept at {args.keep}", file=sys.stderr)
            return code or 1
    peak = snap["memory"].get(Figure.ALLOCATED_PEAK) or 0
    print(
        f"snapshot {snap['id']}: peak {peak / 2**20:.1f} MiB allocated, {snap['entries']} entries"
    )
    print(f"{args.api.rstrip('/')}/ui/snapshots/{snap['id']}")
    return code


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
