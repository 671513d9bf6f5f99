"""Charts as inline SVG with a small script for hover read-outs: no external assets, so a
page works offline. ``fragment`` goes inside a page; ``page`` is a standalone document.

Every text is escaped here and passed through ``chart.text`` first: labels are text,
never markup."""

import html
import json
import uuid

from app.figures import layout
from app.figures.chart import Chart, stepped, text

WIDTH = layout.WIDTH
LEFT, RIGHT, BOTTOM = 80, 24, 44
LEGEND_ROW = 18

# One script serves every chart on a page: it reads each chart's data from its JSON block
# and shows, at the pointer's x, the value of every line and what the band under it is.
# Without its tag: each page wraps it in one that carries the response's CSP nonce.
CHART_JS = """
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
      var x = d.x0 + (px - d.left) / (d.width - d.left - d.right) * (d.x1 - d.x0);
      var rows = [];
      if (d.cats) {
        x = Math.round(x);
        var c = d.cats.filter(function (k) { return k[0] === x; })[0];
        rows.push(d.xlabel + ": " + (c ? c[1] : ""));
      } else {
        rows.push(d.xlabel + ": " + (Math.round(x * 1000) / 1000));
      }
      d.lines.forEach(function (l) {
        var y = d.cats ? l.ys[l.xs.indexOf(x)] : at(l.xs, l.ys, x);
        if (y !== null && y !== undefined) rows.push(l.name + ": " + human(y));
      });
      var band = ev.target.closest ? ev.target.closest("[data-i]") : null;
      if (band) rows.push("", d.details[+band.dataset.i]);
      cursor.setAttribute("x1", px); cursor.setAttribute("x2", px);
      cursor.style.display = "";
      tip.textContent = rows.join("\\n");
      tip.style.display = "block";
      var left = ev.clientX - r.left + 12;
      if (left > r.width - 260) left = Math.max(0, ev.clientX - r.left - 272);
      tip.style.left = left + "px";
      tip.style.top = (ev.clientY - r.top + 12) + "px";
    });
    svg.addEventListener("mouseleave", function () {
      tip.style.display = "none"; cursor.style.display = "none";
    });
  });
})();
"""


def _e(value: object) -> str:
    return html.escape(text(value), quote=True)


def fragment(chart: Chart) -> str:
    """A ``<div class="vl-chart">`` holding the SVG, its data and a tooltip."""
    plot_w = WIDTH - LEFT - RIGHT
    chart_id = f"chart-{uuid.uuid4().hex[:8]}"
    top = 50 if chart.spans else 34
    plot_h = layout.PLOT_HEIGHT
    ax = layout.axes(chart, plot_w)
    entries = layout.legend(chart)
    rows = _legend_rows(entries, plot_w)
    height = top + plot_h + BOTTOM + LEGEND_ROW * len(rows) + 6

    def px(x: float) -> float:
        return LEFT + (x - ax.x0) / (ax.x1 - ax.x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y / ax.y_top * plot_h

    def clamp(x: float) -> float:
        return min(max(px(x), LEFT), LEFT + plot_w)

    parts = [
        f'<svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
        f"<title>{_e(chart.title)}</title>",
        f'<text class="vl-title" x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14">'
        f"{_e(layout.fit(chart.title, WIDTH / 14 * 11 - 20) or '')}</text>",
        f'<clipPath id="{chart_id}-clip"><rect x="{LEFT}" y="{top}" width="{plot_w}" '
        f'height="{plot_h}"/></clipPath>',
    ]
    # Phases: shaded, named above the plot where the name fits.
    for i, span in enumerate(chart.spans):
        x0, x1 = clamp(span.x0), clamp(span.x1)
        fill = "#eef2f7" if i % 2 == 0 else "#f8f8f8"
        parts.append(
            f'<g class="vl-phase"><rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 0.5):.1f}" '
            f'height="{plot_h}" fill="{fill}"/>'
            f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="{top - 12}" y2="{top + plot_h}" '
            f'stroke="#9aa5b1" stroke-width="0.8"/>'
            f"<title>{_e(span.detail or span.label)}</title>"
        )
        name = layout.fit(span.label, x1 - x0 - 6)
        if name:
            parts.append(
                f'<text class="vl-phase-label" x="{x0 + 3:.1f}" y="{top - 4}" '
                f'fill="#52606d">{_e(name)}</text>'
            )
        parts.append("</g>")
    # Gridlines and ticks.
    for y, label in ax.y_ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
            f'stroke="#e4e4e4"/><text class="vl-tick vl-ytick" x="{LEFT - 6}" '
            f'y="{py(y) + 4:.1f}" text-anchor="end">{_e(label)}</text>'
        )
    for x, label in ax.x_ticks:
        parts.append(
            f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top + plot_h}" '
            f'y2="{top + plot_h + 4}" stroke="#888"/><text class="vl-tick vl-xtick" '
            f'x="{px(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{_e(label)}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{top + plot_h + 34}" text-anchor="middle">'
        f"{_e(chart.x_label)}</text>"
    )
    details: list[str] = []
    body: list[str] = []
    colours = layout.band_colours(chart)
    for band in chart.bands:
        upper = stepped(band.xs, band.highs)
        lower = stepped(band.xs, band.lows)[::-1]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in upper + lower)
        cls = "vl-band vl-group" if band.grouped else "vl-band"
        body.append(
            f'<polygon class="{cls}" data-i="{len(details)}" fill="{colours[band.name]}" '
            f'fill-opacity="0.9" stroke="#fff" stroke-width="0.4" points="{points}">'
            f"<title>{_e(band.detail or band.name)}</title></polygon>"
        )
        details.append(text(band.detail or band.name, 600))
    for mark in chart.marks:
        x = px(mark.x)
        body.append(
            f'<line class="vl-mark" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="grey" stroke-dasharray="2,3"><title>{_e(mark.label)}</title></line>'
        )
    for n, line in enumerate(chart.lines):
        pts = stepped(line.xs, line.ys) if line.step else list(zip(line.xs, line.ys, strict=True))
        colour = layout.line_colour(chart, n)
        dash = ' stroke-dasharray="6,4"' if line.dashed else ""
        if line.rings_only:
            body += [
                f'<circle class="vl-ring" cx="{px(x):.1f}" cy="{py(y):.1f}" r="6" fill="none" '
                f'stroke="{colour}" stroke-width="2"><title>{_e(line.name)}</title></circle>'
                for x, y in zip(line.xs, line.ys, strict=True)
            ]
            continue
        body.append(
            f'<polyline class="vl-line" fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
            f'points="{" ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)}">'
            f"<title>{_e(line.name)}</title></polyline>"
        )
        if line.markers:
            body += [
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>'
                for x, y in zip(line.xs, line.ys, strict=True)
            ]
    parts.append(f'<g clip-path="url(#{chart_id}-clip)">{"".join(body)}</g>')
    parts.append(
        f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#bbb"/>'
    )
    for point in chart.labels:
        x, y = px(point.x), py(point.y)
        right = x > LEFT + plot_w * 0.65
        anchor, dx = ("end", -7) if right else ("start", 7)
        parts.append(
            f'<g class="vl-label vl-peak"><path d="M{x:.1f},{y:.1f} l-5,-8 h10 z" '
            f'fill="crimson"/><text x="{x + dx:.1f}" y="{max(y - 10, top + 11):.1f}" '
            f'text-anchor="{anchor}" fill="crimson" font-weight="bold" paint-order="stroke" '
            f'stroke="#fff" stroke-width="3">{_e(point.text)}</text></g>'
        )
    legend_top = top + plot_h + BOTTOM
    parts.append('<g class="vl-legend">')
    for r, row in enumerate(rows):
        for x, (kind, colour, name) in row:
            y = legend_top + r * LEGEND_ROW
            if kind == "band":
                parts.append(f'<rect x="{x}" y="{y}" width="12" height="10" fill="{colour}"/>')
            elif kind == "ring":
                parts.append(
                    f'<circle cx="{x + 6}" cy="{y + 5}" r="4.5" fill="none" stroke="{colour}" '
                    f'stroke-width="2"/>'
                )
            elif kind != "none":
                dash = ' stroke-dasharray="4,3"' if kind == "dashed" else ""
                parts.append(
                    f'<line x1="{x}" x2="{x + 12}" y1="{y + 5}" y2="{y + 5}" stroke="{colour}" '
                    f'stroke-width="2"{dash}/>'
                )
            parts.append(f'<text x="{x + 16}" y="{y + 9}">{_e(name)}</text>')
    parts.append("</g>")
    parts.append(
        f'<line class="vl-cursor" x1="0" x2="0" y1="{top}" y2="{top + plot_h}" '
        'stroke="#999" style="display:none"/></svg>'
    )
    data = {
        "width": WIDTH,
        "left": LEFT,
        "right": RIGHT,
        "x0": ax.x0,
        "x1": ax.x1,
        "xlabel": text(chart.x_label),
        "cats": [[p, text(s, 60)] for p, s in chart.x_ticks] if chart.x_ticks else None,
        "lines": [{"name": text(ln.name, 80), "xs": ln.xs, "ys": ln.ys} for ln in chart.lines],
        "details": details,
    }
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    svg = "".join(parts)
    return (
        f'<div class="vl-chart" id="{chart_id}" style="position:relative">'
        + svg
        + '<pre class="vl-tip" style="display:none;position:absolute;margin:0;padding:4px 6px;'
        "background:#fffffe;border:1px solid #999;font-size:11px;pointer-events:none;"
        'max-width:260px;white-space:pre-wrap;z-index:2"></pre>'
        + f'<script type="application/json" class="vl-data">{payload}</script></div>'
    )


def _legend_rows(
    entries: list[tuple[str, str, str]], width: float
) -> list[list[tuple[float, tuple[str, str, str]]]]:
    rows: list[list[tuple[float, tuple[str, str, str]]]] = []
    x = float(LEFT)
    for entry in entries:
        w = 16 + len(entry[2]) * layout.CHAR_PX + 18
        if not rows or x + w > LEFT + width:
            rows.append([])
            x = float(LEFT)
        rows[-1].append((x, entry))
        x += w
    return rows


def page(chart: Chart, nonce: str) -> str:
    """The chart as a page of its own; its script carries the response's CSP nonce."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(chart.title)}</title></head>"
        '<body style="font-family:sans-serif;max-width:960px;margin:1em auto">'
        + fragment(chart)
        + f'<script nonce="{nonce}">{CHART_JS}</script>'
        + "</body></html>"
    )
