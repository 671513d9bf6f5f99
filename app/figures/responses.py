"""A chart as an HTTP response: interactive HTML, or SVG or PNG drawn by matplotlib."""

from typing import Any, Literal

from fastapi.responses import HTMLResponse, Response

from app.figures import html
from app.figures.chart import Chart

FigureFormat = Literal["html", "svg", "png"]
MEDIA = {"svg": "image/svg+xml", "png": "image/png"}
FIGURE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/html": {}, "image/svg+xml": {}, "image/png": {}},
        "description": "the figure",
    }
}


def respond(chart: Chart, fmt: FigureFormat, nonce: str) -> Response:
    """``nonce``: this response's CSP nonce (``NonceDep``), which the page's script needs."""
    if fmt == "html":
        return HTMLResponse(html.page(chart, nonce))
    # Imported here: matplotlib costs a second at import, paid on the first plot only.
    from app.figures import mpl

    return Response(mpl.render(chart, fmt), media_type=MEDIA[fmt])
