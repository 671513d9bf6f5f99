"""``vramlab presets``: the named experiments that ``vramlab run`` runs."""

import argparse
import shutil
import sys
import textwrap
from typing import Any

from vramlab.commands.common import client_of, reported
from vramlab.render import print_json, table


def cmd_presets(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        listing = client.presets()
    if args.json:
        print_json(listing)
        return 0
    names = max([len("preset"), *(len(p["name"]) for p in listing)])
    # The question wraps at word boundaries to what the terminal has left, never cut.
    room = max(30, shutil.get_terminal_size((120, 24)).columns - names - len("device") - 5)
    rows: list[tuple[str, str, str]] = []
    for p in listing:
        lines = textwrap.wrap(p["question"], room, break_on_hyphens=False) or [""]
        rows.append((p["name"], _device(p), lines[0]))
        rows += [("", "", more) for more in lines[1:]]
    print(table(["preset", "device", "question"], rows))
    if any(p.get("gpu_question") for p in listing):
        print(
            "\n* a question about the GPU: on the CPU it runs, and says that it does not answer it",
            file=sys.stderr,
        )
    print("\nrun one: vramlab run PRESET [--device cpu|cuda] [--wait]", file=sys.stderr)
    return 0


def _device(preset: dict[str, Any]) -> str:
    if preset["needs_cuda"]:
        return "cuda"
    return "cuda*" if preset.get("gpu_question") else "any"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("presets", parents=[common], help="the named experiments to run")
    p.set_defaults(func=reported(cmd_presets))
