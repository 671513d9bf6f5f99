"""Charts drawn by matplotlib (Agg: no display, no GUI toolkit) as SVG or PNG bytes.

Labels are text, never markup: every render runs with mathtext and TeX off, so a step
label such as ``$\\frac{$`` prints as written instead of failing to parse; every string
also passes through ``chart.text`` and legends take their labels explicitly (matplotlib
would hide an automatic one that starts with an underscore)."""

import io
import threading
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from app.figures import layout
from app.figures.chart import Chart, text

# matplotlib's font and text caches are shared; one render at a time keeps them sane
# under the API's thread pool.
_LOCK = threading.Lock()
FIG_W, FIG_H, DPI = 10.0, 5.6, 100
AXES_PX = layout.WIDTH - 110  # about the axes' width in a 1000 px wide figure


def render(chart: Chart, fmt: str) -> bytes:
    """``fmt`` is "svg" or "png"."""
    with (
        _LOCK,
        matplotlib.rc_context(
            {"text.parse_math": False, "text.usetex": False, "svg.hashsalt": "vramlab"}
        ),
    ):
        # A Figure made directly (not pyplot) is never registered globally: no leak.
        fig = Figure(figsize=(FIG_W, FIG_H), dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
        _draw(fig, ax, chart)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
        return buf.getvalue()


def _draw(fig: Figure, ax: Any, chart: Chart) -> None:
    axes = layout.axes(chart, AXES_PX)
    width = axes.x1 - axes.x0
    over_x = blended_transform_factory(ax.transData, ax.transAxes)
    for i, span in enumerate(chart.spans):
        ax.axvspan(span.x0, span.x1, color="#eef2f7" if i % 2 == 0 else "#f8f8f8", zorder=0, lw=0)
        ax.axvline(span.x0, color="#9aa5b1", linewidth=0.6, zorder=0.5)
        lo, hi = max(span.x0, axes.x0), min(span.x1, axes.x1)
        name = layout.fit(span.label, (hi - lo) / width * AXES_PX - 6)
        if name:
            ax.text(
                lo, 1.01, " " + name, transform=over_x, fontsize=8, color="#52606d",
                va="bottom", ha="left", clip_on=False,
            )  # fmt: skip
    handles: list[Any] = []
    labels: list[str] = []
    colours = layout.band_colours(chart)
    seen: set[str] = set()
    for band in chart.bands:
        ax.fill_between(
            band.xs, band.lows, band.highs, step="post", color=colours[band.name],
            alpha=0.9, linewidth=0.3, edgecolor="white", zorder=1,
        )  # fmt: skip
        if band.name not in seen:
            seen.add(band.name)
            handles.append(Patch(color=colours[band.name]))
            labels.append(text(band.name, 60))
    for mark in chart.marks:
        ax.axvline(mark.x, color="grey", linewidth=0.8, linestyle=":", zorder=2)
    for n, line in enumerate(chart.lines):
        colour = layout.line_colour(chart, n)
        if line.rings_only:
            ax.plot(
                line.xs, line.ys, linestyle="none", marker="o", markersize=9,
                markerfacecolor="none", markeredgecolor=colour, markeredgewidth=1.6, zorder=3.5,
            )  # fmt: skip
            handles.append(
                Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color=colour)
            )
            labels.append(text(line.name, 60))
            continue
        (drawn,) = ax.plot(
            line.xs, line.ys, color=colour, linewidth=1.3,
            linestyle="--" if line.dashed else "-",
            drawstyle="steps-post" if line.step else "default",
            marker="o" if line.markers else None, markersize=3, zorder=3,
        )  # fmt: skip
        handles.append(drawn if not line.markers else Line2D([], [], color=colour, marker="o"))
        labels.append(text(line.name, 60))
    for label in chart.labels:
        right = (label.x - axes.x0) / width > 0.65
        ax.plot([label.x], [label.y], marker="v", color="crimson", zorder=4)
        ax.annotate(
            text(label.text), (label.x, label.y), textcoords="offset points",
            xytext=(-5 if right else 5, 7), ha="right" if right else "left",
            fontsize=9, color="crimson", fontweight="bold", zorder=4,
        )  # fmt: skip
    ax.set_xlim(axes.x0, axes.x1)
    ax.set_ylim(0, axes.y_top)
    ax.set_yticks([v for v, _ in axes.y_ticks], [s for _, s in axes.y_ticks])
    ax.set_xticks([v for v, _ in axes.x_ticks], [s for _, s in axes.x_ticks])
    ax.set_title(text(chart.title), pad=18 if chart.spans else 6, fontsize=11)
    ax.set_xlabel(text(chart.x_label))
    ax.set_ylabel(text(chart.y_label))
    ax.tick_params(labelsize=8)  # the size layout.py measures labels at
    ax.grid(True, axis="y", alpha=0.3)
    if handles:
        if len(handles) > layout.MAX_LEGEND:
            more = len(handles) - layout.MAX_LEGEND + 1
            handles = [*handles[: layout.MAX_LEGEND - 1], Patch(color="white")]
            labels = [*labels[: layout.MAX_LEGEND - 1], f"… and {more} more"]
        fig.legend(
            handles, labels, loc="outside lower center", ncols=min(4, len(handles)), fontsize=8,
            frameon=False,
        )  # fmt: skip
