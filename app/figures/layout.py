"""What both renderers decide alike: the axes' ranges and ticks, the colours of bands and
lines, which labels fit, and the legend's entries. Sizes are in CSS pixels of an 11 px
sans-serif font (matplotlib's figure is laid out to the same width)."""

import math
from dataclasses import dataclass

from app.figures import ticks
from app.figures.chart import Chart, text

WIDTH = 900
PLOT_HEIGHT = 330
CHAR_PX = 6.4  # a generous average width of one character at 11 px
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#86bcb6",
)
GROUP_COLOUR = "#bab0ac"
LINE_COLOURS = ("#1f3b57", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
MAX_LEGEND = 12


@dataclass(frozen=True)
class Axes:
    x0: float
    x1: float
    y_top: float
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]


def axes(chart: Chart, plot_width: float) -> Axes:
    xs = [x for line in chart.lines for x in line.xs]
    xs += [x for band in chart.bands for x in band.xs]
    xs += [s.x0 for s in chart.spans] + [s.x1 for s in chart.spans]
    xs += [m.x for m in chart.marks] + [lb.x for lb in chart.labels]
    ys = [y for line in chart.lines for y in line.ys]
    ys += [y for band in chart.bands for y in band.highs] + [lb.y for lb in chart.labels]
    if chart.x_range is not None:
        x0, x1 = chart.x_range
    elif chart.x_ticks:
        positions = [p for p, _ in chart.x_ticks]
        x0, x1 = min(positions) - 0.5, max(positions) + 0.5
    else:
        x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x1 <= x0:
        x1 = x0 + 1
    y_ticks = ticks.byte_ticks(max(ys, default=0) * 1.12)
    if chart.x_ticks is not None:
        x_ticks = thin_categories(chart.x_ticks, plot_width)
    else:
        x_ticks = [(v, ticks.number_label(v)) for v in ticks.nice_ticks(x0, x1)]
        x_ticks = [(v, s) for v, s in x_ticks if x0 - 1e-9 <= v <= x1 + 1e-9]
    return Axes(x0, x1, y_ticks[-1], x_ticks, [(v, ticks.byte_label(v)) for v in y_ticks])


def thin_categories(cats: list[tuple[float, str]], plot_width: float) -> list[tuple[float, str]]:
    """Every k-th category, k the least that keeps labels from touching."""
    if not cats:
        return []
    spacing = plot_width / max(len(cats), 1)
    widest = max(len(s) for _, s in cats) * CHAR_PX + 8
    k = max(1, math.ceil(widest / spacing))
    return [(p, text(s, 40)) for i, (p, s) in enumerate(cats) if i % k == 0]


def fit(label: str, width_px: float) -> str | None:
    """``label`` cut to fit ``width_px`` (with an ellipsis), or None where too little of
    it would show to be read (the shape's title or hover text still has it whole)."""
    label = text(label)
    room = int(width_px // CHAR_PX)
    if len(label) <= room:
        return label
    if room >= 8:
        return label[: room - 1] + "…"
    number = label.split(" ", 1)[0]  # a scenario step's number, "07"
    return number if number.isdigit() and len(number) <= room else None


def band_colours(chart: Chart) -> dict[str, str]:
    """One colour per band name, in order of first appearance; the group is grey."""
    out: dict[str, str] = {}
    for band in chart.bands:
        if band.name not in out:
            out[band.name] = GROUP_COLOUR if band.grouped else PALETTE[len(out) % len(PALETTE)]
    return out


def line_colour(chart: Chart, n: int) -> str:
    """Lines over bands are dark (allocated solid, reserved dashed), apart from the bands'
    colours; lines alone (an overlay, a sweep) each get their own colour."""
    if chart.bands:
        return ("#1f3b57", "#444444")[min(n, 1)]
    return LINE_COLOURS[n % len(LINE_COLOURS)]


def legend(chart: Chart) -> list[tuple[str, str, str]]:
    """(kind, colour, text): bands by name, then lines; at most ``MAX_LEGEND``."""
    entries = [("band", c, text(n, 60)) for n, c in band_colours(chart).items()]
    entries += [
        (
            "ring" if line.rings_only else "dashed" if line.dashed else "line",
            line_colour(chart, i),
            text(line.name, 80),
        )
        for i, line in enumerate(chart.lines)
    ]
    if len(entries) > MAX_LEGEND:
        more = len(entries) - MAX_LEGEND + 1
        entries = [*entries[: MAX_LEGEND - 1], ("none", "#fff", f"… and {more} more")]
    return entries
