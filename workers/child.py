"""The child process's entry points: ``main`` runs one spec and reports it on the pipe,
``serve`` is a warm spare or a shared process waiting for its specs.

The runner forks this from a forkserver that imported torch but never touched CUDA, so
each experiment starts with an empty caching allocator and its own allocator settings.
A ``shared`` experiment may instead run in a long-lived child that served others before
it, emptied and checked in between (``serve``, workers/shared.py). The result goes back
over a pipe as JSON; the trace goes to a gzip NDJSON file. The experiment itself runs in
workers/experiment.py.
"""

from __future__ import annotations

import gc
import json
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

# The profiler imports torch._dynamo on its first start (over a second); importing it
# here lets the forkserver, which preloads this module, pay that once for all children.
import torch._dynamo
import torch.profiler

from vramlab import contract, wire
from vramlab.contract import ErrorType, Status
from vramlab.runspec import RunSpec
from workers import shared
from workers.device import Prepared, prepare
from workers.errors import error
from workers.experiment import Stages, run_experiment


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


def warm_models() -> None:
    """What a model's trial imports (transformers, its Auto classes, vramlab's model
    code), imported before the trial arrives: seconds a trial no longer waits for. Only
    modules: nothing is built or allocated, so the trial still starts clean."""
    import transformers
    import transformers.initialization

    for name in ("AutoConfig", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM"):
        getattr(transformers, name)
    import workers.models.build
    import workers.models.report
    import workers.models.steps  # noqa: F401


def serve(device: str, conn: Connection, models: bool = False) -> None:
    """A warm child: start the device, then run the specs the runner sends on the pipe.
    ``models``: a model's warm child, with what a model's trial imports already imported;
    it says so on the pipe (``{"warm": true}``) before it waits for its spec.

    A clean spec is the child's only one: it exits after the result. A shared spec makes
    it a shared process: after each result it empties and checks itself
    (workers/shared.py), tells the runner whether it can serve again, and waits for the
    next spec. EOF on the pipe means the runner retired it.
    """
    if models:
        warm_models()
    gc.freeze()
    # An op's spare makes its context with one hardware queue (twice as fast); a model's
    # child keeps the driver's default, as its trials may overlap streams (NCCL, offload).
    prepared = prepare(torch.device(device), queue_of_one=not models)
    if models:  # the runner keeps it for a trial only once it says so
        try:
            conn.send_bytes(json.dumps({"warm": True}).encode())
        except OSError:  # the runner retired it meanwhile
            return
    baseline: shared.Baseline | None = None
    runs = 0
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        spec_wire, trace_path, t0_ns, handed_at = json.loads(message)
        spec = RunSpec.from_wire(spec_wire)
        if not spec.shared or prepared.error is not None:
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
    spec: RunSpec | dict[str, Any],
    conn: Connection,
    trace_path: str | None,
    t0_ns: int,
    prepared: Prepared | None = None,
    handed_at: float | None = None,
    runs_before: int | None = None,
) -> dict[str, Any]:
    """Run one spec (a RunSpec, or its wire form from the runner's arguments) and send
    its outcome on ``conn``; return what was sent.
    ``runs_before``: in a shared process, how many experiments it ran before this one."""
    # Everything inherited from the forkserver (torch's modules) is long-lived: freezing it
    # keeps the collector from scanning it (a gc.collect() here took 0.17 s otherwise).
    gc.freeze()
    stages = Stages()
    if handed_at is not None:
        # perf_counter is CLOCK_MONOTONIC, one clock for every process of the host.
        stages.times["handoff"] = stages.last - handed_at
    try:
        if not isinstance(spec, RunSpec):
            spec = RunSpec.from_wire(spec)
        payload = run_experiment(
            spec, Path(trace_path) if trace_path else None, t0_ns, prepared, stages, runs_before
        )
        # What the API will accept, checked here: a field nobody declared is our bug.
        payload = wire.dump(payload)
        wire.load(contract.Outcome, payload)
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
