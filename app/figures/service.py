"""What an experiment's trace shows: the peak and what held it, its timeline (each large
allocation a named band, the phases shaded, the peak marked) and overlays of several."""

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.core.errors import NotFound
from app.figures import bands, ticks
from app.figures.chart import Band, Chart, Label, Line, Mark, Span, human_bytes
from app.figures.schemas import BlockOut, PeakMoment, PeakOut
from app.tables import Experiment
from app.traces import replay
from app.traces import service as traces
from vramlab.contract import Status

T = TypeVar("T")


def _block_out(block: replay.Block) -> BlockOut:
    return BlockOut.model_validate(block.as_dict())


def peak(session: Session, exp: Experiment, top: int) -> PeakOut:
    """The peak, what was alive then and the largest blocks, from the timeline's one pass
    (shared with the figure); a list longer than the bands kept replays twice."""
    if top > 50:  # a long list with stacks is not worth holding
        return _peak(session, exp, top)
    key = ("peak", exp.id, traces.count(session, exp.id), top)
    return cached(exp, key, lambda: _peak(session, exp, top))


def _peak(session: Session, exp: Experiment, top: int) -> PeakOut:
    if top <= bands.MAX_BANDS:
        tl = build(session, exp)
        found = (
            replay.PeakPoint(
                index=tl.peak.index,
                seq=tl.peak_seq,
                t_us=tl.peak.t_us,
                allocated=tl.peak.allocated,
                reserved=tl.peak.reserved,
                phase=tl.peak_phase,
            )
            if tl.peak is not None
            else None
        )
        largest = [_alloc_out(a) for a in tl.largest[:top]]
        alive = [_alloc_out(a) for a in tl.alive_at_peak[:top]]
        n_events, alive_count = tl.events, tl.alive_count
    else:
        found, blocks, n_events, _ = replay.find_peak(traces.iter_events(session, exp.id), top)
        largest = [_block_out(b) for b in blocks]
        alive_blocks: list[replay.Block] = []
        if found is not None:
            alive_blocks = replay.alive_at(traces.iter_events(session, exp.id), found.index)
        alive, alive_count = [_block_out(b) for b in alive_blocks[:top]], len(alive_blocks)
    measured = exp.measured
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
        alive_at_peak=alive,
        alive_count=alive_count,
        largest=largest,
        measured_allocated_peak=measured.memory.allocated_peak if measured is not None else None,
    )


def _alloc_out(a: bands.Alloc) -> BlockOut:
    return BlockOut(
        addr=a.addr, size=a.size, seq=a.seq, t_us=a.start_us, phase=a.phase, frames=list(a.frames)
    )


def label(exp: Experiment) -> str:
    if exp.kind == "snapshot":
        named = (exp.name or "").lower() not in ("", "snapshot")  # not the default name
        return f"{exp.name} (snapshot {exp.id[:8]})" if named else f"snapshot {exp.id[:8]}"
    if exp.op == "model":  # a model by its name, batch x length and precision
        return f"{model_words(exp.params or {})} {exp.device} ({exp.id[:8]})"
    shape = "x".join(str(d) for d in exp.shape)
    what = " ".join(p for p in (exp.op, exp.preset or "", shape, exp.dtype, exp.device) if p)
    return f"{what} ({exp.id[:8]})"


def model_words(params: dict[str, Any]) -> str:
    """``gpt2 train 16x1024 bf16-autocast``: a model experiment in a few words."""
    length = params.get("seq_len") or params.get("image_size")
    size = f"{params.get('batch_size')}" + (f"x{length}" if length else "")
    words = [params.get("model"), params.get("task"), size, params.get("precision")]
    if params.get("checkpointing"):
        words.append("checkpointing")
    if (params.get("micro_batches") or 1) > 1:
        words.append(f"{params['micro_batches']} micro-batches")
    return " ".join(str(w) for w in words if w)


def _short_label(exp: Experiment) -> str:
    """The id first, so that a legend cut to fit still tells the lines apart."""
    if exp.op == "model":
        return f"{exp.id[:8]} {model_words(exp.params or {})} {exp.device}"
    shape = "x".join(str(d) for d in exp.shape)
    what = " ".join(p for p in (exp.preset or exp.op, shape, exp.dtype, exp.device) if p)
    return f"{exp.id[:8]} {what}"


def _require_trace(session: Session, exp: Experiment) -> None:
    if traces.count(session, exp.id) == 0:
        raise NotFound(
            f"experiment {exp.id} has no trace events (status {exp.status}, trace {exp.trace_mode})"
        )


# What a finished experiment's trace shows never changes: the page, its SVG and PNG, the
# peak table and a comparison read a long trace once, not once per view.
_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()


def cached(exp: Experiment, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            found: T = _CACHE[key]
            return found
    value = compute()
    if Status(exp.status).finished:
        with _CACHE_LOCK:
            _CACHE[key] = value
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    return value


def build(session: Session, exp: Experiment, with_bands: bool = True) -> bands.Timeline:
    """The experiment's band timeline (``with_bands=False``: its totals alone)."""
    count = traces.count(session, exp.id)
    return cached(
        exp,
        ("timeline", exp.id, count, with_bands),
        lambda: bands.build(
            traces.iter_events(session, exp.id),
            names(exp) if with_bands else (),
            total=count,
            max_bands=bands.MAX_BANDS if with_bands else 0,
        ),
    )


def names(exp: Experiment) -> list[bands.Name]:
    """What to call an experiment's allocations: its inputs and outputs by their names and
    sizes, what the op kept (a library's workspace on CUDA) or freed (temporaries), and in
    a scenario the tensors each step makes."""
    data = exp.result.data if exp.result is not None else {}
    if exp.op == "scenario":
        out = []
        for i, entry in enumerate(data.get("steps") or []):
            step = (exp.steps or [])[i] if i < len(exp.steps or []) else {}
            made = _made(step)
            phase = str(entry.get("name") or "")
            text = ", ".join(made) if made else phase[3:] or phase
            out.append(bands.Name(f"{text} (step {i})" if made else text, phase=phase))
        return out
    out = [
        bands.Name(f"input {t.get('name')}", phase="setup", size=_int(t.get("bytes")), count=1)
        for t in data.get("inputs") or []
        if isinstance(t, dict)
    ]
    for t in data.get("outputs") or []:
        if not isinstance(t, dict) or t.get("is_view_of_input"):
            continue
        size = _int(t.get("bytes"))
        out.append(bands.Name(f"output {t.get('name')}", "op", size, lives=True, count=1))
        out.append(bands.Name(f"output {t.get('name')}, an earlier call", "op", size, lives=False))
    kept = "workspace (kept by a library)" if exp.device_type == "cuda" else "kept after the op"
    out += [
        bands.Name(kept, phase="op", lives=True),
        bands.Name("temporary", phase="op", lives=False),
        bands.Name("set-up temporary", phase="setup", lives=False),
    ]
    return out


def _made(step: Any) -> list[str]:
    """The tensor names a step (or a repeat block's steps) makes, in order, once each."""
    if not isinstance(step, dict):
        return []
    if step.get("do") == "repeat":
        inner = [n for s in step.get("steps") or [] for n in _made(s)]
        return list(dict.fromkeys(inner))
    if step.get("do") in ("create", "op", "move", "pin"):
        name = step.get("name") or (step.get("args") or [None])[0]
        return [str(name)] if name else []
    return []


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def timeline(session: Session, exp: Experiment) -> Chart:
    """The experiment's memory from set-up on: bands, phases, peak; reserved where the
    trace recorded segments."""
    _require_trace(session, exp)
    return timeline_chart(build(session, exp), f"Memory over time: {label(exp)}")


def timeline_chart(tl: bands.Timeline, title: str, since: str = "set-up") -> Chart:
    """A band timeline as a chart, in time since its start (``since``: set-up for an
    experiment) in a round unit."""
    span_ms = (tl.end_us - tl.start_us) / 1000
    unit, scale = ticks.time_unit(span_ms)
    end = span_ms / scale * 1.03 if span_ms > 0 else 1.0

    def x(t_us: float) -> float:
        return (t_us - tl.start_us) / 1000 / scale

    def at(t_us: float | None) -> str:
        if t_us is None:
            return "still alive at the end"
        return f"{ticks.number_label(float(f'{x(t_us):.4g}'))} {unit}"

    chart = Chart(title=title, x_label=f"time since {since} ({unit})", x_range=(0.0, end))
    for i, phase in enumerate(tl.phases):
        x1 = x(phase.end_us) if i + 1 < len(tl.phases) else end
        chart.spans.append(
            Span(x(phase.start_us), x1, phase.name, f"{phase.name}: {at(phase.start_us)} to "
                 + (at(phase.end_us) if i + 1 < len(tl.phases) else "the end"))
        )  # fmt: skip
    for layer in bands.stack(tl):
        a = layer.alloc
        if not layer.xs:
            continue  # freed the moment it was made
        stop = x(a.end_us) if a.end_us is not None else end
        lows = [*layer.lows, layer.lows[-1]]
        detail = [
            a.name,
            f"{human_bytes(a.size)} ({a.size:,} B)",
            f"made in {a.phase or '?'} at {at(a.start_us)}; "
            + ("still alive at the end" if a.end_us is None else f"freed at {at(a.end_us)}"),
        ]
        detail += [
            f"  {f.get('name', '?')} {f.get('filename', '')}:{f.get('line', '')}"
            for f in a.frames[:4]
            if isinstance(f, dict)
        ]
        chart.bands.append(
            Band(
                a.name,
                [*(x(t) for t in layer.xs), stop],
                lows,
                [v + a.size for v in lows],
                "\n".join(detail),
            )
        )
    xs = [x(p.t_us) for p in tl.points] + [end]
    totals = [float(p.allocated) for p in tl.points]
    totals.append(totals[-1])
    if tl.grouped and any(p.allocated > p.kept for p in tl.points):
        kept = [float(p.kept) for p in tl.points]
        kept.append(kept[-1])
        chart.bands.append(
            Band(
                f"{tl.grouped:,} smaller allocations",
                xs,
                kept,
                totals,
                f"{tl.grouped:,} smaller allocations, grouped "
                f"(the largest {human_bytes(tl.group_largest)})",
                grouped=True,
            )
        )
    chart.lines.append(Line("allocated", xs, totals))
    if tl.has_segments:
        reserved = [float(p.reserved or 0) for p in tl.points]
        reserved.append(reserved[-1])
        chart.lines.append(Line("reserved", xs, reserved, dashed=True))
    if tl.peak is not None and tl.peak.allocated > 0:
        during = tl.peak_phase or ""
        number = during.split(" ", 1)[0]
        if len(during) > 16:  # a scenario's step: its number (the shading names it)
            during = f"step {number}" if number.isdigit() else ""
        where = f", {during}" if during else ""
        chart.labels.append(
            Label(
                x(tl.peak.t_us),
                float(tl.peak.allocated),
                f"peak {human_bytes(tl.peak.allocated)} at {at(tl.peak.t_us)}{where}",
            )
        )
    return chart


def overlay(session: Session, exps: Sequence[Experiment]) -> Chart:
    """Allocated over time for several experiments, each aligned on its op's start (a
    scenario on its set-up), in one time unit."""
    built = []
    for exp in exps:
        _require_trace(session, exp)
        tl = build(session, exp, with_bands=False)
        zero = next((t for name, t in tl.marks if name == "op"), tl.start_us)
        built.append((exp, tl, zero))
    lo = min((tl.start_us - zero) / 1000 for _, tl, zero in built)
    hi = max((tl.end_us - zero) / 1000 for _, tl, zero in built)
    unit, scale = ticks.time_unit(hi - lo)
    on_op = all(any(n == "op" for n, _ in tl.marks) for _, tl, _ in built)
    what = "the op started" if on_op else "the op started (set-up where there is no op)"
    chart = Chart(title="Allocated over time", x_label=f"time since {what} ({unit})")
    end = hi / scale + (hi - lo) / scale * 0.03
    for exp, tl, zero in built:
        xs = [(p.t_us - zero) / 1000 / scale for p in tl.points] + [end]
        ys = [float(p.allocated) for p in tl.points]
        chart.lines.append(Line(_short_label(exp), xs, [*ys, ys[-1]]))
    chart.marks.append(Mark(0.0, "op starts" if on_op else "op (or set-up) starts"))
    chart.x_range = (lo / scale, end)
    return chart
