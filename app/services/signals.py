"""Wakes claims that wait for work as soon as an experiment is queued.

Waiters take the current event *before* they look for work, so a notification that
lands between their look and their wait still wakes them. Notifications come from
request threads; ``notify`` hands them to the event loop safely. Between API replicas
no signal travels: their waiting claims look again every ``claim_poll_seconds``.
"""

import asyncio


class WorkSignal:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self) -> asyncio.Event:
        return self._event

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def notify(self) -> None:
        """Wake every waiting claim; safe to call from any thread."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._wake)


async def wait_for(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True
