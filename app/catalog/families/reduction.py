"""Reductions and normalisation: sum, mean, softmax, layer_norm."""

from app.catalog.families.common import (
    DIM,
    FLOAT,
    NUMERIC,
    REAL_FLOAT,
    REQUIRES_GRAD,
    Params,
    Shape,
    main_input,
    one_out,
)
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import norm_dim

_REDUCE_DIM = Param("dim", "int", "the dim to reduce (default: all dims)", minimum=-8, maximum=7)
_KEEPDIM = Param("keepdim", "bool", "keep the reduced dim with size 1", default=False)


def _reduce(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    dim, keep = params.get("dim"), params.get("keepdim")
    if dim is None:
        out: Shape = tuple(1 for _ in shape) if keep else ()
    else:
        d = norm_dim(dim, len(shape), "params.dim")
        kept = (1 if i == d else n for i, n in enumerate(shape))
        out = tuple(kept) if keep else tuple(n for i, n in enumerate(shape) if i != d)
    # sum of an integer or bool tensor is int64 in PyTorch; mean needs floating inputs.
    out_dtype = "int64" if dtype in ("bool", "uint8", "int8", "int16", "int32") else dtype
    return one_out(out, out_dtype, device, main_input(shape, dtype, device))


def _softmax(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    norm_dim(params["dim"], len(shape), "params.dim")
    return one_out(shape, dtype, device, main_input(shape, dtype, device))


def _layer_norm(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    if not shape:
        raise CatalogError("shape", "layer_norm needs at least 1 dim")
    d = shape[-1]
    inputs = [main_input(shape, dtype, device)]
    if params["affine"]:
        inputs += [
            TensorSpec("weight", (d,), dtype, device),
            TensorSpec("bias", (d,), dtype, device),
        ]
    return one_out(shape, dtype, device, *inputs)


ENTRIES = (
    OpEntry(
        name="sum",
        summary="torch.sum(a, dim, keepdim); ints sum to int64",
        plan_fn=_reduce,
        params=(_REDUCE_DIM, _KEEPDIM, REQUIRES_GRAD),
        dtypes=NUMERIC,
        tags=("reduction",),
    ),
    OpEntry(
        name="mean",
        summary="torch.mean(a, dim, keepdim)",
        plan_fn=_reduce,
        params=(_REDUCE_DIM, _KEEPDIM, REQUIRES_GRAD),
        dtypes=FLOAT,
        tags=("reduction",),
    ),
    OpEntry(
        name="softmax",
        summary="torch.softmax(a, dim)",
        plan_fn=_softmax,
        params=(DIM, REQUIRES_GRAD),
        dtypes=REAL_FLOAT,
        min_dims=1,
        tags=("reduction", "normalisation"),
    ),
    OpEntry(
        name="layer_norm",
        summary="F.layer_norm over the last dim, with weight and bias when affine",
        plan_fn=_layer_norm,
        params=(
            Param(
                "affine", "bool", "with a weight and a bias of the last dim's size", default=True
            ),
            REQUIRES_GRAD,
        ),
        dtypes=REAL_FLOAT,
        min_dims=1,
        tags=("normalisation",),
    ),
)
