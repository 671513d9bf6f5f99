"""The service's byte cap (VRAMLAB_MAX_EXPERIMENT_BYTES), held while the child runs.

The API refuses a spec whose planned tensors pass the cap, but an op can use far more
than its tensors (conv2d's im2col on the CPU: 1 GB for a 2.6 MB prediction). The claimed
spec carries the cap as ``memory_limit_bytes``; ``apply`` limits the child before it runs
the experiment, and ``explain`` turns the allocation failure that the limit causes into a
``memory_limit`` error that says what the cap was and what was asked.

- CUDA: the caching allocator of each GPU the spec uses may reserve at most the cap
  (``torch.cuda.set_per_process_memory_fraction``); passing it raises PyTorch's
  OutOfMemoryError while the device still has room.
- CPU: the child's data segment (RLIMIT_DATA: heap and private writable mappings, where
  every CPU tensor lives) may grow by at most the cap plus ``CPU_ALLOWANCE`` past what it
  uses now, and never past 90% of what the host has available then (so a cap larger than
  the host cannot take it down: that failure is an ``oom`` that says so); malloc then
  fails and PyTorch raises "can't allocate memory". Only the soft limit is set, in this
  child alone: the worker and the forkserver keep theirs. A CUDA experiment's host
  memory is not limited this way (the driver maps memory of its own).
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from vramlab.contract import ErrorType
from vramlab.runspec import RunSpec
from vramlab.units import human_bytes

# Room past the cap on the CPU for what the child needs besides the experiment's tensors
# (profiler events, library workspaces, building the report).
CPU_ALLOWANCE = 128 * 2**20
HOST_SHARE = 0.9  # of the host's available memory, the most a CPU experiment may take
_REQUESTED = re.compile(r"(?:allocate|Tried to allocate) ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)")
_GPU = re.compile(r"GPU (\d+) has a total capacity")
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@dataclass
class Limit:
    cap: int  # bytes
    cpu_ceiling: int | None = None  # the RLIMIT_DATA soft limit set, if any
    cpu_base: int = 0  # the child's data segment when the limit was set
    cpu_previous: int = resource.RLIM_INFINITY  # the soft limit before ours
    host_available: int | None = None  # set when the host's memory, not the cap, binds
    cuda: list[int] = field(default_factory=list)  # GPU indexes whose allocator is capped
    # A model experiment's emulated card (params.capacity_bytes), when it binds before the
    # service's cap: on CUDA its allocator may reserve no more (a full card is an ``oom``).
    capacity: int | None = None


_active: Limit | None = None
# How many intra-op threads this process has started: they live as long as it does, so a
# shared child starts them before its first experiment only (starting them again cost a
# millisecond a tiny experiment, more on a busy host, where the op waited for each thread).
_threads_started = 0


def apply(spec: RunSpec, device: torch.device) -> Limit | None:
    """Limit this child to the spec's ``memory_limit_bytes`` (absent: no limit)."""
    global _active
    release()  # a shared child runs spec after spec: each starts from no limit
    cap = spec.memory_limit_bytes
    capacity = capacity_of(spec)
    if capacity is not None and device.type == "cuda" and (cap is None or capacity < cap):
        cap = capacity
    else:
        capacity = None
    if cap is None or cap <= 0:
        return None
    limit = Limit(cap, capacity=capacity)
    devices = {str(device), *spec.planned_devices}
    cuda = sorted({torch.device(d).index or 0 for d in devices if d.startswith("cuda")})
    if cuda:
        for index in cuda:
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)
        limit.cuda = cuda
    else:
        # Start every intra-op thread first (an op uses one per 32,768 elements): their
        # stacks count as data, they are the child's rather than the experiment's, and a
        # thread that cannot start aborts the process instead of raising.
        _start_threads()
        limit.cpu_base = _data_bytes()
        if limit.cpu_base == 0:
            return None  # no /proc/self/status to measure against: leave it unlimited
        ceiling = limit.cpu_base + cap + CPU_ALLOWANCE
        available = psutil.virtual_memory().available
        if limit.cpu_base + int(available * HOST_SHARE) < ceiling:
            ceiling = limit.cpu_base + int(available * HOST_SHARE)
            limit.host_available = available
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit.cpu_previous = soft
        for bound in (soft, hard):
            if bound != resource.RLIM_INFINITY:
                ceiling = min(ceiling, bound)
        resource.setrlimit(resource.RLIMIT_DATA, (ceiling, hard))
        limit.cpu_ceiling = ceiling
    _active = limit
    return limit


def _start_threads() -> None:
    global _threads_started
    threads = torch.get_num_threads()
    if threads > _threads_started:
        torch.ones(threads * 65_536).add_(1)
        _threads_started = threads


def capacity_of(spec: RunSpec) -> int | None:
    """A model experiment's emulated card, in bytes (None: the whole device)."""
    value = spec.capacity_bytes
    return value if value is not None and value > 0 else None


def past_capacity(spec: RunSpec, model: dict[str, Any]) -> dict[str, Any] | None:
    """On the CPU the emulated card is judged after the run: a peak past it is an ``oom``
    (the run itself is held only by the service's cap, to keep the host safe). A
    distributed run's card is every rank's: the first rank past it is named."""
    capacity = capacity_of(spec)
    if capacity is None or spec.device != "cpu":
        return None
    ranks = model.get("ranks") or []
    over = [r for r in ranks if r["peak_allocated"] > capacity]
    if (ranks and not over) or (not ranks and model["peak_allocated"] <= capacity):
        return None
    peak = over[0]["peak_allocated"] if over else model["peak_allocated"]
    what = "the step"
    details: dict[str, Any] = {"capacity_bytes": capacity, "peak_allocated": peak}
    if over:
        what = f"rank {over[0]['rank']} of {len(ranks)}'s step"
        details.update(
            rank=over[0]["rank"],
            ranks_over=[r["rank"] for r in over],
            rank_peaks=[r["peak_allocated"] for r in ranks],
        )
    return {
        "type": ErrorType.OOM.value,
        "message": f"{what} peaked at {human_bytes(peak)} ({peak} bytes); the emulated card "
        f"holds {human_bytes(capacity)} (capacity_bytes {capacity}), so it would not fit",
        "hint": "on the CPU the emulated card is checked against the measured peak after "
        "the run (each rank's, in a distributed run); on CUDA the allocator itself is capped",
        "details": {**details, "emulated": True},
    }


def active() -> Limit | None:
    return _active


def release() -> None:
    """Lift the limit (a shared child, after each experiment): the allocator may use the
    whole device again, and the data segment's soft limit goes back to what it was. The
    hard limit is never touched, so the soft one can always go back up."""
    global _active
    limit, _active = _active, None
    if limit is None:
        return
    for index in limit.cuda:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    if limit.cpu_ceiling is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (limit.cpu_previous, hard))


def explain(exc: BaseException, spec: RunSpec) -> dict[str, Any] | None:
    """A ``memory_limit`` error if this allocation failure is the cap's doing, else None."""
    limit = _active
    if limit is None:
        return None
    message = str(exc)
    requested = _requested(message)
    device = torch.device(spec.device)
    details: dict[str, Any] = {
        "exception": type(exc).__name__,
        "limit_bytes": limit.cap,
        "requested_bytes": requested,
        "device": str(device),
        "pytorch_message": message[:2000],
    }
    rank = getattr(exc, "rank", None)  # a distributed run's (workers/models/ranks.py)
    if isinstance(exc, torch.OutOfMemoryError) and limit.cuda and rank is not None:
        # Read in the rank's own process as it failed: this child holds none of its memory.
        free, reserved = getattr(exc, "free_bytes", None), getattr(exc, "reserved_bytes", None)
        if requested is not None and free is not None and requested > free:
            return None  # the device itself is full: a real out-of-memory
        details.update(
            mechanism="cuda_memory_fraction",
            reserved_bytes=reserved,
            rank=rank,
            device=getattr(exc, "device", None),
        )
        where = (
            f"on rank {rank} of {getattr(exc, 'gpus', '?')} ({details['device']}), with "
            f"{human_bytes(reserved or 0)} reserved by its caching allocator"
        )
    elif isinstance(exc, torch.OutOfMemoryError) and limit.cuda:
        gpu = _GPU.search(message)
        index = int(gpu.group(1)) if gpu else device.index if device.index is not None else 0
        free, _ = torch.cuda.mem_get_info(index)
        if requested is not None and requested > free:
            return None  # the device itself is full: a real out-of-memory
        reserved = torch.cuda.memory_reserved(index)
        details.update(mechanism="cuda_memory_fraction", reserved_bytes=reserved)
        where = f"on cuda:{index}, with {human_bytes(reserved)} reserved by the caching allocator"
    elif limit.cpu_ceiling is not None:
        used = _data_bytes() - limit.cpu_base
        if requested is not None and limit.cpu_base + used + requested <= limit.cpu_ceiling:
            return None  # it fitted under the limit: the host itself refused it
        details.update(mechanism="rlimit_data", in_use_bytes=used)
        where = f"on the CPU, with {human_bytes(used)} in use since the run began"
        past_cap = requested is None or used + requested > limit.cap
        if limit.host_available is not None and not past_cap:
            details["host_available_bytes"] = limit.host_available
            return {
                "type": ErrorType.OOM.value,
                "message": f"the run asked for {human_bytes(requested or 0)} {where}; this "
                f"worker's host had {human_bytes(limit.host_available)} available when it began, "
                f"so it was stopped before the host ran out",
                "hint": "run it on a host with more free memory, or use a smaller shape",
                "details": details,
            }
    else:
        return None
    asked = "more memory" if requested is None else human_bytes(requested)
    if limit.capacity is not None:
        details["capacity_bytes"] = limit.capacity
        return {
            "type": ErrorType.OOM.value,
            "message": f"out of memory: the run asked for {asked} {where}, and the emulated "
            f"card holds {human_bytes(limit.capacity)} (capacity_bytes {limit.capacity})",
            "hint": "a smaller batch or sequence, checkpointing, bf16 or micro-batches "
            "may make it fit; a fit search (POST /v1/fits) finds the largest that does",
            "details": details,
        }
    return {
        "type": ErrorType.MEMORY_LIMIT.value,
        "message": (
            f"the run asked for {asked} {where}; this service caps an experiment at "
            f"{human_bytes(limit.cap)} (VRAMLAB_MAX_EXPERIMENT_BYTES), so it was stopped"
        ),
        "hint": "use a smaller shape or dtype; the cap counts everything the run allocates, "
        "and an op's workspaces (conv2d's im2col on the CPU, say) can be far larger than "
        "its tensors, which is all the prediction counts",
        "details": details,
    }


def _requested(message: str) -> int | None:
    found = _REQUESTED.search(message)
    if found is None:
        return None
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def _data_bytes() -> int:
    """This process's data segment (VmData), what RLIMIT_DATA counts."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0
