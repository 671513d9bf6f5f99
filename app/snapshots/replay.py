"""Pass one over a snapshot's entries: allocated and reserved bytes after each, the peak,
the largest blocks, and a timeline reduced to about ``TIMELINE_POINTS`` points."""

import heapq
from typing import TYPE_CHECKING, Any

from app.snapshots.blocks import Blocks
from app.snapshots.load import GROWS, SHRINKS, as_int, block_size

if TYPE_CHECKING:
    from app.snapshots.entries import Trace

TOP = 20
TIMELINE_POINTS = 2000
# Entries that change neither allocated nor reserved bytes.
SILENT = frozenset({"free_requested", "snapshot", "oom"})


class Replay:
    """Pass one: allocated and reserved after each entry, the peak, the largest blocks."""

    def __init__(self, baseline: int, reserved: int, blocks: Blocks | None = None) -> None:
        self.blocks = blocks if blocks is not None else Blocks()
        # Entry index -> block size, where the allocator's block was larger than the
        # request rounded up (``blocks``): the walk counts the same blocks.
        self.sizes: dict[int, int] = {}
        self.allocated = baseline
        self.reserved = reserved
        self.peak = baseline
        self.peak_index = -1
        self.peak_reserved = reserved
        self.reserved_peak = reserved
        self.live: dict[Any, int] = {}
        self.largest: list[tuple[int, int]] = []  # min-heap of (size, -index)
        self.kept: dict[int, tuple[Any, Any, int]] = {}  # index -> addr, time_us, stack
        self.peak_time: Any = None  # the peak entry's time_us
        self.points: list[tuple[float, int, int]] = []  # (t, allocated, reserved)

    def run(self, trace: "Trace", pre_blocks: list[dict[str, Any]], t0: float | None) -> None:
        """Replay; with ``t0`` (the first entry's time_us) times are microseconds from it,
        else entry numbers. Keeps about ``TIMELINE_POINTS`` points for the timeline:
        each bucket's lowest and highest moment, so peaks and dips survive."""
        live = self.live
        for b in pre_blocks:
            live[b["addr"]] = b["size"]
        per = max(1, -(-len(trace) // (TIMELINE_POINTS // 2)))
        points = self.points
        points.append((0.0, self.allocated, self.reserved))
        lo: tuple[float, int, int] | None = None
        hi: tuple[float, int, int] | None = None
        n = 0
        t = 0.0
        for i, (action, addr, size, _, time_us, _, sid, _) in enumerate(trace):
            if action in SILENT:
                continue
            if t0 is None:
                t = float(i)
            elif type(time_us) in (int, float):
                t = time_us - t0
            self._apply(i, action, addr, size, time_us, sid)
            point = (t, self.allocated, self.reserved)
            if lo is None or point[1] < lo[1]:
                lo = point
            if hi is None or point[1] > hi[1]:
                hi = point
            n += 1
            if n >= per:
                points.extend(sorted({lo, hi}, key=lambda p: p[0]))
                lo = hi = None
                n = 0
        if lo is not None and hi is not None:
            points.extend(sorted({lo, hi}, key=lambda p: p[0]))

    def _apply(self, i: int, action: str, addr: Any, size: Any, time_us: Any, sid: int) -> None:
        live = self.live
        if action == "alloc":
            asked = as_int(size, "size")
            size = self.blocks.alloc(addr, asked)
            if size != block_size(asked):
                self.sizes[i] = size
            live[addr] = size
            self.allocated += size
            if self.allocated > self.peak:
                self.peak = self.allocated
                self.peak_index = i
                self.peak_reserved = self.reserved
                self.peak_time = time_us
            item = (size, -i)
            if len(self.largest) < TOP:
                heapq.heappush(self.largest, item)
                self.kept[i] = (addr, time_us, sid)
            elif item > self.largest[0]:
                gone = heapq.heapreplace(self.largest, item)
                del self.kept[-gone[1]]
                self.kept[i] = (addr, time_us, sid)
        elif action == "free_completed":
            freed = live.pop(addr, None)
            self.blocks.free(addr)
            if freed is not None:
                self.allocated -= freed
        elif action in GROWS:
            self.reserved += as_int(size, "size")
            self.reserved_peak = max(self.reserved_peak, self.reserved)
            if action == "segment_alloc":
                self.blocks.segment(addr, as_int(size, "size"))
            else:  # pages mapped into an expandable segment
                self.blocks.expandable()
        elif action in SHRINKS:
            self.reserved = max(0, self.reserved - as_int(size, "size"))
            if action == "segment_free":
                self.blocks.segment_gone(addr)
            else:
                self.blocks.expandable()
