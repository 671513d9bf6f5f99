"""What every request meets before any route: URLs without NUL, and the web pages'
security headers.

PostgreSQL cannot hold a NUL in text, so a NUL in a path or query parameter would reach
the database as an error; it is refused here, once, for every route (422).

Pages under /ui/ get a Content-Security-Policy that runs only the scripts that carry this
response's nonce (``request.state.csp_nonce``, which the templates put on each script), no
framing by other sites, and no MIME sniffing. Their inline ``style`` attributes stay
allowed: styles cannot run code.
"""

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PAGES = "/ui"


def page_policy(nonce: str) -> str:
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            "style-src 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        )
    )


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
        extra = [(b"x-content-type-options", b"nosniff")]
        path: str = scope.get("path", "")
        if path == PAGES or path.startswith(PAGES + "/"):
            nonce = secrets.token_urlsafe(18)
            scope.setdefault("state", {})["csp_nonce"] = nonce
            extra += [
                (b"content-security-policy", page_policy(nonce).encode()),
                (b"x-frame-options", b"DENY"),
                (b"referrer-policy", b"same-origin"),
            ]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _refuse_nul(send: Send) -> None:
    message = "the URL holds a NUL (%00); no path or query parameter may contain one"
    body = json.dumps(
        {
            "error": {
                "type": "validation_error",
                "message": message,
                "details": [{"field": "url", "message": message}],
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
