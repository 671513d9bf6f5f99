"""The ops a worker can run: one small entry per catalog op (app/catalog/entries.py).

An op is two functions. ``setup`` makes the inputs (the set-up phase); ``run`` does the
work once and returns the outputs (the op phase calls it warmup + repeat times). Adding
an op is one entry here and one in the catalog, with the same name and params.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

Inputs = dict[str, torch.Tensor]
Outputs = torch.Tensor | tuple[torch.Tensor, ...] | None


@dataclass(frozen=True)
class OpContext:
    """The parts of a spec an op needs, already turned into torch objects."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Op:
    setup: Callable[[OpContext], Inputs]
    run: Callable[[Inputs, OpContext], Outputs]
    # Bytes one call moves, for a bandwidth figure (transfers); None where it means nothing.
    bytes_moved: Callable[[Inputs, OpContext], int] | None = None


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {name!r}")
    return dtype


def _filled(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, pin_memory: bool = False
) -> torch.Tensor:
    # ones rather than randn: it works for every dtype (ints, bool, float8), and the
    # values do not change the bytes an op holds.
    return torch.ones(shape, dtype=dtype, device=device, pin_memory=pin_memory)


def _no_inputs(ctx: OpContext) -> Inputs:
    return {}


def _two_operands(ctx: OpContext) -> Inputs:
    other = ctx.params.get("other_shape")
    other_shape = tuple(other) if other is not None else ctx.shape
    return {
        "a": _filled(ctx.shape, ctx.dtype, ctx.device),
        "b": _filled(other_shape, ctx.dtype, ctx.device),
    }


def _to_setup(ctx: OpContext) -> Inputs:
    source_dtype = ctx.params.get("source_dtype")
    dtype = torch_dtype(source_dtype) if source_dtype else ctx.dtype
    source_device = ctx.params.get("source_device") or "cpu"
    pin = bool(ctx.params.get("pin_memory"))
    return {"source": _filled(ctx.shape, dtype, source_device, pin_memory=pin)}


def _to_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    return inputs["source"].to(
        ctx.device,
        ctx.dtype,
        non_blocking=bool(ctx.params.get("non_blocking")),
        copy=bool(ctx.params.get("copy")),
    )


def _sleep_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    held = torch.empty(ctx.shape, dtype=ctx.dtype, device=ctx.device)
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    return held


def _abort_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    # A real crash (SIGABRT), not an exception: the runner must survive it.
    os.abort()


OPS: dict[str, Op] = {
    "empty": Op(_no_inputs, lambda _, c: torch.empty(c.shape, dtype=c.dtype, device=c.device)),
    "randn": Op(_no_inputs, lambda _, c: torch.randn(c.shape, dtype=c.dtype, device=c.device)),
    "add": Op(_two_operands, lambda i, _: i["a"] + i["b"]),
    "matmul": Op(_two_operands, lambda i, _: torch.matmul(i["a"], i["b"])),
    "to": Op(_to_setup, _to_run, bytes_moved=lambda i, _: i["source"].nbytes),
    "sleep": Op(_no_inputs, _sleep_run),
    "abort": Op(_no_inputs, _abort_run),
}


def as_tuple(outputs: Outputs) -> tuple[torch.Tensor, ...]:
    if outputs is None:
        return ()
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs)
