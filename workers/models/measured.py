"""One process's model steps, measured: each phase inside a section (its own allocated
and reserved peaks), then one more step under the category tally, which finds what held
memory at its peak; the figures reported are the plain steps', untouched by the tally.
The ``model`` op runs this in its child, and each rank of a distributed run in its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from workers import sections
from workers.models import finetune, parallel
from workers.models.build import Built
from workers.models.steps import run_step, tally_step, tokens_per_step
from workers.models.tally import BLOCK, rounded

SECTION = "model.step{step}.{phase}.{n}"  # a phase's section; n counts micro-batches
MAX_NAMES = 64  # trainable parameters named in a result (blocks' indices already folded)


def measure(built: Built, device: torch.device) -> dict[str, Any]:
    """Run the spec's steps and the tally step; the raw record workers/models/report.py
    reads (with the sections' figures)."""
    cuda = device.type == "cuda"
    phases: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for step in range(1, built.params.steps + 1):
        counts: dict[str, int] = {}

        @contextmanager
        def phase(name: str, step: int = step, counts: dict[str, int] = counts) -> Iterator[None]:
            counts[name] = counts.get(name, 0) + 1
            key = SECTION.format(step=step, phase=name, n=counts[name])
            started = time.perf_counter()
            with sections.section(key, device):
                yield
            phases.append(
                {
                    "step": step,
                    "name": name,
                    "section": key,
                    "wall_s": time.perf_counter() - started,
                    "peak_reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
                }
            )

        _sync(device)
        if step == 2:
            _settle_collectives(built, device)
        started = time.perf_counter()
        run_step(built, phase)
        _sync(device)
        steps.append({"step": step, "wall_s": time.perf_counter() - started})
    trainable_count, trainable_names = finetune.trainable(built.model)
    buckets = [b.untyped_storage().nbytes() for b in parallel.buckets(built.model)]
    return {
        "model": built.resolved.name,
        "model_type": built.resolved.model_type,
        "task": built.task,
        # a sharded parameter (DTensor) counts its whole shape here, its shard below
        "parameter_count": sum(p.numel() for p in built.model.parameters()),
        "parameter_bytes": _bytes(built.parameters(), device),
        "gradient_bytes": _bytes(built.gradients(), device),
        "optimizer_state_bytes": _bytes(
            [t for t in built.optimizer_state() if t.device == device], device
        ),
        "bucket_bytes": sum(rounded(n, BLOCK if cuda else 1) for n in buckets) or None,
        "trainable_parameter_count": trainable_count,
        "trainable_parameters": trainable_names[:MAX_NAMES],
        "paged_optimizer_state_bytes": sum(
            t.untyped_storage().nbytes() for t in built.paged_state()
        )
        or None,
        "batch_size": built.batch_size,
        "tokens_per_step": tokens_per_step(built),
        "phases": phases,
        "steps": steps,
        "tally": _tally(built, device),
    }


def _tally(built: Built, device: torch.device) -> dict[str, Any]:
    """One more step under the category tally: what held memory at its peak."""
    peak = tally_step(built, BLOCK if device.type == "cuda" else 1)
    _sync(device)
    return {"peak": peak.bytes, "phase": peak.phase, "categories": peak.categories}


def _bytes(tensors: list[torch.Tensor], device: torch.device) -> int:
    """The bytes these tensors' storages hold (each storage once), as the allocator
    counts them (rounded to its blocks on CUDA)."""
    block = BLOCK if device.type == "cuda" else 1
    sizes = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(rounded(n, block) for n in sizes.values())


# How long step 2 waits, under DDP on CUDA, for the process group to let go of step 1's
# finished all-reduces: several turns of NCCL's watchdog thread (100 ms each in torch 2.11).
SETTLE_S = 0.35


def _settle_collectives(built: Built, device: torch.device) -> None:
    """DDP rebuilds its gradient buckets as step 2 starts and frees the old ones, but NCCL's
    process group holds the tensors of each all-reduce until its watchdog thread sees the
    work end; a step 2 that starts before then holds both sets of buckets (one run in four
    ranks on four H200s did). From step 3 on nothing is rebuilt, so a training loop's steady
    state holds one set: step 2 starts once the watchdog has had its turns."""
    plan = built.params.parallel
    if device.type == "cuda" and plan is not None and plan.strategy == "ddp":
        time.sleep(SETTLE_S)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
