"""Element-wise ops and reductions (catalog families elementwise and reduction)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, main_input, two_operands


def _where_setup(ctx: OpContext) -> Inputs:
    inputs = two_operands(ctx)
    return {"cond": torch.ones(ctx.shape, dtype=torch.bool, device=ctx.device), **inputs}


def _reduce(fn: str) -> Callable[[Inputs, OpContext], Outputs]:
    def run(i: Inputs, c: OpContext) -> Outputs:
        dim, keep = c.params.get("dim"), bool(c.params.get("keepdim"))
        t = i["a"]
        if dim is None:
            out = getattr(t, fn)()
            return out.reshape((1,) * t.dim()) if keep else out
        return getattr(t, fn)(dim=dim, keepdim=keep)

    return run


def _layer_norm_setup(ctx: OpContext) -> Inputs:
    inputs = main_input(ctx)
    if ctx.params.get("affine"):
        d = ctx.shape[-1]
        inputs["weight"] = filled((d,), ctx.dtype, ctx.device)
        inputs["bias"] = torch.zeros(d, dtype=ctx.dtype, device=ctx.device)
    return inputs


def _layer_norm(i: Inputs, c: OpContext) -> Outputs:
    return F.layer_norm(i["a"], (c.shape[-1],), i.get("weight"), i.get("bias"))


OPS = {
    "add": Op(two_operands, lambda i, _: i["a"] + i["b"]),
    "mul": Op(two_operands, lambda i, _: i["a"] * i["b"]),
    # In place: the result is a itself (returned so the runner sees it is no new tensor).
    "add_": Op(two_operands, lambda i, _: i["a"].add_(i["b"])),
    "mul_": Op(two_operands, lambda i, _: i["a"].mul_(i["b"])),
    "relu": Op(main_input, lambda i, _: torch.relu(i["a"])),
    "relu_": Op(main_input, lambda i, _: torch.relu_(i["a"])),
    "exp": Op(main_input, lambda i, _: torch.exp(i["a"])),
    "sigmoid": Op(main_input, lambda i, _: torch.sigmoid(i["a"])),
    "where": Op(_where_setup, lambda i, _: torch.where(i["cond"], i["a"], i["b"])),
    "sum": Op(main_input, _reduce("sum")),
    "mean": Op(main_input, _reduce("mean")),
    "softmax": Op(main_input, lambda i, c: torch.softmax(i["a"], dim=c.params["dim"])),
    "layer_norm": Op(_layer_norm_setup, _layer_norm),
}
