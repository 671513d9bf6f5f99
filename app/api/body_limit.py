"""Refuse request bodies past a size limit with 413, before they are read into memory.

Checks Content-Length when it is given and counts the bytes of a streamed body when it
is not. Trace chunks from workers and snapshot uploads have their own, larger limits.
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from app.core.error_body import send_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        large_paths: tuple[str, ...],
        large_limit: int,
        exact: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.large_paths = large_paths
        self.large_limit = large_limit
        # Paths with a limit of their own (snapshot uploads).
        self.exact = exact or {}

    def _limit_for(self, path: str) -> int:
        if path in self.exact:
            return self.exact[path]
        large = any(path.startswith(p) and "/trace/" in path for p in self.large_paths)
        return self.large_limit if large else self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit_for(scope["path"])
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._reject(send, limit)
            return
        seen = 0
        too_large = False

        async def counting_receive() -> Message:
            nonlocal seen, too_large
            if too_large:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # End the body here; whatever the app answers to it is replaced by 413.
                    too_large = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded_send(message: Message) -> None:
            if not too_large:
                await send(message)

        await self.app(scope, counting_receive, guarded_send)
        if too_large:
            await self._reject(send, limit)

    @staticmethod
    async def _reject(send: Send, limit: int) -> None:
        await send_error(send, 413, "payload_too_large", f"request body over {limit} bytes")
