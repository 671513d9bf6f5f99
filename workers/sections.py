"""Named sections inside the op phase (forward, backward, optimizer): their own peaks.

On CUDA a section resets the allocator's peak counters and reads them at its end; the
peak it reset is carried so the phase's peak still covers the whole phase (measure.py
takes the larger). On the CPU a section is a profiler range whose figures are read from
the memory events afterwards (``fill_cpu``). A repeated section keeps its last run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vramlab import wire
from vramlab.contract import SectionFigures
from workers.tracer import SECTION_PREFIX

RANGE_PREFIX = SECTION_PREFIX  # the tracer reads these ranges back
_carried = {"allocated": 0, "reserved": 0}
_records: dict[str, dict[str, Any]] = {}


def reset_carry() -> None:
    _carried.update(allocated=0, reserved=0)


def carried() -> tuple[int, int]:
    return _carried["allocated"], _carried["reserved"]


def records() -> dict[str, dict[str, Any]]:
    return dict(_records)


def restore(saved: dict[str, dict[str, Any]]) -> None:
    """Put back the records of the measured run (an unmeasured extra run overwrote them)."""
    _records.clear()
    _records.update(saved)


@contextmanager
def section(name: str, device: torch.device) -> Iterator[None]:
    if device.type != "cuda":
        with torch.profiler.record_function(RANGE_PREFIX + name):
            yield
        return
    torch.cuda.synchronize(device)
    _carried["allocated"] = max(_carried["allocated"], torch.cuda.max_memory_allocated(device))
    _carried["reserved"] = max(_carried["reserved"], torch.cuda.max_memory_reserved(device))
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    finally:
        torch.cuda.synchronize(device)
        _records[name] = wire.dump(
            SectionFigures(
                allocated_start=start,
                allocated_end=torch.cuda.memory_allocated(device),
                allocated_peak=torch.cuda.max_memory_allocated(device),
            )
        )


def fill_cpu(ranges: list[tuple[str, float, float]], events: list[dict[str, Any]]) -> None:
    """CPU sections' figures from the profiler's events: a running total since set-up."""
    allocs = [e for e in events if e["device"] == "cpu" and e["action"] in ("alloc", "free")]
    for name, start, end in ranges:
        total, at_start, peak = 0, None, 0
        for event in allocs:
            t = event["t_us"]
            if at_start is None and t >= start:
                at_start, peak = total, total
            if t > end:
                break
            total += event["size"] if event["action"] == "alloc" else -event["size"]
            if at_start is not None:
                peak = max(peak, total)
        if at_start is None:
            at_start = peak = total
        _records[name.removeprefix(RANGE_PREFIX)] = wire.dump(
            SectionFigures(allocated_start=at_start, allocated_end=total, allocated_peak=peak)
        )
