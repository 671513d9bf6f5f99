"""Allocator event traces, normalised to vramlab's one event schema.

On CUDA the source is PyTorch's allocation history (``_record_memory_history``); on
the CPU, which has no caching allocator, the profiler's memory events. Both become
events of one shape::

    {"seq", "t_us", "action", "addr", "size", "device", "stream", "phase", "frames"}

``t_us`` counts microseconds from the experiment's start; phase boundaries are
``mark`` events (size 0, with a ``name``). Frames appear only when stacks were asked.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from vramlab.catalog.devices import canonical_device

PHASES = ("setup", "op", "after")
MAX_ENTRIES = 1_000_000
MAX_FRAMES = 64
_RANGE_PREFIX = "vramlab::phase::"
SECTION_PREFIX = "vramlab::section::"
# CUDA history names the completion of a free "free_completed"; ours is "free".
_CUDA_ACTIONS = {"free_completed": "free"}
_PY_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<name>.*)$")

Event = dict[str, Any]
_KEYS = ("t_us", "action", "addr", "size", "device", "stream")


@dataclass
class Trace:
    source: str  # "cuda_memory_history" | "cpu_profiler" | "none"
    events: list[Event] = field(default_factory=list)
    truncated: bool = False
    # CPU sections inside the op (workers/sections.py): (name, start_us, end_us).
    sections: list[tuple[str, float, float]] = field(default_factory=list)


class Tracer(Protocol):
    source: str

    def start(self) -> None: ...
    def phase(self, name: str) -> AbstractContextManager[None]: ...
    def stop(self) -> Trace: ...


class NullTracer:
    """No recording (trace "none" on CUDA): the figures come from the allocator's stats."""

    source = "none"

    def start(self) -> None:
        pass

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def stop(self) -> Trace:
        return Trace(self.source)


class CudaHistoryTracer:
    """PyTorch's CUDA allocation history: every alloc, free and segment change."""

    source = "cuda_memory_history"

    def __init__(self, device_index: int, t0_ns: int, stacks: bool) -> None:
        self._index = device_index
        self._t0_ns = t0_ns
        self._stacks = stacks
        # Phase boundaries on the wall clock, which the history's time_us also uses.
        self._marks: list[tuple[str, int]] = []

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(
            enabled="all",
            context="alloc" if self._stacks else None,
            stacks="python",
            max_entries=MAX_ENTRIES,
            # Empty in a fresh process; in a shared one it holds nothing of an earlier
            # experiment either (workers/shared.py checks that, this makes sure).
            clear_history=True,
        )

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._marks.append((name, time.time_ns()))
        yield

    def stop(self) -> Trace:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        traces = snapshot.get("device_traces") or []
        raw = traces[self._index] if self._index < len(traces) else []
        events = [self._event(entry) for entry in raw]
        events += [
            _mark(name, (t - self._t0_ns) / 1000, f"cuda:{self._index}") for name, t in self._marks
        ]
        return Trace(
            self.source,
            _finish(events, self._marks, self._t0_ns),
            truncated=len(raw) >= MAX_ENTRIES,
        )

    def _event(self, entry: dict[str, Any]) -> Event:
        action = str(entry.get("action", ""))
        time_us = entry.get("time_us")
        event: Event = {
            "t_us": (time_us - self._t0_ns / 1000) if time_us is not None else None,
            "action": _CUDA_ACTIONS.get(action, action),
            "addr": entry.get("addr"),
            "size": int(entry.get("size") or 0),
            "device": f"cuda:{self._index}",
            "stream": entry.get("stream"),
        }
        if self._stacks:
            event["frames"] = [
                {
                    "filename": f.get("filename", ""),
                    "line": int(f.get("line", 0)),
                    "name": f.get("name", ""),
                }
                for f in (entry.get("frames") or [])[:MAX_FRAMES]
            ]
        return event


class CpuProfilerTracer:
    """The profiler's memory events: the CPU allocator's allocs and frees, with pointers."""

    source = "cpu_profiler"

    def __init__(self, t0_ns: int, stacks: bool) -> None:
        self._t0_ns = t0_ns
        self._stacks = stacks
        self._prof: torch.profiler.profile | None = None

    def start(self) -> None:
        # Kineto, the profiler's C++ side, writes a `USDT:` line to stderr at each start and
        # stop: two per experiment in the worker's log. Their severity is kineto's highest,
        # so only a level above every one (6) drops them; read when the process first
        # profiles. Errors of this CPU-only profiling surface here in Python (stop raises).
        # A KINETO_LOG_LEVEL set for the worker wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            profile_memory=True,
            with_stack=self._stacks,
        )
        self._prof.start()

    def phase(self, name: str) -> AbstractContextManager[None]:
        # A profiler range: its start time is on the same clock as the memory events,
        # so phase boundaries are exact.
        return torch.profiler.record_function(_RANGE_PREFIX + name)

    def stop(self) -> Trace:
        if self._prof is None:
            return Trace(self.source)
        with warnings.catch_warnings():
            # "Profiler clears events at the end of each cycle": about schedules, not ours.
            warnings.simplefilter("ignore", UserWarning)
            self._prof.stop()
        results = getattr(self._prof.profiler, "kineto_results", None)
        if results is None or not hasattr(results, "experimental_event_tree"):
            raise RuntimeError(
                "this torch's profiler exposes no event tree; cannot read CPU memory events"
            )
        events: list[Event] = []
        marks: list[tuple[str, int]] = []
        ranges: list[tuple[str, float, float]] = []
        alloc_tag = torch._C._profiler._EventType.Allocation
        for node in _walk(results.experimental_event_tree()):
            if node.tag == alloc_tag:
                events.append(self._event(node))
            elif node.tag == torch._C._profiler._EventType.TorchOp:
                name = _safe_name(node)
                if name.startswith(_RANGE_PREFIX):
                    marks.append((name[len(_RANGE_PREFIX) :], node.start_time_ns))
                elif name.startswith(SECTION_PREFIX):
                    ranges.append(
                        (
                            name,
                            (node.start_time_ns - self._t0_ns) / 1000,
                            (node.end_time_ns - self._t0_ns) / 1000,
                        )
                    )
        events += [_mark(name, (t - self._t0_ns) / 1000, "cpu") for name, t in marks]
        ranges.sort(key=lambda r: r[1])
        return Trace(self.source, _finish(events, marks, self._t0_ns), sections=ranges)

    def _event(self, node: Any) -> Event:
        fields = node.extra_fields
        size = int(fields.alloc_size)
        event: Event = {
            "t_us": (node.start_time_ns - self._t0_ns) / 1000,
            "action": "alloc" if size >= 0 else "free",
            "addr": int(fields.ptr),
            "size": abs(size),
            "device": _device_name(fields.device),
            "stream": None,
        }
        if self._stacks:
            event["frames"] = _python_frames(node)
        return event


def make_tracer(device: str, trace: str, t0_ns: int, backend: str = "native") -> Tracer:
    """The tracer for a spec. The CPU always profiles: its figures come from the events."""
    stacks = trace == "stacks"
    if device.startswith("cuda"):
        # cudaMallocAsync keeps no allocation history: the figures come from counters.
        if trace == "none" or backend == "cudaMallocAsync":
            return NullTracer()
        return CudaHistoryTracer(int(device.partition(":")[2] or 0), t0_ns, stacks)
    return CpuProfilerTracer(t0_ns, stacks)


def write_events(path: Path, events: Iterable[Event]) -> int:
    """Write events as gzip NDJSON, one event a line; return how many."""
    count = 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as out:
        for event in events:
            out.write(json.dumps(event, separators=(",", ":")))
            out.write("\n")
            count += 1
    return count


def _finish(events: list[Event], marks: list[tuple[str, int]], t0_ns: int) -> list[Event]:
    """Order events in time, number them and label each with the phase it fell in."""
    bounds = sorted(((t - t0_ns) / 1000, name) for name, t in marks)
    events.sort(key=lambda e: (e["t_us"] is None, e["t_us"] or 0.0, e["action"] != "mark"))
    ordered: list[Event] = []
    for seq, event in enumerate(events):
        phase = PHASES[0]
        if event["action"] == "mark":
            phase = event["name"]
        else:
            for start, name in bounds:
                if event["t_us"] is not None and event["t_us"] >= start:
                    phase = name
        # Keys in the schema's order, so a line of the NDJSON reads easily.
        ordered.append(
            {
                "seq": seq,
                **{k: event[k] for k in _KEYS},
                "phase": phase,
                **{k: event[k] for k in ("name", "frames") if k in event},
            }
        )
    return ordered


def _mark(name: str, t_us: float, device: str) -> Event:
    return {
        "t_us": t_us,
        "action": "mark",
        "name": name,
        "addr": None,
        "size": 0,
        "device": device,
        "stream": None,
    }


def _walk(nodes: Iterable[Any]) -> Iterator[Any]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _safe_name(node: Any) -> str:
    # Some nodes' names are not valid UTF-8 (seen with stacks on torch 2.13).
    try:
        return str(node.name)
    except UnicodeDecodeError:
        return ""


def _python_frames(node: Any) -> list[dict[str, Any]]:
    """The Python frames that enclose an allocation, innermost first (as CUDA's are)."""
    frames: list[dict[str, Any]] = []
    py_call = torch._C._profiler._EventType.PyCall
    parent = node.parent
    while parent is not None and len(frames) < MAX_FRAMES:
        if parent.tag == py_call:
            match = _PY_FRAME.match(_safe_name(parent))
            if match:
                frames.append(
                    {"filename": match["file"], "line": int(match["line"]), "name": match["name"]}
                )
        parent = parent.parent
    return frames


def _device_name(device: Any) -> str:
    try:
        return canonical_device(str(device))
    except ValueError:  # a device vramlab does not run on (meta, ...): as torch names it
        return str(device)
