"""What every request meets before any route: URLs without NUL, and the security
headers of every response.

PostgreSQL cannot hold a NUL in text, so a NUL in a path or query parameter would reach
the database as an error; it is refused here, once, for every route (422).

Every response is marked ``nosniff``. Every document a browser would render (HTML, and
SVG, which can hold scripts), whatever route made it (the pages under /ui/, their error
pages, /docs, a chart's standalone page), gets a Content-Security-Policy that runs only
the scripts that carry this response's nonce, no framing by other sites, and no referrer
beyond this site. The nonce is made for each request before any route runs
(``request.state.csp_nonce``: the templates and ``NonceDep`` put it on each script), and
the headers are chosen by the response's content type, so that no page can be left out.
Inline ``style`` attributes stay allowed: styles cannot run code. Stylesheets and images
may come from this site (Swagger UI's), nothing from elsewhere.
"""

import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from app.core.error_body import send_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DOCUMENTS = (b"text/html", b"image/svg+xml")
NOSNIFF = (b"x-content-type-options", b"nosniff")


def page_policy(nonce: str) -> str:
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        )
    )


def _document_headers(nonce: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-security-policy", page_policy(nonce).encode()),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
    ]


def _is_document(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() in DOCUMENTS
    return False


def _has_nul(scope: Scope) -> bool:
    raw = (scope.get("raw_path") or b"") + b"?" + (scope.get("query_string") or b"")
    return b"%00" in raw or b"\x00" in raw or "\x00" in scope.get("path", "")


class Edge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _has_nul(scope):
            await _refuse_nul(send)
            return
        nonce = secrets.token_urlsafe(18)
        scope.setdefault("state", {})["csp_nonce"] = nonce

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append(NOSNIFF)
                if _is_document(headers):
                    headers += _document_headers(nonce)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


async def _refuse_nul(send: Send) -> None:
    message = "the URL holds a NUL (%00); no path or query parameter may contain one"
    await send_error(send, 422, "validation_error", message, [{"field": "url", "message": message}])
