"""Who may run on a device at once: shared-isolation experiments together, any other
alone.

With the worker's default concurrency (chosen by device), several small shared-isolation
experiments run side by side on a device, each in its own shared process; an experiment
of any other kind (clean isolation, a model, a fit's trial, a run over several GPUs)
waits until the device is free and keeps it to itself, so that its figures are what
they would be alone. An exclusive one that waits goes before shared ones that come
later, so a stream of tiny experiments cannot hold it back for ever. Torch-free.
"""

import contextlib
import threading
from collections.abc import Iterable, Iterator


class DeviceGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared: dict[str, int] = {}  # shared experiments running, per device
        self._alone: set[str] = set()  # devices held by an exclusive experiment
        self._waiting: dict[str, int] = {}  # exclusive experiments waiting, per device

    @contextlib.contextmanager
    def shared(self, device: str) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: device not in self._alone and not self._waiting.get(device))
            self._shared[device] = self._shared.get(device, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._shared[device] -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, devices: Iterable[str]) -> Iterator[None]:
        held = sorted(set(devices))
        with self._cond:
            for d in held:
                self._waiting[d] = self._waiting.get(d, 0) + 1
            try:
                self._cond.wait_for(
                    lambda: all(d not in self._alone and not self._shared.get(d) for d in held)
                )
            finally:
                for d in held:
                    self._waiting[d] -= 1
            self._alone.update(held)
        try:
            yield
        finally:
            with self._cond:
                self._alone.difference_update(held)
                self._cond.notify_all()
