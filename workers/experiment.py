"""One experiment inside the child, spec to payload: the device and the byte cap, the
tracer, the op or the scenario, then the result, its notes and the trace file; and the
wall time of each of those stages (for bench/)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from vramlab.contract import KEEPS_RESULT, ErrorType, Isolation, Status
from vramlab.runspec import RunSpec
from workers import allocator, limits, notes, scenario, sections
from workers.device import ONE_QUEUE_NOTE, Prepared, apply_allocator, prepare
from workers.errors import classify, error, oom_details
from workers.measure import Meter, fill_from_events
from workers.models import report as model_report
from workers.op_phases import Body, execute_op, watch_once
from workers.ops import op_for
from workers.placement import placement
from workers.result import build_result
from workers.tracer import make_tracer, write_events


class Stages:
    """Wall time of the child's stages, for the runner's overhead breakdown (bench/)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.last
        self.last = now


def run_experiment(
    spec: RunSpec,
    trace_path: Path | None,
    t0_ns: int,
    prepared: Prepared | None = None,
    stages: Stages | None = None,
    runs_before: int | None = None,
) -> dict[str, Any]:
    stages = stages or Stages()
    sections.restore({})  # a shared process ran other experiments' sections before
    device = torch.device(spec.device)
    if prepared is not None and prepared.device != str(device):
        raise RuntimeError(f"a spare prepared for {prepared.device} got a {device} spec")
    alloc_conf = apply_allocator(spec.allocator.settings())
    if prepared is None:
        prepared = prepare(device)
        stages.mark("init_device")
    if prepared.error is not None:
        return {
            "status": Status.FAILED,
            "result": None,
            "trace_events": 0,
            "error": classify(prepared.error, spec),
        }
    init_rss = prepared.init_rss
    limits.apply(spec, device)  # the service's byte cap, held from here to the end
    meter = Meter(device)
    tracer = make_tracer(str(device), spec.trace, t0_ns, allocator.backend_of(alloc_conf))
    tracer.start()
    stages.mark("tracer_start")
    is_scenario = spec.is_scenario
    if is_scenario:
        body = Body()
        body.steps, body.error, body.watched, body.held = scenario.execute(
            spec, device, meter, tracer
        )
    else:
        body = execute_op(spec, device, meter, tracer)
    stages.mark("run")
    trace = tracer.stop()
    if device.type == "cpu":
        fill_from_events(meter.phases, trace.events, "cpu")
        sections.fill_cpu(trace.sections, trace.events)
    stages.mark("tracer_stop")

    if is_scenario:
        result = scenario.build_result(spec, meter.phases, body.steps, trace, alloc_conf)
    else:
        result = build_result(
            spec, meter.phases, body.inputs, body.outputs, body.timing, trace, alloc_conf
        )
        stages.mark("result")
        if body.error is None and op_for(spec.op, spec.params).probe:
            body.watched = watch_once(spec, body, device)
        stages.mark("copy_watch")
        names = [o["name"] for o in result["outputs"]]
        result["placement"] = placement(
            body.inputs, list(zip(names, body.outputs, strict=True)), body.extras, body.watched
        )
    if is_scenario:
        result["placement"] = body.watched
    result["environment"].update(
        isolation=Isolation.CLEAN if runs_before is None else Isolation.SHARED,
        experiments_before=runs_before,
    )
    details = {**body.extras}
    if sections.records():
        details["sections"] = sections.records()
    model_report.finish(result, details, sections.records())
    if body.error is None and result.get("model"):
        body.error = limits.past_capacity(spec, result["model"])
    if details:
        result["details"] = details
    err = body.error
    if err is not None and err["type"] in (ErrorType.OOM, ErrorType.MEMORY_LIMIT):
        err["details"] = {**oom_details(err["message"], meter.phases), **err["details"]}
    figures = result["memory"]
    if figures is None:
        # The device did not answer after the failure: there are no figures to keep.
        if err is None:
            err = error(
                ErrorType.INTERNAL,
                RuntimeError("the allocator's figures could not be read after the run"),
                "a bug in vramlab's worker; please report it",
                {},
            )
        return {"status": Status.FAILED, "result": None, "error": err, "trace_events": 0}
    result["notes"] = notes.write(spec, result, figures, trace.events, err, init_rss, runs_before)
    result["notes"] += model_report.notes(result, spec)
    if prepared.one_queue and device.type == "cuda":
        result["notes"].append(ONE_QUEUE_NOTE)
    stages.mark("notes")
    count = 0
    if not spec.traced:
        # The CPU profiler ran for the figures, but nothing was asked to be kept.
        result["trace"] = {"source": "none", "events": 0, "truncated": False}
    elif trace_path is not None:
        count = write_events(trace_path, trace.events)
    stages.mark("trace_write")
    if err is not None:
        kept = result if err["type"] in KEEPS_RESULT or is_scenario else None
        return {"status": Status.FAILED, "result": kept, "error": err, "trace_events": count}
    return {"status": Status.SUCCEEDED, "result": result, "error": None, "trace_events": count}
