"""A model's edge on many cards from the allocation logs of a few traces.

A plan asks, for each GPU, the largest batch (or sequence) whose step the caching allocator
can hold under that card's capacity. Tracing the step at every value a search visits costs
a trace each (about half a second of CPU for GPT-2 small). But a step's allocations at two
values of the batch (three of the sequence) fix them at every other value: the same ops
allocate in the same order, and each request's size is a polynomial in the varied value
(a product of the tensor's dimensions, linear in the batch; quadratic in the sequence where
attention holds a score matrix). So the log at any value is synthesized from the traced
ones, event by event, and replayed through the allocator model under each capacity: a
search costs milliseconds per value.

Where the traced logs do not line up (another number of allocations, a size that is not a
polynomial with integer coefficients through the points), nothing is synthesized and the
caller traces as before. tests/workers/test_plan_edges.py checks that a synthesized log
equals the traced one on the catalog's models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

Events = list[tuple[int, int]]
Log = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]  # keys; each event's coefficients


def pack(events: Sequence[tuple[int, int]]) -> list[int]:
    """A log as the flat list of ints it travels as: key, size, key, size..."""
    return [n for event in events for n in event]


def unpack(flat: Sequence[int]) -> Events:
    if len(flat) % 2:
        raise ValueError("a packed log holds pairs")
    return [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]


def fitted(points: Sequence[tuple[int, Events]]) -> Log | None:
    """Each event's size as a polynomial in the varied value through the traced points
    (degree: one less than the points), or None where the logs do not line up."""
    xs = [x for x, _ in points]
    logs = [log for _, log in points]
    if len(set(xs)) != len(xs) or not logs or any(len(log) != len(logs[0]) for log in logs):
        return None
    keys: list[int] = []
    coefficients: list[tuple[int, ...]] = []
    for events in zip(*logs, strict=True):
        key = events[0][0]
        if any(k != key for k, _ in events):
            return None
        sizes = [n for _, n in events]
        if sizes[0] < 0 or min(sizes) < 0:  # a free, at every point
            if any(n >= 0 for n in sizes):
                return None
            coefficients.append((-1,))
        elif all(n == sizes[0] for n in sizes):
            coefficients.append((sizes[0],))
        else:
            poly = _through(xs, sizes)
            if poly is None:
                return None
            coefficients.append(poly)
        keys.append(key)
    return tuple(keys), tuple(coefficients)


def _through(xs: Sequence[int], ys: Sequence[int]) -> tuple[int, ...] | None:
    """The polynomial through the points, lowest coefficient first, if its coefficients
    are integers (a tensor's size is a product of integer dimensions)."""
    n = len(xs)
    total = [Fraction(0)] * n
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        basis = [Fraction(1)]  # prod over j != i of (x - xj) / (xi - xj)
        for j, xj in enumerate(xs):
            if j == i:
                continue
            scale = Fraction(1, xi - xj)
            shifted = [Fraction(0), *basis]  # times x
            for d, c in enumerate(basis):
                shifted[d] -= c * xj
            basis = [c * scale for c in shifted]
        for d, c in enumerate(basis):
            total[d] += c * yi
    if any(c.denominator != 1 for c in total):
        return None
    return tuple(int(c) for c in total)


SMALLEST = 2  # a dimension of 1 is special (broadcasts, views that copy nothing)


def at(log: Log, x: int) -> Events | None:
    """The log synthesized at ``x`` (None where a size would be negative, and below
    ``SMALLEST``: at batch 1 a step makes a few allocations fewer)."""
    if x < SMALLEST:
        return None
    keys, coefficients = log
    out: Events = []
    for key, poly in zip(keys, coefficients, strict=True):
        if len(poly) == 1:
            out.append((key, poly[0]))
            continue
        size = 0
        for c in reversed(poly):
            size = size * x + c
        if size < 0:
            return None
        out.append((key, size))
    return out


def edge(
    fits: Callable[[int], bool | None], step: int, top: int, guess: int | None = None
) -> int | None:
    """The largest multiple of ``step`` up to ``top`` that fits (0: not even ``step``),
    searched from ``guess`` (doubling away from it, then bisecting: a good guess costs two
    or three replays); None where a value could not be synthesized."""
    last = top // step  # in units of step
    first = fits(step)
    if first is None and last >= 2:  # step itself cannot be synthesized
        first = fits(2 * step) or None  # fitting there, it fits at step
    if first is None:
        return None
    if not first:
        return 0
    lo, hi = 1, last + 1  # fits at lo * step; hi: past the end, or does not fit
    g = min(max(1, (guess or step) // step), last)
    stride = 1
    while hi - lo > 1:  # gallop from the guess until the edge is bracketed
        ok = fits(g * step)
        if ok is None:
            return None
        if ok:
            lo = g
            g = min(g + stride, hi - 1)
        else:
            hi = g
            g = max(g - stride, lo + 1)
        stride *= 2
        if g >= hi or g <= lo:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = fits(mid * step)
        if ok is None:
            return None
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo * step
