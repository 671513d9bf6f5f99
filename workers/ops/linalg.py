"""Linear algebra and convolution (catalog families linalg and conv)."""

import torch
import torch.nn.functional as F

from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, main_input, two_operands


def _linear_setup(ctx: OpContext) -> Inputs:
    n_out = ctx.params["out_features"]
    inputs = {
        "x": filled(ctx.shape, ctx.dtype, ctx.device),
        "weight": filled((n_out, ctx.shape[-1]), ctx.dtype, ctx.device),
    }
    if ctx.params.get("bias"):
        inputs["bias"] = filled((n_out,), ctx.dtype, ctx.device)
    return inputs


def _einsum_setup(ctx: OpContext) -> Inputs:
    if "," in ctx.params["equation"].partition("->")[0]:
        return two_operands(ctx)
    return main_input(ctx)


def _einsum(i: Inputs, c: OpContext) -> Outputs:
    operands = [i["a"], i["b"]] if "b" in i else [i["a"]]
    return torch.einsum(c.params["equation"], *operands)


def _conv_setup(ctx: OpContext) -> Inputs:
    p = ctx.params
    out_c, k, groups = p["out_channels"], p["kernel_size"], p["groups"]
    # cudnn.benchmark is a process-wide switch: set here, in the experiment's own child.
    torch.backends.cudnn.benchmark = bool(p.get("cudnn_benchmark"))
    inputs = {
        "x": filled(ctx.shape, ctx.dtype, ctx.device),
        "weight": filled((out_c, ctx.shape[1] // groups, k, k), ctx.dtype, ctx.device),
    }
    if p.get("bias"):
        inputs["bias"] = filled((out_c,), ctx.dtype, ctx.device)
    return inputs


def _conv(i: Inputs, c: OpContext) -> Outputs:
    p = c.params
    return F.conv2d(
        i["x"], i["weight"], i.get("bias"), p["stride"], p["padding"], groups=p["groups"]
    )


OPS = {
    "matmul": Op(two_operands, lambda i, _: torch.matmul(i["a"], i["b"])),
    "bmm": Op(two_operands, lambda i, _: torch.bmm(i["a"], i["b"])),
    "linear": Op(_linear_setup, lambda i, _: F.linear(i["x"], i["weight"], i.get("bias"))),
    "einsum": Op(_einsum_setup, _einsum),
    "conv2d": Op(_conv_setup, _conv),
}
