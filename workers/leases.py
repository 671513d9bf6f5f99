"""A claimed experiment's lease until its outcome is stored, and the heartbeats that keep
it: what they learn (a cancel asked for, the lease lost) is set on the Lease."""

import logging
import threading
from dataclasses import dataclass, field

from workers.client import LeaseLost
from workers.seams import ClientLike

log = logging.getLogger("vramlab.worker")


@dataclass
class Lease:
    """One claimed experiment until its outcome is stored: what the heartbeats learned."""

    exp_id: str
    token: str
    cancel_requested: bool = False
    lost: bool = False
    done: threading.Event = field(default_factory=threading.Event)


def beat_one(client: ClientLike, lease: Lease, every: float) -> None:
    """Heartbeats for one lease every ``every`` seconds until it is done or lost."""
    while not lease.done.wait(every):
        try:
            reply = client.heartbeat(lease.exp_id, lease.token)
            lease.cancel_requested = bool(reply.get("cancel_requested"))
        except LeaseLost:
            log.warning("lease on %s lost: stopping it", lease.exp_id)
            lease.lost = True
            return
        except Exception as exc:  # the API may be down for a while: keep trying
            log.warning("heartbeat for %s failed: %s", lease.exp_id, exc)


def beat_many(client: ClientLike, leases: list[Lease], over: threading.Event, every: float) -> None:
    """Heartbeats for a batch's leases, each until it is done or lost, until ``over``."""
    while not over.wait(every):
        for lease in leases:
            if lease.done.is_set() or lease.lost:
                continue
            try:
                reply = client.heartbeat(lease.exp_id, lease.token)
                lease.cancel_requested = bool(reply.get("cancel_requested"))
            except LeaseLost:
                log.warning("lease on %s lost: stopping it", lease.exp_id)
                lease.lost = True
            except Exception as exc:  # the API may be down for a while: keep trying
                log.warning("heartbeat for %s failed: %s", lease.exp_id, exc)
