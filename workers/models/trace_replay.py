"""Replay a recorded memory snapshot's allocations and frees through the allocator model
(workers/models/caching_allocator.py) and compare what it reserves with what the real
allocator did: each segment it asked the driver for, released or mapped, and the peak.

The snapshot's trace must start from an empty allocator (record history before the
first CUDA allocation). Where the driver put each segment is taken from the trace
itself: the model decides when and how much to ask for, the driver decides where, and
the address only orders equal-sized free blocks of different segments. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.models.caching_allocator import (
    Block,
    CachingAllocator,
    OutOfMemory,
    Settings,
    bump_addresses,
)

GROWS = ("segment_alloc", "segment_map")
SHRINKS = ("segment_free", "segment_unmap")


@dataclass
class Comparison:
    """The recorded trace against the model's replay of it."""

    recorded_peak_reserved: int
    model_peak_reserved: int
    recorded_peak_allocated: int
    model_peak_allocated: int
    recorded_segments: list[tuple[str, int]]  # (action, bytes) in order
    model_segments: list[tuple[str, int]]
    allocs: int = 0
    misplaced: int = 0  # allocations the model put at another address than the trace
    ooms_expected: int = 0
    ooms_matched: int = 0
    unexpected_oom: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def segments_match(self) -> bool:
        return self.recorded_segments == self.model_segments

    @property
    def first_divergence(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.recorded_segments, self.model_segments, strict=False)):
            if a != b:
                return i
        if len(self.recorded_segments) != len(self.model_segments):
            return min(len(self.recorded_segments), len(self.model_segments))
        return None


class _DriverPlacement:
    """Segment addresses as the trace recorded them, in the order the model asks."""

    def __init__(self, trace: list[Mapping[str, Any]]) -> None:
        self.segments = [
            (int(e["addr"]), int(e["size"])) for e in trace if e.get("action") == "segment_alloc"
        ]
        self.maps = [int(e["addr"]) for e in trace if e.get("action") == "segment_map"]
        self.next_segment = 0
        self.expandable: list[tuple[int, int]] = []  # (base, size) handed out
        self.fallback = bump_addresses(start=1 << 60)
        self.misses = 0

    def __call__(self, kind: str, size: int) -> int:
        if kind == "segment":
            if self.next_segment < len(self.segments):
                addr, recorded = self.segments[self.next_segment]
                self.next_segment += 1
                if recorded == size:
                    return addr
            self.misses += 1
            return self.fallback(kind, size)
        for addr in self.maps:  # the first mapping outside every segment seen so far
            if not any(base <= addr < base + span for base, span in self.expandable):
                self.expandable.append((addr, size))
                return addr
        self.misses += 1
        return self.fallback(kind, size)


def compare(
    snapshot: Mapping[str, Any],
    device: int = 0,
    fraction_limit: int | None = None,
    device_limit: int | None = None,
) -> Comparison:
    """Replay ``snapshot``'s trace on ``device`` with the settings it recorded, under the
    limits given (the recording's memory fraction, if it set one)."""
    trace = list(snapshot["device_traces"][device])
    environment = snapshot.get("environment")
    total = environment.get("gpu_total_memory") if isinstance(environment, Mapping) else None
    placement = _DriverPlacement(trace)
    model = CachingAllocator(
        settings=Settings.from_snapshot(snapshot.get("allocator_settings")),
        fraction_limit=fraction_limit,
        device_limit=device_limit,
        device_total=int(total) if isinstance(total, int) else 80 * 2**30,
        addresses=placement,
        record=True,
    )
    live: dict[int, Block] = {}
    allocated = reserved = peak_allocated = peak_reserved = 0
    recorded_segments: list[tuple[str, int]] = []
    out = Comparison(0, 0, 0, 0, recorded_segments, [])
    for e in trace:
        action = e.get("action")
        if action == "alloc":
            size, addr = int(e["size"]), int(e["addr"])
            try:
                block = model.malloc(size, int(e.get("stream") or 0))
            except OutOfMemory:
                out.unexpected_oom = True
                out.notes.append(f"the model ran out of memory where the trace allocated {size}")
                break
            live[addr] = block
            out.allocs += 1
            out.misplaced += block.ptr != addr
            allocated += block.size
            peak_allocated = max(peak_allocated, allocated)
        elif action == "free_completed":
            gone = live.pop(int(e["addr"]), None)
            if gone is not None:
                allocated -= gone.size
                model.free(gone)
        elif action in GROWS or action in SHRINKS:
            size = int(e["size"])
            recorded_segments.append((action, size))
            reserved += size if action in GROWS else -size
            peak_reserved = max(peak_reserved, reserved)
        elif action == "oom":
            out.ooms_expected += 1
            try:
                live[-out.ooms_expected] = model.malloc(int(e["size"]), int(e.get("stream") or 0))
                out.notes.append(f"the trace ran out of memory at {e['size']}; the model did not")
            except OutOfMemory:
                out.ooms_matched += 1
    out.recorded_peak_reserved = peak_reserved
    stats = snapshot.get("memory_stats")
    stats = stats[device] if isinstance(stats, list) and len(stats) > device else stats
    recorded = stats.get("allocated_bytes.all.peak") if isinstance(stats, Mapping) else None
    out.recorded_peak_allocated = int(recorded) if isinstance(recorded, int) else peak_allocated
    out.model_peak_reserved = model.peak_reserved
    out.model_peak_allocated = model.peak_allocated
    out.model_segments = [(ev.action, ev.size) for ev in model.events if ev.action != "oom"]
    if placement.misses:
        out.notes.append(f"{placement.misses} segments the trace did not place")
    return out
