"""Device and dtype questions: the dtype support matrix, and inputs on two devices."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from vramlab.catalog.dtypes import DTYPES
from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, torch_dtype

_COLUMNS: dict[str, Callable[[torch.Tensor], Any]] = {
    "add": lambda t: t + t,
    "mul": lambda t: t * t,
    "sum": lambda t: t.sum(),
    "matmul": lambda t: t @ t,
    "exp": torch.exp,
    "relu": torch.relu,
    "softmax": lambda t: torch.softmax(t, -1),
    "sort": torch.sort,
    "to_float32": lambda t: t.float(),
}


def _cell(fn: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    try:
        value = fn()
        return value, {"ok": True}
    except Exception as exc:  # the matrix reports PyTorch's exact words
        first = (str(exc) or type(exc).__name__).strip().splitlines()[0][:400]
        return None, {"ok": False, "exception": type(exc).__name__, "error": first}


def _moved(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return filled(shape, dtype, "cpu").to(device)


def _row(name: str, square: tuple[int, int], device: torch.device) -> dict[str, Any]:
    dtype = torch_dtype(name)
    row: dict[str, Any] = {}
    _, row["create"] = _cell(partial(filled, square, dtype, device))
    moved, row["move"] = _cell(partial(_moved, square, dtype, device))
    for column, fn in _COLUMNS.items():
        if moved is None:
            row[column] = {"ok": False, "exception": None, "error": "skipped: no tensor"}
            continue
        _, row[column] = _cell(partial(fn, moved))
    return row


def _matrix(inputs: Inputs, ctx: OpContext) -> Outputs:
    n = max(ctx.shape[-1] if ctx.shape else 8, 1)
    square = (n, n)
    matrix: dict[str, dict[str, Any]] = {}
    with warnings.catch_warnings():
        # Casting complex to float32 warns that it drops the imaginary part: a cell, not news.
        warnings.simplefilter("ignore", UserWarning)
        for name in DTYPES:
            matrix[name] = _row(name, square, ctx.device)

    moves_but_fails = {
        d: sorted(c for c, cell in row.items() if not cell["ok"])
        for d, row in matrix.items()
        if row["move"]["ok"] and not all(cell["ok"] for cell in row.values())
    }
    ctx.extras["dtype_support"] = {
        "device": str(ctx.device),
        "columns": ["create", "move", *_COLUMNS],
        "matrix": matrix,
        "moves_but_some_ops_fail": moves_but_fails,
        "note": "support differs by op, not only by transfer: a dtype that moves to the device "
        "may still have no kernel for an op there",
    }
    return None


def _mixed_setup(ctx: OpContext) -> Inputs:
    case = ctx.params["case"]
    if case == "module_on_cpu":
        n = ctx.shape[-1]
        module = nn.Linear(n, n).to(ctx.dtype)  # left on the CPU, as in the article
        ctx.state["module"] = module
        inputs = {"x": filled(ctx.shape, ctx.dtype, ctx.device)}
        inputs.update({f"param:{k}": v.data for k, v in module.named_parameters()})
    elif case == "cpu_scalar":
        inputs = {
            "a": filled(ctx.shape, ctx.dtype, ctx.device),
            "b": torch.tensor(2, dtype=ctx.dtype),
        }
    else:
        inputs = {
            "a": filled(ctx.shape, ctx.dtype, ctx.device),
            "b": filled(ctx.shape, ctx.dtype, ctx.params["other_device"]),
        }
    ctx.extras["input_devices"] = {k: str(v.device) for k, v in inputs.items()}
    return inputs


def _mixed_run(inputs: Inputs, ctx: OpContext) -> Outputs:
    if ctx.params["case"] == "module_on_cpu":
        out: torch.Tensor = ctx.state["module"](inputs["x"])
        return out
    out = inputs["a"] + inputs["b"]
    if ctx.params["case"] == "cpu_scalar":
        ctx.extras["allowed"] = (
            "PyTorch allows a 0-dim CPU tensor with a tensor on another device: it is read "
            "as a scalar and passed to the kernel, no copy of a tensor is made"
        )
    return out


OPS = {
    "dtype_support": Op(lambda _: {}, _matrix, probe=False),
    "mixed_device": Op(_mixed_setup, _mixed_run),
}
