"""The child process's side of one experiment: set up, run the op, measure, report.

The runner forks this from a forkserver that imported torch but never touched CUDA, so
each experiment starts with an empty caching allocator and its own allocator settings.
The result goes back over a pipe as JSON; the trace goes to a gzip NDJSON file.
"""

from __future__ import annotations

import gc
import json
import re
import statistics
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
import torch

# The profiler imports torch._dynamo on its first start (over a second); importing it
# here lets the forkserver, which preloads this module, pay that once for all children.
import torch._dynamo
import torch.profiler

from workers import allocator, notes
from workers.measure import Meter, PhaseRecord, fill_from_events
from workers.ops import OPS, Inputs, Op, OpContext, as_tuple, torch_dtype
from workers.probe import driver_version, host_info
from workers.tracer import Trace, make_tracer, write_events

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class OpFailure(Exception):
    """An exception that PyTorch raised inside an op's set-up or run (not a vramlab bug)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def main(spec: dict[str, Any], conn: Connection, trace_path: str | None, t0_ns: int) -> None:
    # Everything inherited from the forkserver (torch's modules) is long-lived: freezing it
    # keeps the collector from scanning it (a gc.collect() here took 0.17 s otherwise).
    gc.freeze()
    try:
        payload = run_experiment(spec, Path(trace_path) if trace_path else None, t0_ns)
    except BaseException as exc:  # a bug of ours: report it rather than die silently
        payload = {
            "status": "failed",
            "result": None,
            "trace_events": 0,
            "error": _error(
                "internal",
                exc,
                "a bug in vramlab's worker; please report it",
                {"traceback": traceback.format_exc()},
            ),
        }
    conn.send_bytes(json.dumps(payload, default=str).encode())
    conn.close()


def run_experiment(spec: dict[str, Any], trace_path: Path | None, t0_ns: int) -> dict[str, Any]:
    alloc_conf = apply_allocator(spec.get("allocator") or {})
    op = OPS[spec["op"]]
    device = torch.device(spec["device"])
    ctx = OpContext(
        tuple(spec["shape"]), torch_dtype(spec["dtype"]), device, spec.get("params") or {}
    )
    rss_before_init = psutil.Process().memory_info().rss
    try:
        _call(init_device, device)
    except OpFailure as failure:
        return {
            "status": "failed",
            "result": None,
            "trace_events": 0,
            "error": classify(failure.cause, spec),
        }

    rss_after_init = psutil.Process().memory_info().rss
    init_rss = (rss_before_init, rss_after_init) if device.type == "cuda" else None
    meter = Meter(device)
    tracer = make_tracer(str(device), spec.get("trace", "events"), t0_ns)
    tracer.start()
    inputs: Inputs = {}
    outputs: tuple[torch.Tensor, ...] = ()
    timing: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    try:
        with meter.phase("setup", tracer.phase("setup")):
            inputs = _call(op.setup, ctx)
        with meter.phase("op", tracer.phase("op")):
            outputs, timing = run_op(op, inputs, ctx, spec, meter)
        with meter.phase("after", tracer.phase("after")):
            gc.collect()  # what stays now is what the outputs (and inputs) hold
    except OpFailure as failure:
        error = classify(failure.cause, spec)
    trace = tracer.stop()
    if device.type == "cpu":
        fill_from_events(meter.phases, trace.events, "cpu")

    result = build_result(spec, meter.phases, inputs, outputs, timing, trace, alloc_conf)
    if error is not None and error["type"] == "oom":
        error["details"].update(_oom_details(error["message"], meter.phases))
    result["notes"] = notes.write(spec, result, trace.events, error, init_rss)
    count = 0
    if spec.get("trace", "events") == "none":
        # The CPU profiler ran for the figures, but nothing was asked to be kept.
        result["trace"] = {"source": "none", "events": 0, "truncated": False}
    elif trace_path is not None:
        count = write_events(trace_path, trace.events)
    if error is not None:
        # An OOM's figures are worth keeping; other failures' are not results.
        kept = result if error["type"] == "oom" else None
        return {"status": "failed", "result": kept, "error": error, "trace_events": count}
    return {"status": "succeeded", "result": result, "error": None, "trace_events": count}


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
    outputs: tuple[torch.Tensor, ...] = ()
    for _ in range(warmup):
        outputs = ()  # drop the last output first: the peak shows one call's needs
        outputs = as_tuple(_call(op.run, inputs, ctx))
    meter.sync()
    times: list[float] = []
    use_events = ctx.device.type == "cuda"
    for _ in range(repeat):
        outputs = ()
        if use_events:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            outputs = as_tuple(_call(op.run, inputs, ctx))
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            outputs = as_tuple(_call(op.run, inputs, ctx))
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


def build_result(
    spec: dict[str, Any],
    phases: list[PhaseRecord],
    inputs: Inputs,
    outputs: tuple[torch.Tensor, ...],
    timing: dict[str, Any] | None,
    trace: Trace,
    alloc_conf: str,
) -> dict[str, Any]:
    by_name = {p.name: p for p in phases}
    # "before"/"after" bound the op phase; an OOM leaves the last phase reached instead.
    op = by_name.get("op") or (phases[-1] if phases else PhaseRecord("op"))
    before, after = op.start, op.end
    memory = {
        "allocated_before": before.allocated,
        "allocated_after": after.allocated,
        "allocated_peak": op.allocated_peak,
        "reserved_before": before.reserved,
        "reserved_after": after.reserved,
        "reserved_peak": op.reserved_peak,
        "delta_allocated": (
            after.allocated - before.allocated
            if after.allocated is not None and before.allocated is not None
            else None
        ),
        "host_rss_before": before.host_rss,
        "host_rss_after": after.host_rss,
        "device_used_before": before.device_used,
        "device_used_after": after.device_used,
    }
    input_ptrs = {t.untyped_storage().data_ptr() for t in inputs.values()}
    names = [o["name"] for o in (spec.get("prediction") or {}).get("outputs", [])]
    out_names = names if len(names) == len(outputs) else [f"out{i}" for i in range(len(outputs))]
    return {
        "memory": memory,
        "phases": [p.as_dict() for p in phases],
        "timing": timing,
        "environment": environment(spec["device"], alloc_conf),
        "prediction": spec.get("prediction"),
        "inputs": [_describe(n, t, set()) for n, t in inputs.items()],
        "outputs": [_describe(n, t, input_ptrs) for n, t in zip(out_names, outputs, strict=True)],
        "notes": [],
        "trace": {
            "source": trace.source,
            "events": len(trace.events),
            "truncated": trace.truncated,
        },
    }


def environment(device: str, alloc_conf: str) -> dict[str, Any]:
    env = host_info()
    gpu_name, gpu_total = None, None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        gpu_name, gpu_total = props.name, int(props.total_memory)
    # No nvidia-smi here: a subprocess per experiment is slow; the runner fills it in.
    driver = driver_version(allow_subprocess=False) if device.startswith("cuda") else None
    return {
        **env,
        "gpu_name": gpu_name,
        "gpu_total_memory": gpu_total,
        "driver": driver,
        "allocator_conf": alloc_conf,
        "device": device,
    }


def classify(exc: BaseException, spec: dict[str, Any]) -> dict[str, Any]:
    """Turn an exception raised by PyTorch in an op into one of our error types."""
    message = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in message:
        return _error(
            "oom",
            exc,
            "use a smaller shape or dtype, or free memory on the device",
            {"exception": type(exc).__name__},
        )
    if isinstance(
        exc, RuntimeError | NotImplementedError | TypeError | ValueError | AssertionError
    ):
        hint = (
            f"op {spec['op']!r} with dtype {spec['dtype']!r} is not supported on "
            f"{spec['device']!r} by this PyTorch build; the message is PyTorch's own"
        )
        return _error("unsupported_on_device", exc, hint, {"exception": type(exc).__name__})
    return _error(
        "internal",
        exc,
        "a bug in vramlab's worker; please report it",
        {"exception": type(exc).__name__, "traceback": traceback.format_exc()},
    )


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise OpFailure(exc) from exc


def _error(
    kind: str, exc: BaseException, hint: str | None, details: dict[str, Any]
) -> dict[str, Any]:
    return {
        "type": kind,
        "message": str(exc) or type(exc).__name__,
        "hint": hint,
        "details": details,
    }


def _describe(name: str, t: torch.Tensor, input_ptrs: set[int]) -> dict[str, Any]:
    ptr = t.untyped_storage().data_ptr()
    return {
        "name": name,
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "bytes": t.nbytes,
        # Same storage as an input: a view or the input itself (Tensor.to with no change).
        "is_view_of_input": ptr != 0 and ptr in input_ptrs,
    }


def _oom_details(message: str, phases: list[PhaseRecord]) -> dict[str, Any]:
    details: dict[str, Any] = {"requested_bytes": None, "requested_is_approximate": False}
    exact = re.search(r"tried to allocate (\d+) bytes", message)
    rounded = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message)
    if exact:
        details["requested_bytes"] = int(exact.group(1))
    elif rounded:
        # The CUDA message rounds to two decimals of its unit.
        details["requested_bytes"] = int(float(rounded.group(1)) * _UNITS[rounded.group(2)])
        details["requested_is_approximate"] = True
    last = phases[-1] if phases else None
    details["allocated_bytes"] = last.end.allocated if last else None
    details["reserved_bytes"] = last.end.reserved if last else None
    details["phase"] = last.name if last else None
    return details
