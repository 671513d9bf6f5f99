"""Bytes for people: the one formatter the pages, plots, CLI, errors and exports share,
and the one parser of the sizes people write (flags, forms, environment variables)."""

import re

# GB = 10^9 bytes, GiB = 2^30: both as people write them.
UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")
SIZE_HELP = "write e.g. 24GiB, 80GB, 512MiB or a number of bytes"


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``16.0 GiB``: binary units, one decimal; negatives too."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: TiB ends the loop")


def parse_bytes(text: str | int) -> int:
    """``24GiB``, ``80GB``, ``1.5 GiB``, ``512MiB`` or a number of bytes; ValueError
    (saying what is allowed) for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"{text!r} is not a size: {SIZE_HELP}")
    return int(float(match.group(1)) * UNITS[unit])
