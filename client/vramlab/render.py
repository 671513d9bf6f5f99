"""What the commands print: plain-text tables, byte counts for people, JSON for scripts,
and the status line and progress bar that go to stderr."""

import json
import sys
from collections.abc import Sequence
from typing import Any

from vramlab.units import human_bytes


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def size(n: Any) -> str:
    """A byte count for people; empty where there is none."""
    return human_bytes(n) if isinstance(n, int | float) else ""


def figure(key: str, value: Any) -> str:
    """A figure for people: seconds for ``time_s``, bytes for the others."""
    if key == "time_s":
        return f"{value:.3g} s" if value is not None else ""
    return size(value)


def cell(value: Any) -> str:
    """A grid value: a shape as ``64x64``."""
    return "x".join(map(str, value)) if isinstance(value, list) else str(value)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def status_line(text: str) -> None:
    sys.stderr.write("\r\033[K" + text)
    sys.stderr.flush()


def progress_bar(done: int, total: int, counts: dict[str, int], width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {parts}"
