"""A distributed model experiment: N ranks, each a process of its own on its own device,
run as one experiment (params.distributed; docs/models.md, "Several GPUs of one host").

The experiment's child starts the ranks (fresh interpreters, ``python -m
workers.models.ranks``: a forked CUDA context cannot be used, the child has started one,
and a daemonic child may not have multiprocessing children). Each joins a process group
over a file store in a temporary folder (NCCL on CUDA, rank r on cuda:r; gloo on the
CPU), builds the model and wraps it (workers/models/parallel.py), and measures its own
steps as a single-device experiment does (workers/models/measured.py; on the CPU through
its own profiler). Each
writes its figures, or its error, to a file the child reads. Out of memory on any rank is
the experiment's answer: the child stops the other ranks and fails with ``oom`` naming
the rank (``memory_limit`` where the service's cap stopped it). An emulated card
(``capacity_bytes``) is every rank's: each rank's allocator is capped at it on CUDA.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vramlab.runspec import Distributed, ModelParams
from workers import limits

# What a CUDA rank's allocator is held to: the service's byte cap, or the emulated card
# (params.capacity_bytes) where it binds first, the same on every rank (the child's own
# limit is per process; on the CPU the ranks inherit its data limit, and the emulated card
# is judged against each rank's measured peak after the run).
CAP_ENV = "VRAMLAB_RANK_CAP_BYTES"
# How long a rank waits on the others at a collective before giving up (a rank that
# died leaves the rest waiting: the child stops them first, this is the backstop).
COLLECTIVE_TIMEOUT_S = 300


def run(params: ModelParams, device: torch.device) -> dict[str, Any]:
    """Run every rank; the raw record of each (report.finish merges them)."""
    plan = params.parallel
    assert plan is not None
    with tempfile.TemporaryDirectory(prefix="vramlab-ranks-") as folder:
        where = Path(folder)
        (where / "params.json").write_text(json.dumps(params.wire()))
        # The experiment's child is a daemonic process (no multiprocessing children):
        # the ranks are interpreters of their own, started as the worker was.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, *_pythonpath()])}
        limit = limits.active()
        if limit is not None and device.type == "cuda":  # the same card on each GPU
            env[CAP_ENV] = str(limit.cap)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "workers.models.ranks", str(r), device.type, folder],
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for r in range(plan.gpus)
        ]
        try:
            while any(p.poll() is None for p in procs):
                if any(p.returncode not in (None, 0) for p in procs):
                    break  # one rank failed: the others would wait on it
                time.sleep(0.2)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        if any(p.returncode != 0 for p in procs):
            codes = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
            raise _failure(where, plan, codes)
        ranks = [_read(where / f"rank{r}.json") for r in range(plan.gpus)]
    return {"distributed": _plan_wire(plan), "ranks": ranks}


_ROOT = str(Path(__file__).resolve().parents[2])


def _pythonpath() -> list[str]:
    value = os.environ.get("PYTHONPATH")
    return value.split(os.pathsep) if value else []


def _plan_wire(plan: Distributed) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": plan.strategy, "gpus": plan.gpus}
    if plan.strategy == "fsdp":
        out.update(
            sharding=plan.sharding,
            offload_optimizer=plan.offload_optimizer,
            mixed_precision=plan.mixed_precision,
        )
    return out


def _read(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text())
    return out


class RankOutOfMemory(torch.OutOfMemoryError):
    """Out of memory on one rank of a distributed run: which rank, on which device, and
    (on CUDA) what its allocator reserved and what its device had free as it failed."""

    def __init__(self, message: str, error: dict[str, Any], gpus: int) -> None:
        super().__init__(message)
        self.rank: int = error["rank"]
        self.gpus = gpus
        self.device: str = error["device"]
        self.reserved_bytes: int | None = error.get("reserved_bytes")
        self.free_bytes: int | None = error.get("free_bytes")


def _failure(where: Path, plan: Distributed, codes: dict[int, int]) -> Exception:
    """The first rank's error as the experiment's: out of memory on any rank first."""
    errors = [
        _read(where / f"rank{r}.error.json")
        for r in range(plan.gpus)
        if (where / f"rank{r}.error.json").exists()
    ]
    oom = [e for e in errors if e["oom"]]
    if oom:
        first = oom[0]
        return RankOutOfMemory(
            f"rank {first['rank']} of {plan.gpus} ({first['device']}) ran out of memory: "
            f"{first['message']}",
            first,
            plan.gpus,
        )
    if errors:
        first = errors[0]
        return RuntimeError(
            f"rank {first['rank']} of {plan.gpus} failed: {first['type']}: {first['message']}"
        )
    return RuntimeError(f"ranks ended without a result (rank: exit code): {codes}")


def _rank(rank: int, device_type: str, folder: str) -> None:
    """One rank: join the group, build and wrap, measure, write the figures."""
    from workers import sections
    from workers.models import report
    from workers.models.build import build
    from workers.models.measured import measure
    from workers.tracer import make_tracer

    where = Path(folder)
    params = ModelParams.from_wire(json.loads((where / "params.json").read_text()))
    plan = params.parallel
    assert plan is not None
    cuda = device_type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        cap = int(os.environ.get(CAP_ENV) or 0)
        if cap:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    else:
        torch.set_num_threads(1)  # N ranks share the host's cores
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"file://{where / 'store'}",
        rank=rank,
        world_size=plan.gpus,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        device_id=device if cuda else None,
    )
    try:
        # The CPU's figures come from its profiler's memory events; CUDA's from counters.
        tracer = make_tracer(str(device), "none" if cuda else "events", time.time_ns())
        tracer.start()
        built = build(params, device)
        raw = measure(built, device)
        trace = tracer.stop()
        if not cuda:
            sections.fill_cpu(trace.sections, trace.events)
        result: dict[str, Any] = {}
        report.finish(result, {report.RAW: raw}, sections.records())
        out = {
            "rank": rank,
            "device": str(device),
            "model": result["model"],
            "categories": result["categories"],
            "bucket_bytes": raw["bucket_bytes"],
        }
        (where / f"rank{rank}.json").write_text(json.dumps(out))
    except BaseException as exc:
        oom = isinstance(exc, torch.OutOfMemoryError | MemoryError)
        error = {
            "rank": rank,
            "device": str(device),
            "oom": oom,
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
        }
        if oom and cuda:  # what the emulated card's judgement needs, read in this rank
            error["reserved_bytes"] = torch.cuda.memory_reserved(device)
            error["free_bytes"] = torch.cuda.mem_get_info(device)[0]
        (where / f"rank{rank}.error.json").write_text(json.dumps(error))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _orphaned(parent: int) -> None:
    """End this rank once the experiment's child is gone (killed at its time limit)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


if __name__ == "__main__":
    threading.Thread(target=_orphaned, args=(os.getppid(),), daemon=True).start()
    _rank(int(sys.argv[1]), sys.argv[2], sys.argv[3])
