"""What every op shares: its context, its two functions, and small helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vramlab.runspec import ModelParams

Inputs = dict[str, torch.Tensor]
Outputs = torch.Tensor | tuple[torch.Tensor, ...] | None


@dataclass(frozen=True)
class OpContext:
    """The parts of a spec an op needs, already turned into torch objects."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    # The op's parameters as the catalog checked them (its own names: see its entry).
    params: Mapping[str, Any]
    # A model experiment's parameters (op ``model``), typed; None for every other op.
    model: ModelParams | None = None
    # What the op reports beyond the figures (JSON-able): lands in result["details"].
    extras: dict[str, Any] = field(default_factory=dict)
    # Objects the op keeps between set-up and runs (a module, an optimizer): not reported.
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    setup: Callable[[OpContext], Inputs]
    run: Callable[[Inputs, OpContext], Outputs]
    # Bytes one call moves, for a bandwidth figure (transfers); None where it means nothing.
    bytes_moved: Callable[[Inputs, OpContext], int] | None = None
    # Run once more under the copy watcher after the measured phases (placement.py).
    probe: bool = True
    # The op runs its own steps (a model experiment): called once, no warm-up, no repeats.
    runs_once: bool = False


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {name!r}")
    return dtype


def filled(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, pin_memory: bool = False
) -> torch.Tensor:
    # ones rather than randn: it works for every dtype (ints, bool, float8), and the
    # values do not change the bytes an op holds.
    return torch.ones(shape, dtype=dtype, device=device, pin_memory=pin_memory)


def no_inputs(ctx: OpContext) -> Inputs:
    return {}


def main_input(ctx: OpContext) -> Inputs:
    return {"a": filled(ctx.shape, ctx.dtype, ctx.device)}


def two_operands(ctx: OpContext) -> Inputs:
    other = ctx.params.get("other_shape")
    other_shape = tuple(other) if other is not None else ctx.shape
    return {
        "a": filled(ctx.shape, ctx.dtype, ctx.device),
        "b": filled(other_shape, ctx.dtype, ctx.device),
    }


def as_tuple(outputs: Outputs) -> tuple[torch.Tensor, ...]:
    if outputs is None:
        return ()
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs)


def storage_key(t: torch.Tensor) -> int:
    """The data pointer of a tensor's storage (views share their base's)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # sparse tensors have no single storage
        return 0
