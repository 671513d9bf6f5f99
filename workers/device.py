"""The device made ready for an experiment: the allocator's options set before CUDA
starts, CUDA started with PyTorch's own errors, and a warm spare's device prepared
before its spec is known."""

from __future__ import annotations

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


def prepare(device: torch.device) -> Prepared:
    """Start CUDA on ``device`` ahead of a spec (a warm spare): context made, nothing
    allocated, so allocated and reserved still start at zero and first-use effects
    (cuBLAS's workspace) stay in the experiment. On the CPU there is nothing to start."""
    prepared = Prepared(str(device))
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
