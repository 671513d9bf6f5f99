"""A chart as plain data: stacked bands, lines, shaded spans and a marked peak, in bytes
over x. The renderers (``html``, ``mpl``) draw it; nothing here knows how."""

import itertools
import unicodedata
from dataclasses import dataclass, field

from vramlab.units import human_bytes as human_bytes  # the one formatter, re-exported


@dataclass(frozen=True)
class Line:
    name: str
    xs: list[float]
    ys: list[float]
    dashed: bool = False
    step: bool = True  # memory holds its value until the next event
    markers: bool = False
    # Rings at the points and no line: a line that would lie exactly on another one (a
    # prediction that equals what was measured) stays visible around it.
    rings_only: bool = False


@dataclass(frozen=True)
class Band:
    """Memory held over time, stacked: between ``lows`` and ``highs``, each value holding
    until the next x. One allocation, or a group of small ones."""

    name: str  # the legend's entry: bands of one name share a colour
    xs: list[float]
    lows: list[float]
    highs: list[float]
    detail: str = ""  # hover text: size, name, step, stack
    grouped: bool = False


@dataclass(frozen=True)
class Span:
    """A shaded stretch of x: a phase or a step."""

    x0: float
    x1: float
    label: str
    detail: str = ""


@dataclass(frozen=True)
class Mark:
    """A vertical line: a phase boundary or an alignment point."""

    x: float
    label: str


@dataclass(frozen=True)
class Label:
    """A labelled point: the peak."""

    x: float
    y: float
    text: str


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str = "bytes"
    lines: list[Line] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    # Categories on x (a sweep's values as written): (position, text). None: numeric ticks.
    x_ticks: list[tuple[float, str]] | None = None
    # The x range to show; None: the data's.
    x_range: tuple[float, float] | None = None


MAX_TEXT = 200


def text(value: object, limit: int = MAX_TEXT) -> str:
    """Any text a chart shows, as plain printable text: no lone surrogates (they cannot be
    encoded), no control characters, at most ``limit`` characters. Renderers pass every
    string through this; what markup a renderer might read into it is its own to escape."""
    out = []
    for ch in str(value):
        if ch == "\n":
            out.append(ch)
        elif 0xD800 <= ord(ch) <= 0xDFFF or unicodedata.category(ch) in ("Cc", "Cs", "Co"):
            out.append("\ufffd")
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def stepped(xs: list[float], ys: list[float]) -> list[tuple[float, float]]:
    """The corners of a step function that holds each y until the next x."""
    out: list[tuple[float, float]] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i:
            out.append((x, ys[i - 1]))
        out.append((x, y))
    return out


@dataclass(frozen=True)
class Zoom:
    """Where a chart's memory changes: x from ``x0`` to ``x1``, leaving out a flat stretch
    from ``idle_from`` to ``idle_to`` in which no line changed value."""

    x0: float
    x1: float
    idle_from: float
    idle_to: float


def busy_range(chart: Chart, idle_share: float = 0.5) -> Zoom | None:
    """Where memory changes, when one flat stretch (no line changes value) takes more than
    ``idle_share`` of the chart's x range: the side of that stretch that holds the peak
    (the side with more changes where no peak is marked), with a little of the stretch
    kept for context. None where no stretch is that long."""
    changes = sorted(
        {
            x
            for line in chart.lines
            for i, x in enumerate(line.xs)
            if i and line.ys[i] != line.ys[i - 1]
        }
    )
    xs = [x for line in chart.lines for x in line.xs]
    if chart.x_range is not None:
        lo, hi = chart.x_range
    elif xs:
        lo, hi = min(xs), max(xs)
    else:
        return None
    if not changes or hi <= lo:
        return None
    edges = [lo, *changes, hi]
    width, start = max((b - a, a) for a, b in itertools.pairwise(edges))
    end = start + width
    if width <= idle_share * (hi - lo):
        return None
    before = sum(1 for x in changes if x <= start)
    after = len(changes) - before
    peak = chart.labels[0].x if chart.labels else None
    later = peak >= end if peak is not None else after >= before
    if later and hi > end:
        return Zoom(end - 0.03 * (hi - end), hi, start, end)
    if not later and start > lo:
        return Zoom(lo, start + 0.03 * (start - lo), start, end)
    return None
