"""The device made ready for an experiment: the allocator's options set before CUDA
starts, CUDA started with PyTorch's own errors, and a warm spare's device prepared
before its spec is known."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from workers import allocator
from workers.errors import OpFailure, call


@dataclass
class Prepared:
    """A device made ready before the spec was known: the host memory starting it took,
    or its error."""

    device: str
    init_rss: tuple[int, int] | None = None
    error: BaseException | None = None
    # Its CUDA context opened one hardware queue because a spare asked for it (one_queue).
    one_queue: bool = False


# How many hardware queues (connections) a CUDA context opens; the driver's default is 8.
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
ONE_QUEUE_NOTE = (
    "Its CUDA context was made with one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, "
    "set by the worker for the spares of op experiments: such a context is made in half "
    "the time). Work on one stream runs as it would with the driver's default of 8 "
    "queues, and the memory figures are the same; work on several streams is not "
    "overlapped by the hardware."
)


def one_queue(device: str) -> bool:
    """Before CUDA starts: ask for contexts of one hardware queue, unless the worker's
    environment says how many. True when this process's contexts will have one because
    of it. A context opens its queues as it is made (half of its start-up time on an
    H200, bench/context_cost.py), and back-to-back clean experiments are bound by how fast
    their spares' contexts are made."""
    if not device.startswith("cuda") or MAX_CONNECTIONS in os.environ:
        return False
    os.environ[MAX_CONNECTIONS] = "1"
    return True


def prepare(device: torch.device, *, queue_of_one: bool = False) -> Prepared:
    """Start CUDA on ``device`` ahead of a spec (a warm spare): context made, nothing
    allocated, so allocated and reserved still start at zero and first-use effects
    (cuBLAS's workspace) stay in the experiment. On the CPU there is nothing to start."""
    prepared = Prepared(str(device))
    if queue_of_one:
        prepared.one_queue = one_queue(str(device))
    if device.type == "cuda":
        rss_before = psutil.Process().memory_info().rss
        try:
            call(init_device, device)
        except OpFailure as failure:
            prepared.error = failure.cause
        prepared.init_rss = (rss_before, psutil.Process().memory_info().rss)
    return prepared


def apply_allocator(settings: dict[str, Any]) -> str:
    """Set the spec's allocator options before CUDA starts; return the conf string in use."""
    conf = allocator.conf_string(settings)
    allocator.set_env(conf)
    # The env var is read when CUDA's allocator first starts. Where this torch read it
    # earlier, set the options that can change at run time as well (not the backend).
    runtime = ",".join(p for p in conf.split(",") if p and not p.startswith("backend:"))
    setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if runtime and setter is not None and torch.cuda.is_available():
        setter(runtime)
    return allocator.current_conf()


def init_device(device: torch.device) -> None:
    """Start CUDA (context, allocator) before any figure is read, with PyTorch's own errors."""
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.set_device(device)
        torch.empty(0, device=device)
