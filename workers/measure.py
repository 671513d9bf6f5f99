"""Memory figures of one phase of an experiment, from the allocator and the OS.

On CUDA the caching allocator counts its own bytes (``memory_stats``) and keeps peaks
that we reset at each phase's start. The CPU has no caching allocator: its allocated
bytes and peaks come afterwards from the profiler's memory events (``fill_from_events``)
and reserved equals allocated.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from vramlab import wire
from vramlab.contract import Phase
from workers import sections
from workers.tracer import Event


@dataclass
class Reading:
    allocated: int | None = None
    reserved: int | None = None
    active: int | None = None
    inactive_split: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    host_rss: int = 0
    device_used: int | None = None
    pinned_host: int | None = None


@dataclass
class PhaseRecord:
    name: str
    start: Reading = field(default_factory=Reading)
    end: Reading = field(default_factory=Reading)
    allocated_peak: int | None = None
    reserved_peak: int | None = None
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        phase = Phase(
            name=self.name,
            allocated_start=self.start.allocated,
            allocated_end=self.end.allocated,
            allocated_peak=self.allocated_peak,
            reserved_start=self.start.reserved,
            reserved_end=self.end.reserved,
            reserved_peak=self.reserved_peak,
            active_bytes=self.end.active,
            inactive_split_bytes=self.end.inactive_split,
            alloc_retries=self.end.alloc_retries,
            ooms=self.end.ooms,
            host_rss_start=self.start.host_rss,
            host_rss_end=self.end.host_rss,
            device_used_start=self.start.device_used,
            device_used_end=self.end.device_used,
            pinned_host_start=self.start.pinned_host,
            pinned_host_end=self.end.pinned_host,
            wall_s=self.wall_s,
        )
        return dict(wire.dump(phase))


class Meter:
    """Reads the figures of the experiment's device; one per child process."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._process = psutil.Process()
        self.phases: list[PhaseRecord] = []

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def read(self) -> Reading:
        reading = Reading(host_rss=self._process.memory_info().rss)
        if self.is_cuda:
            # The nested form: memory_stats() flattens it key by key in Python, about
            # half a millisecond a reading.
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            reading.allocated = _current(stats, "allocated_bytes")
            reading.reserved = _current(stats, "reserved_bytes")
            reading.active = _current(stats, "active_bytes")
            reading.inactive_split = _current(stats, "inactive_split_bytes")
            reading.alloc_retries = int(stats.get("num_alloc_retries", 0))
            reading.ooms = int(stats.get("num_ooms", 0))
            # Device-level: sees the CUDA context and other processes, not only ours.
            reading.device_used = int(total - free)
        if torch.cuda.is_initialized():
            # PyTorch's pinned host allocator (pin_memory=True, pinned staging): its bytes.
            host = torch.cuda.host_memory_stats()
            reading.pinned_host = int(host.get("allocated_bytes.current", 0))
        return reading

    def phase(
        self, name: str, tracer_phase: AbstractContextManager[None]
    ) -> AbstractContextManager[PhaseRecord]:
        return self._phase(name, tracer_phase)

    @contextmanager
    def _phase(
        self, name: str, tracer_phase: AbstractContextManager[None]
    ) -> Iterator[PhaseRecord]:
        record = PhaseRecord(name)
        self.phases.append(record)
        self.sync()
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        sections.reset_carry()
        record.start = self.read()
        started = time.perf_counter()
        try:
            with tracer_phase:
                yield record
                self.sync()
        finally:
            # Also on an error: an OOM's figures at that moment are a result worth keeping.
            record.wall_s = time.perf_counter() - started
            # After a CUDA error the device may not answer: keep the start figures then.
            with contextlib.suppress(Exception):
                self.close_phase(record)

    def close_phase(self, record: PhaseRecord) -> None:
        """Read a phase's end figures (also when it ended in an error, such as an OOM)."""
        record.end = self.read()
        if self.is_cuda:
            # A section inside the phase reset the counters: take the peak it carried too.
            carried_alloc, carried_reserved = sections.carried()
            record.allocated_peak = max(
                int(torch.cuda.max_memory_allocated(self.device)), carried_alloc
            )
            record.reserved_peak = max(
                int(torch.cuda.max_memory_reserved(self.device)), carried_reserved
            )


def _current(stats: dict[str, Any], name: str) -> int:
    return int(stats.get(name, {}).get("all", {}).get("current", 0))


def fill_from_events(phases: list[PhaseRecord], events: list[Event], device: str) -> None:
    """Give CPU phases their allocated figures: a running total of the profiler's events.

    The total counts from the profiler's start (the start of set-up), so bytes that the
    process held before the experiment are not in it. Reserved equals allocated.
    """
    by_phase: dict[str, list[Event]] = {p.name: [] for p in phases}
    for event in events:
        if event["device"] == device and event["action"] in ("alloc", "free"):
            by_phase.setdefault(event["phase"], []).append(event)
    total = 0
    for record in phases:
        start = peak = total
        for event in by_phase.get(record.name, []):
            total += event["size"] if event["action"] == "alloc" else -event["size"]
            peak = max(peak, total)
        for reading, value in ((record.start, start), (record.end, total)):
            reading.allocated = reading.reserved = reading.active = value
        record.allocated_peak = record.reserved_peak = peak
