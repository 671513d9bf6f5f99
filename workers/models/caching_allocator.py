"""A model of PyTorch's CUDA caching allocator: what a sequence of allocations and frees
makes it reserve, and whether the sequence fits under a limit. Pure Python, torch-free.

The rules are PyTorch's own (c10/cuda/CUDACachingAllocator.cpp, 2.11 to 2.13), with no
constant fitted to measurements:

- A request is rounded up to 512 bytes (or, with ``roundup_power2_divisions``, to the
  next division of its power-of-two interval). Up to 1 MiB it is served from the small
  pool, whose segments are 2 MiB; above, from the large pool, whose segments are 20 MiB
  for requests under 10 MiB and the request rounded up to 2 MiB otherwise.
- A free block is found best-fit: the smallest at least as large, the lowest address
  among equals, in the request's pool and stream. A block larger than the request is
  split when the rest is at least 512 bytes (small pool, expandable segments) or more
  than 1 MiB (large pool, and only for requests under ``max_split_size``). A freed
  block merges with free neighbours of its segment.
- With ``max_split_size``, blocks at least that large are never split; a request under
  it never takes one, and a request at or over it takes one only if it wastes less than
  ``max_non_split_rounding`` (20 MiB).
- With ``expandable_segments``, each pool and stream has one segment of address space
  that is mapped in pages (2 MiB small, 20 MiB large) at its lowest free addresses, and
  grows instead of making a new segment.
- When no free block fits, a new segment is asked for. Past the limit (a memory
  fraction: reserved plus the new segment's size over it; or the device's free memory),
  the allocator frees oversize cached blocks (``max_split_size``) and retries, then every
  cached segment that holds nothing (unmapping empty pages of expandable segments) and
  retries once more; then it is out of memory. ``garbage_collection_threshold`` (with a
  fraction) first frees the oldest unsplit cached segments above the threshold.

Not modelled: CUDA events of blocks used on other streams (``record_stream``), CUDA
graphs' private pools and the ``cudaMallocAsync`` backend. Where the driver places a
segment is not the allocator's choice: ``addresses`` says (by default, each after the
last); it only orders equal-sized free blocks of different segments.
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MiB = 2**20
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest small-pool request
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment, and its expandable page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: requests under it share 20 MiB segments
ROUND_LARGE = 2 * MiB  # kRoundLarge
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: a shared large segment, and its expandable page
INTERVALS = 16  # roundup_power2_divisions' intervals: 1 MiB, 2 MiB, ... 32 GiB and above
UNLIMITED = 2**64 - 1


class OutOfMemory(Exception):
    """The allocator could not serve a request under its limit, even after releasing."""

    def __init__(self, size: int, reserved: int, allocated: int) -> None:
        super().__init__(f"out of memory asking for {size} bytes (reserved {reserved})")
        self.size, self.reserved, self.allocated = size, reserved, allocated


@dataclass(frozen=True)
class Settings:
    """The allocator settings that change what is reserved (PYTORCH_CUDA_ALLOC_CONF)."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0

    @classmethod
    def from_spec(cls, allocator: Mapping[str, Any] | None) -> Settings:
        """From a spec's ``allocator`` (keys as PYTORCH_CUDA_ALLOC_CONF spells them)."""
        allocator = allocator or {}
        split = allocator.get("max_split_size_mb")
        rounding = allocator.get("max_non_split_rounding_mb")
        divisions = allocator.get("roundup_power2_divisions")
        return cls(
            max_split_size=int(split) * MiB if split else UNLIMITED,
            max_non_split_rounding=int(rounding) * MiB if rounding else LARGE_BUFFER,
            roundup_power2_divisions=_divisions(divisions),
            expandable_segments=bool(allocator.get("expandable_segments") or False),
            garbage_collection_threshold=float(
                allocator.get("garbage_collection_threshold") or 0.0
            ),
        )

    @classmethod
    def from_conf(cls, conf: str) -> Settings:
        """From a PYTORCH_CUDA_ALLOC_CONF string."""
        values: dict[str, Any] = {}
        for key, value in re.findall(r"(\w+):(\[[^\]]*\]|[^,]*)", conf or ""):
            value = value.strip()
            if key == "expandable_segments":
                values[key] = value.lower() == "true"
            elif key == "garbage_collection_threshold":
                values[key] = float(value)
            elif key == "roundup_power2_divisions":
                values[key] = value
            elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                values[key] = int(value)
        return cls.from_spec(values)

    @classmethod
    def from_snapshot(cls, settings: Mapping[str, Any] | None) -> Settings:
        """From a memory snapshot's ``allocator_settings``."""
        settings = settings or {}
        split = settings.get("max_split_size")
        divisions = settings.get("roundup_power2_divisions")
        per_interval = (0,) * INTERVALS
        if isinstance(divisions, Mapping):  # {"1": d, "2": d, ... "32768": d} by MiB
            ordered = sorted(
                ((int(k), int(v)) for k, v in divisions.items() if str(k).isdigit()),
            )
            per_interval = tuple(v for _, v in ordered[:INTERVALS]) + (0,) * max(
                0, INTERVALS - len(ordered)
            )
        return cls(
            max_split_size=int(split) if isinstance(split, int) and split > 0 else UNLIMITED,
            roundup_power2_divisions=per_interval,
            expandable_segments=bool(settings.get("expandable_segments") or False),
            garbage_collection_threshold=float(settings.get("garbage_collection_threshold") or 0),
        )


def _divisions(value: Any) -> tuple[int, ...]:
    """roundup_power2_divisions as one count per interval: an int for all, or PyTorch's
    list form ``[256:1,512:2,>:4]`` (MiB: the divisions from that size up)."""
    if value is None or value == "":
        return (0,) * INTERVALS
    if isinstance(value, int) or str(value).strip().isdigit():
        return (int(value),) * INTERVALS
    out = [0] * INTERVALS
    first, last = True, 0
    for key, count in re.findall(r"([>\d]+)\s*:\s*(\d+)", str(value)):
        if key == ">":
            out[last + 1 :] = [int(count)] * (INTERVALS - last - 1)
            continue
        index = min(max(int(key).bit_length() - 1, 0), INTERVALS - 1)
        if first:
            out[:index] = [int(count)] * index
            first = False
        out[index] = int(count)
        last = index
    return tuple(out)


def round_size(size: int, divisions: tuple[int, ...] = (0,) * INTERVALS) -> int:
    """The block size the allocator uses for a request of ``size`` bytes."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    index = min(max(size.bit_length() - 1 - 20, 0), INTERVALS - 1)
    d = divisions[index]
    if d > 1 and size > MIN_BLOCK * d:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (d.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment a rounded request asks the driver for when no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Segment:
    """An expandable segment: address space mapped in pages."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int) -> None:
        self.base, self.page, self.size = base, page, size


class Block:
    __slots__ = (
        "allocated",
        "expandable",
        "gc_base",
        "mapped",
        "next",
        "prev",
        "ptr",
        "requested",
        "size",
        "small",
        "stream",
    )

    def __init__(
        self, ptr: int, size: int, stream: int, small: bool, expandable: _Segment | None = None
    ) -> None:
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.small = small
        self.allocated = False
        self.mapped = True
        self.prev: Block | None = None
        self.next: Block | None = None
        self.expandable = expandable
        self.requested = 0
        self.gc_base = 0

    @property
    def split(self) -> bool:
        return self.prev is not None or self.next is not None


Addresses = Callable[[str, int], int]  # (kind: "segment" | "expandable", bytes) -> address


def bump_addresses(start: int = 0x7F0000000000, align: int = LARGE_BUFFER) -> Addresses:
    """Each new segment above the last (the driver's placement is not modelled)."""
    top = [start]

    def place(kind: str, size: int) -> int:
        base = -(-top[0] // align) * align
        top[0] = base + size
        return base

    return place


@dataclass
class SegmentEvent:
    action: str  # segment_alloc, segment_free, segment_map, segment_unmap, oom
    addr: int
    size: int


@dataclass
class CachingAllocator:
    """One device's caching allocator. ``fraction_limit``: bytes the allocator may
    reserve (``set_per_process_memory_fraction``: reserved plus a new segment's size must
    stay within it); ``device_limit``: bytes the driver can still give (cudaMalloc and
    page maps fail past it). ``device_total``: the card's memory, which sizes an
    expandable segment's address space."""

    settings: Settings = field(default_factory=Settings)
    fraction_limit: int | None = None
    device_limit: int | None = None
    device_total: int = 80 * 2**30
    addresses: Addresses = field(default_factory=bump_addresses)
    record: bool = False

    def __post_init__(self) -> None:
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.events: list[SegmentEvent] = []
        # Free mapped blocks by (small, stream): sorted (size, ptr, block).
        self._free: dict[tuple[bool, int], list[tuple[int, int, Block]]] = {}
        # Unmapped address space of expandable segments by (small, stream): (ptr, block).
        self._unmapped: dict[tuple[bool, int], list[tuple[int, int, Block]]] = {}
        self._gc_calls = {True: 0, False: 0}
        s = self.settings
        self._divisions = s.roundup_power2_divisions
        self._rounds = any(d > 1 for d in self._divisions)
        self._gc = s.garbage_collection_threshold > 0 and self.fraction_limit is not None

    # -- the allocator's public calls ----------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """Serve a request of ``nbytes`` on ``stream``; OutOfMemory if it cannot."""
        if self._rounds:
            size = round_size(nbytes, self._divisions)
        else:
            size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        block = self._get_free_block(small, stream, size)
        if block is None:
            alloc_size = segment_size(size)
            if self._gc:
                self._garbage_collect()
            block = self._alloc_block(small, stream, size, alloc_size)
            if block is None and self._release_available(small, stream, size):
                block = self._alloc_block(small, stream, size, alloc_size)
            if block is None:
                self.empty_cache()
                self.num_alloc_retries += 1
                block = self._alloc_block(small, stream, size, alloc_size)
            if block is None:
                self.num_ooms += 1
                if self.record:
                    self.events.append(SegmentEvent("oom", 0, size))
                raise OutOfMemory(size, self.reserved, self.allocated)
        remaining = block.size - size
        if small or self.settings.expandable_segments:
            split = remaining >= MIN_BLOCK
        else:
            split = size < self.settings.max_split_size and remaining > SMALL_SIZE
        if split:
            rest = block
            block = Block(rest.ptr, size, stream, small, rest.expandable)
            block.prev = rest.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = rest
            rest.prev = block
            rest.ptr += size
            rest.size -= size
            self._insert(rest)
        block.allocated = True
        block.requested = nbytes
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: Block) -> None:
        """Return a block to its pool, merged with its free neighbours."""
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            self._merge(block, neighbour)
        self._insert(block)

    def empty_cache(self) -> None:
        """Release every cached segment that holds nothing (and unmap empty pages)."""
        for small in (False, True):
            to_unmap: list[Block] = []
            for key in sorted(k for k in self._free if k[0] == small):
                for _, _, b in list(self._free.get(key, ())):
                    if b.expandable is not None:
                        to_unmap.append(b)
                    elif b.prev is None and b.next is None:
                        self._release_block(b)
            for b in to_unmap:
                self._unmap_block(b)
                if b.prev is None and b.next is None and not b.mapped:
                    self._remove(self._unmapped, b)

    # -- finding a block -----------------------------------------------------------------

    def _get_free_block(self, small: bool, stream: int, size: int) -> Block | None:
        if self._gc:
            self._gc_calls[small] += 1
        blocks = self._free.get((small, stream))
        if not blocks:
            return None
        i = bisect_left(blocks, (size,))
        if i == len(blocks):
            return None
        block = blocks[i][2]
        if block.expandable is not None:
            if self.settings.expandable_segments:
                # A free block at a segment's mapped end can grow: its size for best fit
                # counts the unmapped space after it.
                while block.expandable is not None and i + 1 < len(blocks):
                    following = blocks[i + 1][2]
                    if _expandable_size(following) >= _expandable_size(block):
                        break
                    i += 1
                    block = following
            else:
                i += 1
                while i < len(blocks) and blocks[i][2].expandable is not None:
                    i += 1
                if i == len(blocks):
                    return None
                block = blocks[i][2]
        limit = self.settings.max_split_size
        if size < limit and block.size >= limit:
            return None
        if size >= limit and block.size >= size + self.settings.max_non_split_rounding:
            return None
        del blocks[i]
        return block

    # -- asking the driver ---------------------------------------------------------------

    def _alloc_block(self, small: bool, stream: int, size: int, alloc_size: int) -> Block | None:
        if self.fraction_limit is not None and self.reserved + alloc_size > self.fraction_limit:
            return None
        if self.settings.expandable_segments:
            return self._alloc_expandable(small, stream, size)
        if self.device_limit is not None and self.reserved + alloc_size > self.device_limit:
            return None
        ptr = self.addresses("segment", alloc_size)
        self._grow(alloc_size)
        self.num_device_alloc += 1
        if self.record:
            self.events.append(SegmentEvent("segment_alloc", ptr, alloc_size))
        return Block(ptr, alloc_size, stream, small)

    def _alloc_expandable(self, small: bool, stream: int, size: int) -> Block | None:
        candidate = self._find_expandable(small, stream, size)
        if candidate is None:
            return None
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None
            if not self._map(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        self._remove(self._free, candidate)
        return candidate

    def _find_expandable(self, small: bool, stream: int, size: int) -> Block | None:
        for _, _, block in self._unmapped.get((small, stream), ()):
            start = block
            if _allocatable(block.prev):
                assert block.prev is not None
                start = block.prev
            total = 0
            b: Block | None = start
            while total < size and b is not None and not b.allocated:
                total += b.size
                b = b.next
            if total >= size:
                return start
        page = SMALL_BUFFER if small else LARGE_BUFFER
        reserve = self.device_total + self.device_total // 8
        space = -(-reserve // page) * page
        if space < size:
            return None
        segment = _Segment(self.addresses("expandable", space), page, space)
        block = Block(segment.base, space, stream, small, segment)
        block.mapped = False
        insort(self._unmapped.setdefault((small, stream), []), (block.ptr, 0, block))
        return block

    def _map(self, block: Block, size: int) -> bool:
        segment = block.expandable
        assert segment is not None and not block.mapped
        page = segment.page
        begin = (block.ptr - segment.base) // page
        end = -(-(block.ptr + size - segment.base) // page)
        mapped = (end - begin) * page
        if self.device_limit is not None and self.reserved + mapped > self.device_limit:
            return False
        self._remove(self._unmapped, block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(
                block.ptr + mapped, block.size - mapped, block.stream, block.small, segment
            )
            rest.mapped = False
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            insort(self._unmapped.setdefault((block.small, block.stream), []), (rest.ptr, 0, rest))
            block.size = mapped
        self._merge(block, block.prev)
        self._merge(block, block.next)
        self._insert(block)
        self._grow(mapped)
        self.num_device_alloc += 1
        if self.record:
            self.events.append(SegmentEvent("segment_map", block.ptr, mapped))
        return True

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    # -- giving memory back --------------------------------------------------------------

    def _release_available(self, small: bool, stream: int, size: int) -> bool:
        """Free cached oversize blocks (``max_split_size``): one large enough, or the
        largest ones until their bytes reach the request."""
        limit = self.settings.max_split_size
        if limit == UNLIMITED:
            return False
        blocks = self._free.get((small, stream), [])
        key = max(size, limit)
        i = bisect_left(blocks, (key,))
        if i < len(blocks) and blocks[i][2].expandable is None:
            self._release_block(blocks[i][2])
            return True
        released, j = 0, i - 1
        while j >= 0 and released < key and blocks[j][0] >= limit:
            block = blocks[j][2]
            j -= 1
            if block.expandable is None:
                released += block.size
                self._release_block(block)
        return released >= key

    def _release_block(self, block: Block) -> None:
        self._remove(self._free, block)
        self.reserved -= block.size
        self.num_device_free += 1
        if self.record:
            self.events.append(SegmentEvent("segment_free", block.ptr, block.size))

    def _unmap_block(self, block: Block) -> None:
        segment = block.expandable
        assert segment is not None
        page, base = segment.page, segment.base
        begin = -(-(block.ptr - base) // page)
        end = (block.ptr + block.size - base) // page
        if begin >= end:
            return
        self._remove(self._free, block)
        start, size = base + begin * page, (end - begin) * page
        before = start - block.ptr
        if before > 0:
            head = Block(block.ptr, before, block.stream, block.small, segment)
            head.prev, head.next = block.prev, block
            if block.prev is not None:
                block.prev.next = head
            block.prev = head
            self._insert(head)
        after = block.size - before - size
        if after > 0:
            tail = Block(start + size, after, block.stream, block.small, segment)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            self._insert(tail)
        block.ptr, block.size, block.mapped = start, size, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        insort(self._unmapped.setdefault((block.small, block.stream), []), (block.ptr, 0, block))
        self.reserved -= size
        self.num_device_free += 1
        if self.record:
            self.events.append(SegmentEvent("segment_unmap", start, size))

    def _garbage_collect(self) -> None:
        """Free the oldest unsplit cached large segments while reserved is above the
        threshold share of the limit (ages: free-block searches since each was cached)."""
        assert self.fraction_limit is not None
        threshold = int(self.settings.garbage_collection_threshold * self.fraction_limit)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        calls = self._gc_calls[False]
        large = [b for key in sorted(self._free) if not key[0] for _, _, b in self._free[key]]
        candidates = [b for b in large if not b.split]
        if not candidates:
            return
        total_age = sum(calls - b.gc_base for b in candidates)
        count = len(candidates)
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for b in [b for key in sorted(self._free) if not key[0] for _, _, b in self._free[key]]:
                age = calls - b.gc_base
                if not b.split and b.expandable is None and age >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    # -- bookkeeping ---------------------------------------------------------------------

    def _insert(self, block: Block) -> None:
        block.gc_base = self._gc_calls[block.small]
        insort(
            self._free.setdefault((block.small, block.stream), []), (block.size, block.ptr, block)
        )

    @staticmethod
    def _remove(index: dict[tuple[bool, int], list[tuple[int, int, Block]]], block: Block) -> None:
        blocks = index[(block.small, block.stream)]
        key = (block.ptr, 0) if not block.mapped else (block.size, block.ptr)
        i = bisect_left(blocks, key)
        assert blocks[i][2] is block
        del blocks[i]

    def _merge(self, dst: Block, src: Block | None) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        self._remove(self._unmapped if not src.mapped else self._free, src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size


def _allocatable(block: Block | None) -> bool:
    return block is not None and not block.allocated


def _expandable_size(block: Block) -> int:
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)


@dataclass
class Replayed:
    """What replaying a sequence gave: the peaks, and whether it ran out of memory."""

    peak_allocated: int
    peak_reserved: int
    reserved: int
    oom: bool
    num_device_alloc: int
    num_alloc_retries: int


Event = tuple[int, int, int]  # (key, nbytes, stream) to allocate; (key, -1, 0) to free


def replay(events: Iterable[Event], allocator: CachingAllocator | None = None) -> Replayed:
    """Run ``events`` through ``allocator`` (a fresh default one if None). An event of
    nbytes 0 allocates nothing (as the allocator does for an empty tensor); freeing a key
    that was never allocated is ignored."""
    alloc = allocator if allocator is not None else CachingAllocator()
    live: dict[int, Block] = {}
    oom = False
    malloc, free = alloc.malloc, alloc.free
    try:
        for key, nbytes, stream in events:
            if nbytes > 0:
                live[key] = malloc(nbytes, stream)
            elif nbytes < 0:
                block = live.pop(key, None)
                if block is not None:
                    free(block)
    except OutOfMemory:
        oom = True
    return Replayed(
        peak_allocated=alloc.peak_allocated,
        peak_reserved=alloc.peak_reserved,
        reserved=alloc.reserved,
        oom=oom,
        num_device_alloc=alloc.num_device_alloc,
        num_alloc_retries=alloc.num_alloc_retries,
    )
