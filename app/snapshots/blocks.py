"""The caching allocator's block for each allocation of a trace: what
``torch.cuda.memory_allocated`` counts, which can be more than the request rounded up.

The trace records the size asked for. The allocator rounds it up to 512 bytes and takes
the start of a free block; a request of the large pool (more than 1 MiB) splits the rest
off only if more than 1 MiB remains (and never at or above ``max_split_size``), so its
block keeps up to 1 MiB more than asked. The free block an allocation took runs from its
address to the next live block of its segment, or the segment's end (the allocator merges
free neighbours), so the segments' addresses and sizes and the live blocks' addresses
tell how large each block was. Where they cannot (expandable segments, which map and
unmap pages; an address in no known segment), a block is the request rounded up.
"""

from bisect import bisect_right, insort
from typing import Any

from app.snapshots.load import block_size

SMALL = 2**20  # the allocator's kSmallSize: requests up to it come from the small pool


class Blocks:
    """Segments (start -> size, with their live blocks' starts in order) and where each
    live block is."""

    def __init__(self, max_split: int | None = None) -> None:
        self.starts: list[int] = []
        self.segments: dict[int, tuple[int, list[int]]] = {}
        self.where: dict[Any, int] = {}  # a live block's address -> its segment's start
        self.max_split = max_split if max_split is not None and max_split > 0 else None
        self.exact = True  # false once pages are mapped (expandable segments)

    def segment(self, addr: Any, size: int) -> None:
        if type(addr) is not int or addr in self.segments:
            return
        self.segments[addr] = (size, [])
        insort(self.starts, addr)

    def segment_gone(self, addr: Any) -> None:
        if self.segments.pop(addr, None) is not None:
            self.starts.remove(addr)

    def expandable(self) -> None:
        self.exact = False

    def _segment_of(self, addr: int) -> int | None:
        i = bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        return start if addr < start + self.segments[start][0] else None

    def alive(self, addr: Any) -> None:
        """A block alive before the trace began."""
        if type(addr) is int:
            start = self._segment_of(addr)
            if start is not None:
                insort(self.segments[start][1], addr)
                self.where[addr] = start

    def alloc(self, addr: Any, asked: int) -> int:
        """The block an allocation of ``asked`` bytes at ``addr`` took."""
        size = block_size(asked)
        if size <= SMALL or type(addr) is not int:
            # The small pool's segments hold small blocks only, which are always split:
            # nothing to follow (and most allocations cost nothing here).
            return size
        start = self._segment_of(addr)
        if start is None:
            return size
        seg_size, live = self.segments[start]
        if self.exact:
            j = bisect_right(live, addr)
            end = live[j] if j < len(live) else start + seg_size
            unsplit = self.max_split is not None and size >= self.max_split
            if end - addr > size and (unsplit or end - addr - size <= SMALL):
                size = end - addr
        insort(live, addr)
        self.where[addr] = start
        return size

    def free(self, addr: Any) -> None:
        start = self.where.pop(addr, None)
        if start is not None and start in self.segments:
            live = self.segments[start][1]
            i = bisect_right(live, addr) - 1
            if i >= 0 and live[i] == addr:
                del live[i]


def max_split_size(settings: Any) -> int | None:
    """``max_split_size`` from a snapshot's ``allocator_settings`` (None: unlimited)."""
    if type(settings) is not dict:
        return None
    value = settings.get("max_split_size")
    return value if type(value) is int and value > 0 else None
