"""Bytes for people: the one formatter the pages, plots, CLI, errors and exports share."""


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``16.0 GiB``: binary units, one decimal; negatives too."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable: TiB ends the loop")
