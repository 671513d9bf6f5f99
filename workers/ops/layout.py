"""Layout ops, concatenation and copies (catalog families layout and copies)."""

import math

import torch

from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, main_input, torch_dtype


def _transpose(i: Inputs, c: OpContext) -> Outputs:
    return i["a"].transpose(c.params["dim0"], c.params["dim1"]).contiguous()


def _permute(i: Inputs, c: OpContext) -> Outputs:
    dims = c.params.get("dims") or list(reversed(range(i["a"].dim())))
    out = i["a"].permute(*dims)
    return out.contiguous() if c.params.get("contiguous") else out


def _reshape(i: Inputs, c: OpContext) -> Outputs:
    a = i["a"].transpose(0, 1) if c.params.get("transpose_first") else i["a"]
    new = tuple(c.params["new_shape"])
    # view raises on a non-contiguous a (PyTorch's own error is the answer); reshape copies.
    return a.view(new) if c.params["method"] == "view" else a.reshape(new)


def _dense_with_nnz(ctx: OpContext) -> torch.Tensor:
    numel = math.prod(ctx.shape)
    nnz = round(numel * ctx.params["density"])
    flat = torch.zeros(numel, dtype=ctx.dtype, device=ctx.device)
    flat[:nnz] = 1
    return flat.reshape(ctx.shape)


def _sparse_setup(ctx: OpContext) -> Inputs:
    return {"sparse": _dense_with_nnz(ctx).to_sparse().coalesce()}


def _narrow(i: Inputs, c: OpContext) -> Outputs:
    p = c.params
    base = filled(c.shape, c.dtype, c.device)
    piece = base.narrow(p["dim"], p["start"], p["length"])
    # Without clone the view is all that names the base, and it keeps all of it alive.
    return piece.clone() if p["clone"] else piece


def _parts(ctx: OpContext) -> Inputs:
    return {f"t{k}": filled(ctx.shape, ctx.dtype, ctx.device) for k in range(ctx.params["count"])}


def _expand(i: Inputs, c: OpContext) -> Outputs:
    out = i["a"].expand(*c.params["sizes"])
    return out.contiguous() if c.params.get("contiguous") else out


def _to_dtype_setup(ctx: OpContext) -> Inputs:
    return {"source": filled(ctx.shape, torch_dtype(ctx.params["source_dtype"]), ctx.device)}


OPS = {
    "transpose_contiguous": Op(main_input, _transpose),
    "permute": Op(main_input, _permute),
    "reshape": Op(main_input, _reshape),
    "channels_last": Op(main_input, lambda i, _: i["a"].to(memory_format=torch.channels_last)),
    "to_sparse": Op(lambda c: {"a": _dense_with_nnz(c)}, lambda i, _: i["a"].to_sparse()),
    "to_dense": Op(_sparse_setup, lambda i, _: i["sparse"].to_dense()),
    "narrow": Op(lambda _: {}, _narrow),
    "cat": Op(_parts, lambda i, c: torch.cat(list(i.values()), dim=c.params["dim"])),
    "stack": Op(_parts, lambda i, c: torch.stack(list(i.values()), dim=c.params["dim"])),
    "clone": Op(main_input, lambda i, _: i["a"].clone()),
    "expand": Op(main_input, _expand),
    "repeat": Op(main_input, lambda i, c: i["a"].repeat(*c.params["repeats"])),
    "to_dtype": Op(_to_dtype_setup, lambda i, c: i["source"].to(c.dtype)),
}
