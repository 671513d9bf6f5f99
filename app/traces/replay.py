"""Replaying a stored trace event by event: allocated and reserved bytes, the blocks alive
at any moment, the peak. (Bytes over time, for figures, are ``bands.build``'s.)

Memory stays bounded by what is alive at once (live blocks and segments), never by the
trace's length: events come from ``traces.iter_events`` one chunk at a time.
"""

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]

FREES = ("free", "free_completed")
SEGMENT_GROWS = ("segment_alloc", "segment_map")
SEGMENT_SHRINKS = ("segment_free", "segment_unmap")


@dataclass(frozen=True)
class Block:
    """One allocation: where and when it was made, and by what (frames, if recorded)."""

    addr: int | None
    size: int
    seq: int
    t_us: float
    phase: str | None
    stream: Any = None
    frames: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "addr": self.addr,
            "size": self.size,
            "seq": self.seq,
            "t_us": self.t_us,
            "phase": self.phase,
            "frames": list(self.frames),
        }


@dataclass
class Replay:
    """The allocator's state after each event it is fed."""

    allocated: int = 0
    reserved: int = 0
    t_us: float = 0.0
    index: int = -1  # position of the last event fed
    phase: str | None = None
    has_segments: bool = False  # only CUDA traces record segments (reserved bytes)
    live: dict[Any, Block] = field(default_factory=dict)
    segments: dict[int, tuple[int, Any]] = field(default_factory=dict)

    def feed(self, event: Event) -> bool:
        """Apply one event; True when allocated or reserved bytes changed."""
        self.index += 1
        if event.get("t_us") is not None:
            self.t_us = float(event["t_us"])
        action = event.get("action")
        size = int(event.get("size") or 0)
        addr = event.get("addr")
        if action == "mark":
            self.phase = event.get("name") or event.get("phase")
            return False
        if action == "alloc":
            key = addr if addr is not None else ("seq", self.index)
            self.live[key] = Block(
                addr=addr,
                size=size,
                seq=int(event.get("seq", self.index)),
                t_us=self.t_us,
                phase=event.get("phase") or self.phase,
                stream=event.get("stream"),
                frames=tuple(event.get("frames") or ()),
            )
            self.allocated += size
            return True
        if action in FREES:
            # A free of a block allocated before the trace began changes nothing we know.
            block = self.live.pop(addr, None)
            if block is None:
                return False
            self.allocated -= block.size
            return True
        if action in SEGMENT_GROWS:
            self.has_segments = True
            if addr is not None:
                self.segments[int(addr)] = (size, event.get("stream"))
            self.reserved += size
            return True
        if action in SEGMENT_SHRINKS:
            self.has_segments = True
            if addr is not None:
                self.segments.pop(int(addr), None)
            self.reserved = max(0, self.reserved - size)
            return True
        return False


@dataclass(frozen=True)
class PeakPoint:
    index: int  # position in the trace of the event that reached the peak
    seq: int | None
    t_us: float
    allocated: int
    reserved: int | None
    phase: str | None


def find_peak(
    events: Iterable[Event], top: int = 10
) -> tuple[PeakPoint | None, list[Block], int, bool]:
    """One pass: the first moment of highest allocated, the ``top`` largest allocations,
    the number of events, and whether reserved bytes were known."""
    replay = Replay()
    peak: PeakPoint | None = None
    largest: list[tuple[int, int, Block]] = []  # a min-heap of (size, -seq, block)
    for event in events:
        changed = replay.feed(event)
        if event.get("action") == "alloc":
            block = replay.live.get(event.get("addr"), None)
            if block is not None:
                item = (block.size, -block.seq, block)
                if len(largest) < top:
                    heapq.heappush(largest, item)
                elif item[:2] > largest[0][:2]:
                    heapq.heapreplace(largest, item)
        if changed and (peak is None or replay.allocated > peak.allocated):
            peak = PeakPoint(
                index=replay.index,
                seq=event.get("seq"),
                t_us=replay.t_us,
                allocated=replay.allocated,
                reserved=replay.reserved if replay.has_segments else None,
                phase=event.get("phase") or replay.phase,
            )
    blocks = [b for _, _, b in sorted(largest, key=lambda i: i[:2], reverse=True)]
    return peak, blocks, replay.index + 1, replay.has_segments


def alive_at(events: Iterable[Event], index: int) -> list[Block]:
    """The blocks alive just after event ``index``, largest first."""
    replay = Replay()
    for event in events:
        replay.feed(event)
        if replay.index >= index:
            break
    return sorted(replay.live.values(), key=lambda b: (-b.size, b.seq))
