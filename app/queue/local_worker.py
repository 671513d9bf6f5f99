"""The worker ``vramlab up`` starts beside its API: until it has registered, a submit
waits for it (up to ``VRAMLAB_LOCAL_WORKER_START_S``) instead of answering that no live
worker is connected, and instead of choosing a device before the worker has said which
it offers. Outside ``up`` (no local worker token) nothing waits."""

import asyncio
import threading
import time

from fastapi import Request

from app.access.tokens import LOCAL_WORKER, Principal
from app.core.config import Settings

STARTING = (
    "the worker `vramlab up` started has not registered yet (it is starting: importing "
    "PyTorch takes a few seconds); it runs this once it has"
)


class LocalWorker:
    """Whether ``up``'s own worker is expected, and whether it has registered."""

    def __init__(self, settings: Settings) -> None:
        self.expected = settings.local_worker_token is not None
        self.wait_s = settings.local_worker_start_s
        self._registered = threading.Event()

    @property
    def starting(self) -> bool:
        return self.expected and not self._registered.is_set()

    def registered(self, who: Principal) -> None:
        if who is LOCAL_WORKER:
            self._registered.set()

    async def ready(self) -> None:
        """Return once the local worker has registered, or the wait is over."""
        deadline = time.monotonic() + self.wait_s
        while self.starting and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def of(request: Request) -> LocalWorker:
    local: LocalWorker = request.app.state.local_worker
    return local


async def wait_for_it(request: Request) -> None:
    """A dependency for routes that choose a device from the live workers (presets,
    sweeps, fits): while ``up``'s worker starts, they wait for it as a submit does."""
    await of(request).ready()
