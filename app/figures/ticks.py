"""Axis ticks a person reads at a glance: bytes on round binary units (0, 2 MiB, 4 MiB),
times on round decimal ones (0, 5, 10 ms), both renderers alike."""

import math

_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def byte_label(n: float) -> str:
    """A tick's bytes in the largest unit it reaches: ``1.5 MiB``, ``512 KiB``, ``0``."""
    if n == 0:
        return "0"
    for name, size in _UNITS:
        if abs(n) >= size:
            return f"{_trim(n / size)} {name}"
    return f"{_trim(n)} B"


def byte_ticks(top: float, most: int = 6) -> list[float]:
    """0 to at least ``top`` in steps of a power of two bytes, at most ``most`` + 1 ticks."""
    top = max(float(top), 1.0)
    step = 1.0
    while top / step > most:
        step *= 2
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def time_unit(span_ms: float) -> tuple[str, float]:
    """The unit to show a stretch of ``span_ms`` milliseconds in, and its size in ms."""
    if span_ms < 2:
        return "µs", 1e-3
    if span_ms < 5000:
        return "ms", 1.0
    return "s", 1000.0


def nice_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Round ticks (1, 2 or 5 times a power of ten) covering ``lo`` to ``hi``."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def number_label(v: float) -> str:
    return _trim(v)


def _trim(v: float) -> str:
    if v == int(v):
        return str(int(v))
    return f"{v:.3f}".rstrip("0").rstrip(".")
