"""Charts as inline SVG with a small script for hover read-outs: no external assets, so a
page works offline. ``fragment`` goes inside a page; ``page`` is a standalone document."""

import html
import json
import math
import uuid

from app.plots.chart import Chart, human_bytes

WIDTH, HEIGHT = 900, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 20, 30, 50
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")

# One script serves every chart on a page: it reads each chart's data from its JSON block
# and shows the value of every line at the pointer's x.
SCRIPT = """
<script>
(function () {
  function human(n) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], v = n, i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return i === 0 ? Math.round(v) + " B" : v.toFixed(1) + " " + u[i];
  }
  function at(xs, ys, x) {
    var lo = 0, hi = xs.length - 1, best = -1;
    while (lo <= hi) {
      var m = (lo + hi) >> 1;
      if (xs[m] <= x) { best = m; lo = m + 1; } else hi = m - 1;
    }
    return best < 0 ? null : ys[best];
  }
  document.querySelectorAll(".vl-chart").forEach(function (box) {
    if (box.dataset.ready) return;
    box.dataset.ready = "1";
    var d = JSON.parse(box.querySelector("script.vl-data").textContent);
    var svg = box.querySelector("svg"), tip = box.querySelector(".vl-tip");
    var cursor = box.querySelector(".vl-cursor");
    svg.addEventListener("mousemove", function (ev) {
      var r = svg.getBoundingClientRect();
      var px = (ev.clientX - r.left) * d.width / r.width;
      if (px < d.left || px > d.width - d.right) { tip.style.display = "none"; return; }
      var f = (px - d.left) / (d.width - d.left - d.right);
      var x = d.log ? Math.pow(10, d.x0 + f * (d.x1 - d.x0)) : d.x0 + f * (d.x1 - d.x0);
      var rows = [d.xlabel + ": " + (Math.round(x * 1000) / 1000)];
      d.lines.forEach(function (l) {
        var y = at(l.xs, l.ys, x);
        if (y !== null) rows.push(l.name + ": " + human(y));
      });
      cursor.setAttribute("x1", px); cursor.setAttribute("x2", px);
      cursor.style.display = "";
      tip.textContent = rows.join("\\n");
      tip.style.display = "block";
      tip.style.left = (ev.clientX - r.left + 12) + "px";
      tip.style.top = (ev.clientY - r.top + 12) + "px";
    });
    svg.addEventListener("mouseleave", function () {
      tip.style.display = "none"; cursor.style.display = "none";
    });
  });
})();
</script>
"""


def _bounds(chart: Chart) -> tuple[float, float, float]:
    xs = [x for line in chart.lines for x in line.xs]
    xs += [m.x for m in chart.marks] + [lb.x for lb in chart.labels]
    ys = [y for line in chart.lines for y in line.ys] + [lb.y for lb in chart.labels]
    if chart.x_log:
        xs = [math.log10(x) for x in xs if x > 0]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x1 <= x0:
        x1 = x0 + 1
    y1 = max(ys) * 1.12 if ys and max(ys) > 0 else 1.0
    return x0, x1, y1


def fragment(chart: Chart) -> str:
    """A ``<div class="vl-chart">`` holding the SVG, its data and a tooltip."""
    x0, x1, y1 = _bounds(chart)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        v = math.log10(x) if chart.x_log and x > 0 else x
        return LEFT + (v - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - y / y1 * plot_h

    esc = html.escape
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
        f"<title>{esc(chart.title)}</title>",
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14">'
        f"{esc(chart.title)}</text>",
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#ccc"/>',
    ]
    for i in range(6):
        y = y1 * i / 5
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">'
            f"{esc(human_bytes(y))}</text>"
        )
    for i in range(6):
        v = x0 + (x1 - x0) * i / 5
        x_val = 10**v if chart.x_log else v
        parts.append(
            f'<text x="{LEFT + plot_w * i / 5:.1f}" y="{HEIGHT - BOTTOM + 16}" '
            f'text-anchor="middle">{x_val:.4g}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        f"{esc(chart.x_label)}</text>"
    )
    for mark in chart.marks:
        x = px(mark.x)
        parts.append(
            f'<line class="vl-mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
            f'stroke="grey" stroke-dasharray="2,3"/><text x="{x + 3:.1f}" y="{TOP + 12}" '
            f'fill="grey">{esc(mark.label)}</text>'
        )
    for n, line in enumerate(chart.lines):
        points: list[str] = []
        for i, (x, y) in enumerate(zip(line.xs, line.ys, strict=True)):
            if line.step and i:
                points.append(f"{px(x):.1f},{py(line.ys[i - 1]):.1f}")
            points.append(f"{px(x):.1f},{py(y):.1f}")
        colour = COLOURS[n % len(COLOURS)]
        dash = ' stroke-dasharray="6,4"' if line.dashed else ""
        parts.append(
            f'<polyline class="vl-line" fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
            f'points="{" ".join(points)}"><title>{esc(line.name)}</title></polyline>'
        )
        if line.markers:
            parts += [
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>'
                for x, y in zip(line.xs, line.ys, strict=True)
            ]
        parts.append(
            f'<rect x="{LEFT + 10}" y="{TOP + 8 + 14 * n}" width="12" height="3" '
            f'fill="{colour}"/><text x="{LEFT + 26}" y="{TOP + 12 + 14 * n}">'
            f"{esc(line.name)}</text>"
        )
    for label in chart.labels:
        x, y = px(label.x), py(label.y)
        parts.append(
            f'<g class="vl-label"><circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="crimson"/>'
            f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" fill="crimson">{esc(label.text)}</text></g>'
        )
    parts.append(
        f'<line class="vl-cursor" x1="0" x2="0" y1="{TOP}" y2="{TOP + plot_h}" '
        'stroke="#999" style="display:none"/></svg>'
    )
    data = {
        "width": WIDTH,
        "left": LEFT,
        "right": RIGHT,
        "x0": x0,
        "x1": x1,
        "log": chart.x_log,
        "xlabel": chart.x_label,
        "lines": [{"name": ln.name, "xs": ln.xs, "ys": ln.ys} for ln in chart.lines],
    }
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        f'<div class="vl-chart" id="chart-{uuid.uuid4().hex[:8]}" style="position:relative">'
        + "".join(parts)
        + '<pre class="vl-tip" style="display:none;position:absolute;margin:0;padding:4px 6px;'
        'background:#fffffe;border:1px solid #999;font-size:11px;pointer-events:none"></pre>'
        + f'<script type="application/json" class="vl-data">{payload}</script></div>'
    )


def page(chart: Chart) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(chart.title)}</title></head>"
        '<body style="font-family:sans-serif;max-width:960px;margin:1em auto">'
        + fragment(chart)
        + SCRIPT
        + "</body></html>"
    )
