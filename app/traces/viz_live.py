"""The blocks alive while the memory_viz export streams: by address, their size, stream
and frames.

Blocks from the records path (``viz_records``) are kept as numpy columns and updated a
block of lines at a time with array operations, not one dict operation an event. The
columns are a few runs sorted by address, each at most half the size of the one before
(merged when a new run would break that), with a mask of the blocks still alive: a block
of lines costs a search in each run and a new small run, and a long trace's many live
blocks are not copied for every block of lines. The general path, which takes and gives
one event at a time, reads and writes a dict; ``as_dict`` moves the runs into it, so the
two never hold the same address.
"""

from collections import deque
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

Live = dict[Any, tuple[int, Any, Any]]  # address -> (size, stream, frames)


@dataclass
class _Run:
    addr: np.ndarray  # sorted, distinct
    size: np.ndarray
    stream: np.ndarray
    alive: np.ndarray

    def kept(self) -> "_Run":
        keep = self.alive
        return _Run(self.addr[keep], self.size[keep], self.stream[keep], keep[keep])


class LiveBlocks:
    def __init__(self) -> None:
        self.runs: list[_Run] = []  # largest first
        self.others: Live = {}

    def update(
        self, addr: np.ndarray, alive: np.ndarray, size: np.ndarray, stream: np.ndarray
    ) -> None:
        """Each of ``addr`` (sorted, distinct) was last allocated (``alive``) or freed in
        the block: the blocks at these addresses go, then the allocated ones are added."""
        if self.others:
            deque(map(self.others.pop, addr.tolist(), repeat(None)), maxlen=0)
        for run in self.runs:
            at = np.searchsorted(run.addr, addr)
            inside = at < run.addr.size
            at = at[inside]
            run.alive[at[run.addr[at] == addr[inside]]] = False
        born = np.flatnonzero(alive)
        if born.size:
            self.runs.append(_Run(addr[born], size[born], stream[born], np.ones(born.size, bool)))
        while len(self.runs) > 1 and self.runs[-2].addr.size <= 2 * self.runs[-1].addr.size:
            last, before = self.runs.pop().kept(), self.runs.pop().kept()
            order = np.argsort(np.concatenate((before.addr, last.addr)), kind="stable")
            self.runs.append(
                _Run(
                    np.concatenate((before.addr, last.addr))[order],
                    np.concatenate((before.size, last.size))[order],
                    np.concatenate((before.stream, last.stream))[order],
                    np.ones(order.size, bool),
                )
            )
        if self.runs and self.runs[0].alive.sum() * 2 < self.runs[0].alive.size:
            self.runs[0] = self.runs[0].kept()  # most of it freed: memory follows what lives

    def as_dict(self) -> Live:
        """Every block alive, as the dict the general path and the end state read; the
        runs are emptied into it."""
        for run in map(_Run.kept, self.runs):
            values = zip(run.size.tolist(), run.stream.tolist(), repeat(None), strict=False)
            self.others.update(zip(run.addr.tolist(), values, strict=True))
        self.runs = []
        return self.others
