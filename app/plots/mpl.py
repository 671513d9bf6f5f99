"""Charts drawn by matplotlib (Agg: no display, no GUI toolkit) as SVG or PNG bytes."""

import io
import threading

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from app.plots.chart import Chart, human_bytes

# matplotlib's font and text caches are shared; one render at a time keeps them sane
# under the API's thread pool.
_LOCK = threading.Lock()


def render(chart: Chart, fmt: str) -> bytes:
    """``fmt`` is "svg" or "png"."""
    with _LOCK:
        # A Figure made directly (not pyplot) is never registered globally: no leak.
        fig = Figure(figsize=(10, 5), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        for line in chart.lines:
            ax.plot(
                line.xs,
                line.ys,
                label=line.name,
                linestyle="--" if line.dashed else "-",
                drawstyle="steps-post" if line.step else "default",
                marker="o" if line.markers else None,
                markersize=3,
            )
        for mark in chart.marks:
            ax.axvline(mark.x, color="grey", linewidth=0.8, linestyle=":")
            ax.annotate(
                mark.label,
                (mark.x, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color="grey",
            )
        for label in chart.labels:
            ax.plot([label.x], [label.y], marker="v", color="crimson")
            ax.annotate(
                label.text,
                (label.x, label.y),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=8,
                color="crimson",
            )
        if chart.x_log:
            ax.set_xscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
        ax.set_title(chart.title)
        ax.set_xlabel(chart.x_label)
        ax.set_ylabel(chart.y_label)
        ax.grid(True, alpha=0.3)
        if chart.lines:
            ax.legend(fontsize=8, loc="best")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
        return buf.getvalue()
