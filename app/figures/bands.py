"""Live allocations over time, the way PyTorch's memory viewer draws them: each large
allocation a band from its alloc to its free, stacked in the order they were made (a band
drops when one beneath it is freed), the many small ones grouped in one band on top.

A function of trace events (vramlab's one event schema: ``t_us``, ``action``, ``addr``,
``size``, ``phase``, ``frames``; phases are ``mark`` events), optional phases and names,
so any source of events (an experiment's trace, an imported snapshot) draws the same way.

One pass over the events, memory bounded by what is alive at once plus the bands kept
(never by the trace's length): the largest allocations so far are followed as candidate
bands (a larger one evicts the smallest), everything else is thinned to at most two points
per bucket of events (the lowest and the highest moment, so peaks survive).
"""

import heapq
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

from app.traces.replay import FREES, SEGMENT_GROWS, SEGMENT_SHRINKS, Event

MAX_BANDS = 120
BUCKETS = 800
MIN_FRACTION = 0.002  # allocations below this share of the peak are always grouped
_ROUNDING = 512  # the CUDA caching allocator rounds every block up to 512 bytes


@dataclass(frozen=True)
class Name:
    """What to call the allocations that match: made in ``phase``, of a tensor of
    ``size`` bytes (a block of that size after the allocator's rounding), still alive at
    the end (``lives``).
    Each name takes at most ``count`` allocations (0: any number); the first that
    matches wins, in the order given."""

    text: str
    phase: str | None = None
    size: int | None = None
    lives: bool | None = None
    count: int = 0

    def matches(self, alloc: "Alloc") -> bool:
        if self.phase is not None and alloc.phase != self.phase:
            return False
        if self.lives is not None and (alloc.end_us is None) != self.lives:
            return False
        if self.size is not None:
            # The allocator rounds a block up: to 512 bytes, or to a power-of-two division
            # where ``roundup_power2_divisions`` is set (at most twice the request).
            rounded = -(-max(self.size, 1) // _ROUNDING) * _ROUNDING
            if not self.size <= alloc.size <= 2 * rounded:
                return False
        return True


@dataclass(frozen=True)
class Phase:
    name: str
    start_us: float
    end_us: float


@dataclass
class Alloc:
    """One allocation kept as its own band."""

    index: int  # position of its alloc event in the trace
    size: int
    start_us: float
    phase: str | None
    frames: tuple[dict[str, Any], ...] = ()
    end_us: float | None = None  # None: still alive when the trace ends
    end_index: int | None = None
    name: str = ""
    # Allocated bytes just after its alloc and just after its free: where the group's
    # lower edge steps, exactly.
    total_at_start: int = 0
    total_at_end: int = 0
    reserved_at_start: int | None = None
    reserved_at_end: int | None = None
    addr: Any = None
    seq: int = -1  # its event's ``seq`` (the position where the event has none)


@dataclass(frozen=True)
class Point:
    """Allocated bytes from ``t_us`` on (after event ``index``); ``kept`` of them are in
    the kept bands."""

    t_us: float
    allocated: int
    kept: int
    reserved: int | None
    index: int = -1


@dataclass
class Timeline:
    start_us: float  # the first phase's start (set-up), or the first event
    end_us: float
    phases: list[Phase]
    allocs: list[Alloc]  # the bands, in the order they were made (the stacking order)
    points: list[Point]  # allocated over time, thinned
    peak: Point | None
    peak_phase: str | None
    peak_seq: int | None  # the ``seq`` of the event that reached the peak
    grouped: int  # allocations in the group band
    group_largest: int  # the largest of them
    events: int
    has_segments: bool = False
    marks: list[tuple[str, float]] = field(default_factory=list)
    # The largest allocations of all (up to ``max_bands``, largest first, the earliest of
    # equals first), whether or not they got a band.
    largest: list[Alloc] = field(default_factory=list)
    # What was alive just after the peak's event: the largest (as many), and how many.
    alive_at_peak: list[Alloc] = field(default_factory=list)
    alive_count: int = 0


@dataclass(frozen=True)
class _Live:
    """A block alive now, as the pass remembers it."""

    size: int
    index: int
    seq: int
    t_us: float
    phase: str | None
    frames: Any
    addr: Any

    def alloc(self) -> Alloc:
        frames = tuple(self.frames)
        return Alloc(
            self.index, self.size, self.t_us, self.phase, frames, addr=self.addr, seq=self.seq
        )


class _Thin:
    """At most two points per bucket of ``per`` events: the lowest and highest allocated."""

    def __init__(self, per: int) -> None:
        self._per = max(1, per)
        self._bucket = -1
        self._lo: Point | None = None
        self._hi: Point | None = None
        self.points: list[Point] = []

    def add(self, p: Point) -> None:
        bucket = p.index // self._per
        if bucket != self._bucket:
            self.flush()
            self._bucket = bucket
        if self._lo is None or p.allocated < self._lo.allocated:
            self._lo = p
        if self._hi is None or p.allocated > self._hi.allocated:
            self._hi = p

    def flush(self) -> None:
        if self._lo is not None and self._hi is not None:
            pair = sorted({id(self._lo): self._lo, id(self._hi): self._hi}.values(), key=_at)
            self.points += pair
        self._lo = self._hi = None


def _at(p: Point) -> int:
    return p.index


def build(
    events: Iterable[Event],
    names: Sequence[Name] = (),
    phases: Sequence[Phase] | None = None,
    total: int | None = None,
    max_bands: int = MAX_BANDS,
    buckets: int = BUCKETS,
) -> Timeline:
    """The bands of a trace, in one pass. ``total`` (the number of events, if known: a
    list's length otherwise) sizes the thinning; ``phases`` default to the trace's marks,
    each running to the next; ``names`` label the bands (an allocation no name matches
    is called after its phase)."""
    if total is None:
        total = len(events) if isinstance(events, Sized) else buckets * 256
    thin = _Thin(-(-total // max(1, buckets // 2)))
    live: dict[Any, _Live] = {}
    # Blocks alive at the peak so far that were freed since: with the blocks still live
    # and made before the peak, they are what was alive at the peak (no second pass).
    freed_since_peak: list[_Live] = []
    chosen: dict[int, Alloc] = {}  # the candidates: the largest so far
    heap: list[tuple[int, int]] = []  # min-heap of (size, -index) of the candidates
    marks: list[tuple[str, float]] = []
    allocated = reserved = n_events = 0
    has_segments = False
    n_allocs = skipped = 0  # allocations seen; the largest that is not a candidate
    t = 0.0
    first: float | None = None
    last: float | None = None
    phase: str | None = None
    peak: Point | None = None
    peak_phase: str | None = None
    peak_seq: int | None = None
    for index, event in enumerate(events):
        n_events += 1
        if event.get("t_us") is not None:
            t = float(event["t_us"])
            first = t if first is None or t < first else first
            last = t if last is None or t > last else last
        action = event.get("action")
        addr = event.get("addr")
        size = int(event.get("size") or 0)
        if action == "alloc":
            key = addr if addr is not None else ("index", index)
            replaced = live.get(key)  # a second alloc at a live address: the first is lost
            if replaced is not None and peak is not None and replaced.index <= peak.index:
                freed_since_peak.append(replaced)
            live[key] = _Live(
                size,
                index,
                int(event.get("seq", index)),
                t,
                event.get("phase") or phase,
                event.get("frames") or (),
                addr,
            )
            allocated += size
            n_allocs += 1
            item, candidate = (size, -index), True
            if len(heap) < max_bands:
                heapq.heappush(heap, item)
            elif max_bands and item > heap[0]:
                evicted = heapq.heapreplace(heap, item)
                chosen.pop(-evicted[1], None)
                skipped = max(skipped, evicted[0])
            else:
                candidate, skipped = False, max(skipped, size)
            if candidate:
                chosen[index] = Alloc(
                    index,
                    size,
                    t,
                    event.get("phase") or phase,
                    tuple(event.get("frames") or ()),
                    total_at_start=allocated,
                    reserved_at_start=reserved if has_segments else None,
                    addr=addr,
                    seq=int(event.get("seq", index)),
                )
        elif action in FREES:
            entry = live.pop(addr, None)
            if entry is None:
                continue  # allocated before the trace began: nothing we know changes
            allocated -= entry.size
            if peak is not None and entry.index <= peak.index:
                freed_since_peak.append(entry)
            kept = chosen.get(entry.index)
            if kept is not None:
                kept.end_us, kept.end_index, kept.total_at_end = t, index, allocated
                kept.reserved_at_end = reserved if has_segments else None
        elif action in SEGMENT_GROWS or action in SEGMENT_SHRINKS:
            has_segments = True
            reserved = reserved + size if action in SEGMENT_GROWS else max(0, reserved - size)
        elif action == "mark":
            phase = event.get("name") or event.get("phase")
            marks.append((str(phase or ""), t))
            continue
        else:
            continue
        point = Point(t, allocated, 0, reserved if has_segments else None, index)
        if peak is None or allocated > peak.allocated:
            peak, peak_phase, peak_seq = point, event.get("phase") or phase, event.get("seq")
            freed_since_peak = []
        thin.add(point)
    thin.flush()
    alive = freed_since_peak
    if peak is not None:
        alive += [b for b in live.values() if b.index <= peak.index]

    marks.sort(key=lambda m: m[1])
    known = [t for _, t in marks] + ([first] if first is not None else [])
    start = min(known, default=0.0)
    end = max(last if last is not None else start, start)
    if phases is None:
        bounds = [t for _, t in marks[1:]] + [end]
        phases = [Phase(n, t, max(t, b)) for (n, t), b in zip(marks, bounds, strict=False)]
    floor = int((peak.allocated if peak else 0) * MIN_FRACTION)
    allocs = sorted((a for a in chosen.values() if a.size > 0 and a.size >= floor), key=_start)
    skipped = max([skipped] + [a.size for a in chosen.values() if a.size < max(floor, 1)])
    _name(allocs, names)
    return Timeline(
        start_us=start,
        end_us=end,
        phases=list(phases),
        allocs=allocs,
        points=_with_kept(thin.points, allocs, start, has_segments),
        peak=peak,
        peak_phase=peak_phase,
        peak_seq=peak_seq,
        grouped=n_allocs - len(allocs),
        group_largest=skipped,
        events=n_events,
        has_segments=has_segments,
        marks=marks,
        alive_at_peak=[
            b.alloc()
            for b in heapq.nsmallest(max(max_bands, 1), alive, key=lambda b: (-b.size, b.seq))
        ],
        alive_count=len(alive),
        largest=sorted(
            (a for a in chosen.values() if a.addr is not None), key=lambda a: (-a.size, a.seq)
        ),
    )


def _start(a: Alloc) -> int:
    return a.index


def _with_kept(
    thinned: list[Point], allocs: list[Alloc], start: float, has_segments: bool
) -> list[Point]:
    """The thinned points, plus one at each kept band's alloc and free (where the group's
    lower edge steps), each with the bytes of the kept bands alive then."""
    points = {p.index: p for p in thinned}
    for a in allocs:
        points[a.index] = Point(a.start_us, a.total_at_start, 0, a.reserved_at_start, a.index)
        if a.end_index is not None and a.end_us is not None:
            points[a.end_index] = Point(a.end_us, a.total_at_end, 0, a.reserved_at_end, a.end_index)
    steps = sorted(
        [(a.index, a.size) for a in allocs]
        + [(a.end_index, -a.size) for a in allocs if a.end_index is not None]
    )
    out = [Point(start, 0, 0, 0 if has_segments else None, -1)]
    kept, k = 0, 0
    for i in sorted(points):
        while k < len(steps) and steps[k][0] <= i:
            kept += steps[k][1]
            k += 1
        p = points[i]
        out.append(Point(p.t_us, p.allocated, kept, p.reserved, i))
    return out


def _name(allocs: list[Alloc], names: Sequence[Name]) -> None:
    used = [0] * len(names)
    for alloc in allocs:
        for i, name in enumerate(names):
            if (name.count == 0 or used[i] < name.count) and name.matches(alloc):
                used[i] += 1
                alloc.name = name.text
                break
        else:
            alloc.name = alloc.phase or "allocation"


@dataclass(frozen=True)
class Layer:
    """One band's place in the stack: its bottom edge over time while it lives."""

    alloc: Alloc
    xs: list[float]
    lows: list[float]


def stack(timeline: Timeline) -> list[Layer]:
    """Each kept allocation's bottom edge over time: the sum of the kept allocations made
    before it and still alive (the group sits on top of them all)."""
    times = sorted(
        {a.start_us for a in timeline.allocs}
        | {a.end_us for a in timeline.allocs if a.end_us is not None}
    )
    edges: dict[int, tuple[list[float], list[float]]] = {a.index: ([], []) for a in timeline.allocs}
    for t in times:
        below = 0
        for a in timeline.allocs:  # in the order they were made
            alive = a.start_us <= t and (a.end_us is None or a.end_us > t)
            if not alive:
                continue
            xs, lows = edges[a.index]
            if not lows or lows[-1] != below:
                xs.append(t)
                lows.append(float(below))
            below += a.size
    return [Layer(a, *edges[a.index]) for a in timeline.allocs]
