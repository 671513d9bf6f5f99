"""Who may send a snapshot now, and whose turn it is to be imported.

An upload is admitted before its body is read, or refused at once (429): at most
``snapshot_uploads_per_submitter`` of one submitter's uploads are in flight (its token;
its address when tokens are off), and at most ``snapshot_uploads_at_once`` of all. The
body is then read to disk at a minimum rate (``upload.paced``), and only then does the
upload wait for the import slot (``snapshot_imports_at_once``), in the order the bodies
were read: a client that trickles holds its own share of the reading, never the import
of someone else's file. Everything here runs on the event loop, so the counts need no
lock.
"""

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from starlette.requests import Request

from app.access.tokens import Principal
from app.core.config import Settings
from app.core.errors import TooManyRequests


def submitter(who: Principal, request: Request) -> str:
    """A submitter: its token; its address when tokens are off (the open local service)."""
    if who.id is not None:
        return f"token {who.id}"
    return f"address {request.client.host if request.client else 'unknown'}"


class Admission:
    def __init__(self, settings: Settings) -> None:
        self.per_submitter = settings.snapshot_uploads_per_submitter
        self.at_once = settings.snapshot_uploads_at_once
        self.import_wait = settings.snapshot_parse_seconds
        self.in_flight: Counter[str] = Counter()
        self.imports = asyncio.Semaphore(settings.snapshot_imports_at_once)

    @contextmanager
    def admitted(self, who: str) -> Iterator[None]:
        """One upload of ``who`` in flight, from before its body is read to its answer."""
        if self.in_flight[who] >= self.per_submitter:
            raise TooManyRequests(
                f"{self.in_flight[who]} snapshot uploads of yours are in flight; one "
                "submitter may have "
                f"{self.per_submitter} (VRAMLAB_SNAPSHOT_UPLOADS_PER_SUBMITTER): try again "
                "when one has been answered",
                headers={"Retry-After": "10"},
            )
        if self.in_flight.total() >= self.at_once:
            raise TooManyRequests(
                f"{self.at_once} snapshot uploads are in flight, the most at once "
                "(VRAMLAB_SNAPSHOT_UPLOADS_AT_ONCE); try again shortly",
                headers={"Retry-After": "10"},
            )
        self.in_flight[who] += 1
        try:
            yield
        finally:
            self.in_flight[who] -= 1
            if not self.in_flight[who]:
                del self.in_flight[who]

    @asynccontextmanager
    async def importing(self) -> AsyncIterator[None]:
        """The import slot, for an upload whose body has been read: waited for in turn
        (asyncio's semaphore wakes its waiters first come, first served), as long as one
        import may take at most; past that, 429."""
        try:
            async with asyncio.timeout(self.import_wait):
                await self.imports.acquire()
        except TimeoutError:
            raise TooManyRequests(
                "other snapshots are being imported; try again shortly "
                "(VRAMLAB_SNAPSHOT_IMPORTS_AT_ONCE)",
                headers={"Retry-After": "10"},
            ) from None
        try:
            yield
        finally:
            self.imports.release()
