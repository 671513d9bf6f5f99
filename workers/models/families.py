"""One model's traces at a few batch sizes, reused for every other batch size, exactly.

A predictor child traces a spec's step on fake tensors (workers/models/predict.py): about
half a second of CPU for GPT-2 small, most of it PyTorch's fake-tensor dispatch. Specs
that differ only in their batch size run the same ops in the same order, and each storage's
size is a product of dimensions, linear in the batch (workers/models/edges.py synthesizes
allocation logs from the same fact). So a child keeps, per family (the spec with its batch
size left out, the depth traced and whether the allocation log is kept), what it traced at
the first ``POINTS`` batch sizes it was asked: the category tally's record (its births,
ends, peak checks and phases, workers/models/tally.py), the storages' categories and, where
kept, the allocation log. From then on a batch size of that family is not traced: each
size is put on the line through the traced ones, the tally is replayed with them (the same
steps, so the same peaks, moments and categories as a trace there would find) and the log
is made the same way.

Nothing is synthesized unless the traced points agree: the same steps, storages,
categories, parameter counts and log events at every point, and every size on one line
with an integer slope through all three points (three points for a line: the third checks
the other two). A family that disagrees is traced as before, every time. Batch 1 is never
a point nor synthesized (a dimension of 1 makes a few ops differ); nor are generation
(its steps change with the cache), several micro-batches (chunks of uneven sizes) or a
sharded model (storages that change size). What no three points can show, a size that
stops being linear past them (a buffer padded to a multiple of the batch, say), would be
synthesized wrong: the same assumption as plans' edges, checked on the catalog's models
by tests/workers/test_plan_edges.py.
tests/workers/test_predict_families.py checks a reused prediction against a fresh trace.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from vramlab.runspec import ModelParams
from workers.models.alloc_log import AllocationLog, Event, Window
from workers.models.kernel_scratch import derived_bytes
from workers.models.steps import phases_of
from workers.models.tally import Peak, replayed

POINTS = 3  # traced batch sizes a family needs before the others are reused
FAMILIES = 16  # families a child keeps (the least recently used go first)
SMALLEST = 2  # batch 1 is no point and is not synthesized

Phases = dict[str, dict[str, int]]
LogShape = list[tuple[int, str, Window]]  # each log event without its size


@dataclass
class Point:
    """One trace of a family: what its replay needs, each size apart from the rest."""

    steps: list[tuple[int, int, str]]
    sizes: list[int]
    identities: dict[int, str]
    counts: dict[str, int]
    block: int
    log: LogShape | None
    log_sizes: list[int]
    # Births whose sizes are worked out from two counts (a kernel's own buffer, not linear
    # in the batch: workers/models/kernel_scratch.py); the counts are on the line.
    derived: list[tuple[int, tuple[Any, ...], tuple[int, ...]]] = field(default_factory=list)

    @classmethod
    def of(cls, peak: Peak, counts: dict[str, int], block: int, log: AllocationLog | None) -> Point:
        assert peak.record is not None
        events = log.events if log is not None else []
        return cls(
            peak.record.steps,
            peak.record.sizes,
            peak.identities,
            dict(counts),
            block,
            None if log is None else [(e.key, e.phase, e.window) for e in events],
            [e.nbytes for e in events],
            list(peak.record.derived),
        )

    def same_shape(self, other: Point) -> bool:
        return (
            self.steps == other.steps
            and self.identities == other.identities
            and self.counts == other.counts
            and self.block == other.block
            and self.log == other.log
            and self.derived == other.derived
        )


Line = tuple[list[int], list[int]]  # intercepts, slopes


@dataclass
class Family:
    first: Point | None = None
    sizes: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # by batch
    line: tuple[Line, Line] | None = None  # the tally's sizes, the log's
    broken: bool = False


class Families:
    """A child's families (``FAMILIES`` at most), and how many answers each reused."""

    def __init__(self, size: int = FAMILIES) -> None:
        self.size = size
        self.reused = 0
        self._families: OrderedDict[str, Family] = OrderedDict()

    def clear(self) -> None:
        self._families.clear()
        self.reused = 0

    def wants(self, key: str | None) -> bool:
        """Whether a trace of this family should be recorded (it is still learning)."""
        if key is None:
            return False
        family = self._families.get(key)
        return family is None or (not family.broken and family.line is None)

    def learn(self, key: str, batch: int, point: Point) -> None:
        family = self._families.get(key)
        if family is None:
            family = self._families[key] = Family()
            while len(self._families) > self.size:
                self._families.popitem(last=False)
        if family.broken or family.line is not None or batch in family.sizes:
            return
        if family.first is None:
            family.first = point
        elif not family.first.same_shape(point):
            family.broken, family.first = True, None
            family.sizes.clear()
            return
        family.sizes[batch] = (point.sizes, point.log_sizes)
        if len(family.sizes) == POINTS:
            tally_line = _line([(b, s[0]) for b, s in family.sizes.items()])
            log_line = _line([(b, s[1]) for b, s in family.sizes.items()])
            if tally_line is None or log_line is None:
                family.broken, family.first = True, None
            else:
                family.line = (tally_line, log_line)
            family.sizes.clear()

    def answer(
        self, key: str | None, batch: int
    ) -> tuple[Phases, dict[str, int], AllocationLog | None] | None:
        """The phases, parameter counts (and log) a trace at ``batch`` would give, or None
        (trace it)."""
        family = self._families.get(key) if key is not None else None
        if family is None or family.line is None or family.first is None or batch < SMALLEST:
            return None
        self._families.move_to_end(key)  # type: ignore[arg-type]
        first = family.first
        (tally_c, tally_m), (log_c, log_m) = family.line
        sizes = [c + m * batch for c, m in zip(tally_c, tally_m, strict=True)]
        if sizes and min(sizes) < 0:
            return None
        for name, recipe, counts in first.derived:
            sizes[name] = derived_bytes(recipe, *(sizes[i] for i in counts))
        log = None
        if first.log is not None:
            log = AllocationLog()
            events = []
            for (k, phase, window), c, m in zip(first.log, log_c, log_m, strict=True):
                nbytes = c + m * batch
                if nbytes < 0 and (c, m) != (-1, 0):  # a free is -1 at every batch
                    return None
                events.append(Event(k, nbytes, phase, window))
            log.events = events
        tally = replayed(first.steps, sizes, first.block)
        self.reused += 1
        return phases_of(tally, first.identities), dict(first.counts), log


def _line(points: list[tuple[int, list[int]]]) -> Line | None:
    """Each size's line (intercept, integer slope) through every point, or None."""
    (x1, a), (x2, b), *rest = points
    if any(len(s) != len(a) for _, s in points):
        return None
    intercepts, slopes = [], []
    for i, (y1, y2) in enumerate(zip(a, b, strict=True)):
        rise = y2 - y1
        if rise % (x2 - x1):
            return None
        m = rise // (x2 - x1)
        c = y1 - m * x1
        if any(s[i] != c + m * x for x, s in rest):
            return None
        intercepts.append(c)
        slopes.append(m)
    return intercepts, slopes


def key_of(params: ModelParams, cuda: bool, logged: bool, blocks: int | None) -> str | None:
    """The family of a trace (the spec less its batch size, the depth traced, whether
    its log is kept), or None where its traces are not reused."""
    if (
        params.task not in ("train", "inference")
        or params.parallel is not None
        or params.micro_batches != 1
        or params.batch_size < SMALLEST
        or params.loss == "liger"  # its chunk is a power of two of the tokens: not a line
    ):
        return None
    wire: dict[str, Any] = params.replace(batch_size=1).wire()
    return json.dumps([wire, cuda, logged, blocks], sort_keys=True)
