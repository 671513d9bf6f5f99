"""What an experiment's trace shows: the peak and what held it, and its timeline chart."""

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy.orm import Session

from app.errors import NotFound
from app.models import Experiment
from app.plots.chart import Chart, Label, Line, Mark, human_bytes
from app.schemas.results import BlockOut, PeakMoment, PeakOut
from app.services import replay, traces


def _block_out(block: replay.Block) -> BlockOut:
    return BlockOut.model_validate(block.as_dict())


def peak(session: Session, exp: Experiment, top: int) -> PeakOut:
    """Replay once to find the peak and the largest blocks, again to list what was alive."""
    found, largest, n_events, _ = replay.find_peak(traces.iter_events(session, exp.id), top)
    alive: list[replay.Block] = []
    if found is not None:
        alive = replay.alive_at(traces.iter_events(session, exp.id), found.index)
    memory = (exp.result.data.get("memory") or {}) if exp.result is not None else {}
    return PeakOut(
        experiment_id=exp.id,
        events=n_events,
        peak=PeakMoment(
            seq=found.seq,
            t_us=found.t_us,
            phase=found.phase,
            allocated=found.allocated,
            reserved=found.reserved,
        )
        if found
        else None,
        alive_at_peak=[_block_out(b) for b in alive[:top]],
        alive_count=len(alive),
        largest=[_block_out(b) for b in largest],
        measured_allocated_peak=memory.get("allocated_peak"),
    )


def label(exp: Experiment) -> str:
    if exp.kind == "snapshot":
        return f"{exp.name} (snapshot {exp.id[:8]})"
    shape = "x".join(str(d) for d in exp.shape)
    return f"{exp.op} {shape} {exp.dtype} {exp.device} ({exp.id[:8]})"


class _Watch:
    """Passes events through, noting phase marks and the largest allocations."""

    def __init__(self, top: int) -> None:
        self.marks: list[Mark] = []
        self.largest: list[tuple[int, float]] = []  # min-heap of (size, t_us)
        self._top = top
        self._t = 0.0

    def __call__(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for event in events:
            if event.get("t_us") is not None:
                self._t = float(event["t_us"])
            if event.get("action") == "mark":
                self.marks.append(Mark(self._t / 1000, str(event.get("name") or "")))
            elif event.get("action") == "alloc":
                item = (int(event.get("size") or 0), self._t)
                if len(self.largest) < self._top:
                    heapq.heappush(self.largest, item)
                elif item > self.largest[0]:
                    heapq.heapreplace(self.largest, item)
            yield event


def samples(session: Session, exp: Experiment, watch: _Watch | None = None) -> list[replay.Sample]:
    events: Iterable[dict[str, Any]] = traces.iter_events(session, exp.id)
    if watch is not None:
        events = watch(events)
    return list(replay.sample(events, traces.count(session, exp.id)))


def _require_trace(session: Session, exp: Experiment) -> None:
    if traces.count(session, exp.id) == 0:
        raise NotFound(
            f"experiment {exp.id} has no trace events (status {exp.status}, trace {exp.trace_mode})"
        )


def timeline(session: Session, exp: Experiment) -> Chart:
    """Allocated (and reserved, where segments were recorded) over time, with the phases,
    the peak and the three largest blocks labelled."""
    _require_trace(session, exp)
    watch = _Watch(top=3)
    points = samples(session, exp, watch)
    xs = [p.t_us / 1000 for p in points]
    chart = Chart(title=f"Memory over time: {label(exp)}", x_label="time (ms)")
    chart.lines.append(Line("allocated", xs, [float(p.allocated) for p in points]))
    if any(p.reserved is not None for p in points):
        chart.lines.append(Line("reserved", xs, [float(p.reserved or 0) for p in points]))
    chart.marks = watch.marks
    top = max(points, key=lambda p: p.allocated)
    chart.labels.append(
        Label(top.t_us / 1000, float(top.allocated), f"peak {human_bytes(top.allocated)}")
    )
    for size, t_us in sorted(watch.largest, reverse=True):
        level = _value_at(points, t_us)
        chart.labels.append(Label(t_us / 1000, float(level), f"block {human_bytes(size)}"))
    return chart


def _value_at(points: list[replay.Sample], t_us: float) -> int:
    level = 0
    for p in points:
        if p.t_us > t_us:
            break
        level = p.allocated
    return level


def overlay(session: Session, exps: list[Experiment]) -> Chart:
    """Allocated over time for several experiments on one chart."""
    chart = Chart(title="Allocated over time", x_label="time (ms)")
    for exp in exps:
        _require_trace(session, exp)
        points = samples(session, exp)
        chart.lines.append(
            Line(label(exp), [p.t_us / 1000 for p in points], [float(p.allocated) for p in points])
        )
    return chart
