"""The child process's side of one experiment: set up, run the op, measure, report.

The runner forks this from a forkserver that imported torch but never touched CUDA, so
each experiment starts with an empty caching allocator and its own allocator settings.
A ``shared`` experiment may instead run in a long-lived child that served others before
it, emptied and checked in between (``serve``, workers/shared.py). The result goes back
over a pipe as JSON; the trace goes to a gzip NDJSON file. A spec with ``op:
"scenario"`` runs its steps through workers/scenario.py instead of one op.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
import torch

# The profiler imports torch._dynamo on its first start (over a second); importing it
# here lets the forkserver, which preloads this module, pay that once for all children.
import torch._dynamo
import torch.profiler
from vramlab import contract
from vramlab.contract import KEEPS_RESULT, ErrorType, Isolation, Status

from workers import allocator, limits, notes, scenario, sections, shared
from workers.errors import OpFailure, call, classify, error, oom_details
from workers.measure import Meter, fill_from_events
from workers.models import report as model_report
from workers.ops import Inputs, Op, OpContext, as_tuple, op_for, torch_dtype
from workers.placement import CopyWatcher, placement
from workers.result import build_result
from workers.tracer import Tracer, make_tracer, write_events


def _register_cuda_ops_early() -> None:
    """torch registers its Triton sparse kernels as an op library when CUDA first starts:
    two registrations that took about 150 ms of every child's start on an H100 (torch
    2.11). They touch no device, so the forkserver, which imports this module, does them
    once; the children then find them registered. CUDA itself stays untouched here."""
    register = getattr(torch.cuda, "_register_triton_kernels", None)
    if register is None or torch.cuda.is_initialized():
        return
    try:
        register()
    except Exception:  # a torch without them: children register them as before
        return


_register_cuda_ops_early()


@dataclass
class Body:
    """What running the op (or the scenario) left: tensors, timing, error, details."""

    inputs: Inputs = field(default_factory=dict)
    outputs: tuple[torch.Tensor, ...] = ()
    timing: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    watched: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    ctx: OpContext | None = None
    held: Any = None  # a scenario's named tensors, alive until the figures are read


@dataclass
class Prepared:
    """A device made ready before the spec was known: what starting it cost, or its error."""

    device: str
    init_rss: tuple[int, int] | None = None
    error: BaseException | None = None
    init_s: float = 0.0


class Stages:
    """Wall time of the child's stages, for the runner's overhead breakdown (bench/)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.last
        self.last = now


def prepare(device: torch.device) -> Prepared:
    """Start CUDA on ``device`` ahead of a spec (a warm spare): context made, nothing
    allocated, so allocated and reserved still start at zero and first-use effects
    (cuBLAS's workspace) stay in the experiment. On the CPU there is nothing to start."""
    started = time.perf_counter()
    prepared = Prepared(str(device))
    if device.type == "cuda":
        rss_before = psutil.Process().memory_info().rss
        try:
            call(init_device, device)
        except OpFailure as failure:
            prepared.error = failure.cause
        prepared.init_rss = (rss_before, psutil.Process().memory_info().rss)
    prepared.init_s = time.perf_counter() - started
    return prepared


def serve(device: str, conn: Connection) -> None:
    """A warm child: start the device, then run the specs the runner sends on the pipe.

    A clean spec is the child's only one: it exits after the result. A shared spec makes
    it a shared process: after each result it empties and checks itself
    (workers/shared.py), tells the runner whether it can serve again, and waits for the
    next spec. EOF on the pipe means the runner retired it.
    """
    gc.freeze()
    prepared = prepare(torch.device(device))
    baseline: shared.Baseline | None = None
    runs = 0
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        spec, trace_path, t0_ns, handed_at = json.loads(message)
        if spec.get("isolation") != Isolation.SHARED or prepared.error is not None:
            main(spec, conn, trace_path, t0_ns, prepared, handed_at)
            return
        if baseline is None:  # before the first experiment: as a fresh process is
            baseline = shared.Baseline.capture(torch.device(device))
        payload = main(spec, conn, trace_path, t0_ns, prepared, handed_at, runs_before=runs)
        runs += 1
        prepared = Prepared(device)  # the device started before this process's next spec
        try:
            why = shared.retire_after(spec, payload) or shared.empty(baseline)
        except Exception as exc:  # emptying itself failed: it cannot serve again
            why = f"emptying the process failed: {exc}"
        try:
            conn.send_bytes(json.dumps({"ready": why is None, "why": why}).encode())
        except OSError:  # the runner retired it meanwhile
            return
        if why is not None:
            return


def main(
    spec: dict[str, Any],
    conn: Connection,
    trace_path: str | None,
    t0_ns: int,
    prepared: Prepared | None = None,
    handed_at: float | None = None,
    runs_before: int | None = None,
) -> dict[str, Any]:
    """Run one spec and send its outcome on ``conn``; return what was sent.
    ``runs_before``: in a shared process, how many experiments it ran before this one."""
    # Everything inherited from the forkserver (torch's modules) is long-lived: freezing it
    # keeps the collector from scanning it (a gc.collect() here took 0.17 s otherwise).
    gc.freeze()
    stages = Stages()
    if handed_at is not None:
        # perf_counter is CLOCK_MONOTONIC, one clock for every process of the host.
        stages.times["handoff"] = stages.last - handed_at
    try:
        payload = run_experiment(
            spec, Path(trace_path) if trace_path else None, t0_ns, prepared, stages, runs_before
        )
        # What the API will accept, checked here: a field nobody declared is our bug.
        payload = contract.Outcome.model_validate(payload).wire()
    except BaseException as exc:  # a bug of ours: report it rather than die silently
        message = (str(exc) or type(exc).__name__)[: contract.MAX_ERROR_MESSAGE_CHARS]
        payload = {
            "status": Status.FAILED,
            "result": None,
            "trace_events": 0,
            "error": error(
                ErrorType.INTERNAL,
                Exception(message),
                "a bug in vramlab's worker; please report it",
                {"traceback": traceback.format_exc()[-contract.MAX_ERROR_MESSAGE_CHARS :]},
            ),
        }
    if torch.cuda.is_initialized() and runs_before is None:
        # The experiment's tensors are gone with run_experiment's frame: give their memory
        # back to the driver now, so that the next experiment need not wait for this
        # process to exit. (A shared process does it after answering, while it empties.)
        gc.collect()
        torch.cuda.empty_cache()
    stages.mark("report")
    payload["stages"] = stages.times
    conn.send_bytes(json.dumps(payload, default=str).encode())
    return payload


def run_experiment(
    spec: dict[str, Any],
    trace_path: Path | None,
    t0_ns: int,
    prepared: Prepared | None = None,
    stages: Stages | None = None,
    runs_before: int | None = None,
) -> dict[str, Any]:
    stages = stages or Stages()
    sections.restore({})  # a shared process ran other experiments' sections before
    device = torch.device(spec["device"])
    if prepared is not None and prepared.device != str(device):
        raise RuntimeError(f"a spare prepared for {prepared.device} got a {device} spec")
    alloc_conf = apply_allocator(spec.get("allocator") or {})
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
    tracer = make_tracer(
        str(device), spec.get("trace", "events"), t0_ns, allocator.backend_of(alloc_conf)
    )
    tracer.start()
    stages.mark("tracer_start")
    is_scenario = spec["op"] == "scenario"
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
        if body.error is None and op_for(spec["op"], spec.get("params") or {}).probe:
            body.watched = _watch_once(spec, body, device)
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
        body.error = limits.past_capacity(spec, result["model"]["peak_allocated"])
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
    stages.mark("notes")
    count = 0
    if spec.get("trace", "events") == "none":
        # The CPU profiler ran for the figures, but nothing was asked to be kept.
        result["trace"] = {"source": "none", "events": 0, "truncated": False}
    elif trace_path is not None:
        count = write_events(trace_path, trace.events)
    stages.mark("trace_write")
    if err is not None:
        kept = result if err["type"] in KEEPS_RESULT or is_scenario else None
        return {"status": Status.FAILED, "result": kept, "error": err, "trace_events": count}
    return {"status": Status.SUCCEEDED, "result": result, "error": None, "trace_events": count}


def execute_op(spec: dict[str, Any], device: torch.device, meter: Meter, tracer: Tracer) -> Body:
    params = spec.get("params") or {}
    op = op_for(spec["op"], params)
    ctx = OpContext(tuple(spec["shape"]), torch_dtype(spec["dtype"]), device, params)
    body = Body(extras=ctx.extras, ctx=ctx)
    try:
        with meter.phase("setup", tracer.phase("setup")):
            body.inputs = call(op.setup, ctx)
        with meter.phase("op", tracer.phase("op")):
            body.outputs, body.timing = run_op(op, body.inputs, ctx, spec, meter)
        with meter.phase("after", tracer.phase("after")):
            gc.collect()  # what stays now is what the outputs (and inputs) hold
    except OpFailure as failure:
        body.error = classify(failure.cause, spec, ctx.extras)
    return body


def _watch_once(spec: dict[str, Any], body: Body, device: torch.device) -> dict[str, Any] | None:
    """Run the op once more under the copy watcher; None if that run fails."""
    ctx = body.ctx
    if ctx is None:
        return None
    op = op_for(spec["op"], spec.get("params") or {})
    watcher = CopyWatcher(device)
    measured = sections.records()  # this extra run must not replace the measured sections
    try:
        with watcher:
            op.run(body.inputs, ctx)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception:
        return None
    finally:
        sections.restore(measured)
    return watcher.report()


def apply_allocator(settings: dict[str, Any]) -> str:
    """Set the spec's allocator options before CUDA starts; return the conf string in use."""
    conf = allocator.conf_string(settings)
    allocator.set_env(conf)
    # The env var is read when CUDA's allocator first starts. Where this torch read it
    # earlier, set the options that can change at run time as well (not the backend).
    runtime = ",".join(p for p in conf.split(",") if p and not p.startswith("backend:"))
    setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if runtime and setter is not None and torch.cuda.is_available():
        setter(runtime)
    return allocator.current_conf()


def init_device(device: torch.device) -> None:
    """Start CUDA (context, allocator) before any figure is read, with PyTorch's own errors."""
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.set_device(device)
        torch.empty(0, device=device)


def run_op(
    op: Op, inputs: Inputs, ctx: OpContext, spec: dict[str, Any], meter: Meter
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    warmup, repeat = int(spec.get("warmup", 1)), int(spec.get("repeat", 3))
    if op.runs_once:
        warmup, repeat = 0, 1
    outputs: tuple[torch.Tensor, ...] = ()
    for _ in range(warmup):
        outputs = ()  # drop the last output first: the peak shows one call's needs
        outputs = as_tuple(call(op.run, inputs, ctx))
    meter.sync()
    times: list[float] = []
    use_events = ctx.device.type == "cuda"
    for _ in range(repeat):
        outputs = ()
        if use_events:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            outputs = as_tuple(call(op.run, inputs, ctx))
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            outputs = as_tuple(call(op.run, inputs, ctx))
            times.append(time.perf_counter() - started)
    timing: dict[str, Any] = {
        "method": "cuda_events" if use_events else "perf_counter",
        "median_s": statistics.median(times) if times else None,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "repeats_s": times,
        "warmup": warmup,
        "repeat": repeat,
    }
    if op.bytes_moved is not None and timing["median_s"]:
        timing["bytes_per_s"] = op.bytes_moved(inputs, ctx) / timing["median_s"]
    return outputs, timing
