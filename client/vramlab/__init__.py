"""vramlab's client: submit GPU memory experiments to a vramlab service, follow them, and
record a training program's memory. httpx is its one dependency (torch too, for
``record``, which runs in the environment that already has it).

``from vramlab import Client``; the ``vramlab`` command is :mod:`vramlab.cli`. The names
load on first use, so that the server and the worker, which import ``vramlab.names`` and
``vramlab.contract``, do not load the client with them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramlab.client import Client
    from vramlab.errors import ApiError, ClientError, GaveUp
    from vramlab.recorder import Recording

__all__ = ["ApiError", "Client", "ClientError", "GaveUp", "Recording"]
_HOMES = {
    "Client": "vramlab.client",
    "ApiError": "vramlab.errors",
    "ClientError": "vramlab.errors",
    "GaveUp": "vramlab.errors",
    "Recording": "vramlab.recorder",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'vramlab' has no attribute {name!r}")
