"""Layout ops: copies that a layout change makes, and views that make none."""

import math

from app.catalog.families.common import ALL, REQUIRES_GRAD, Params, Shape, main_input, one_out
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import norm_dim

_DIM0 = Param("dim0", "int", "first dim to swap", default=0, minimum=-8, maximum=7)
_DIM1 = Param("dim1", "int", "second dim to swap", default=1, minimum=-8, maximum=7)


def _copy(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    return one_out(shape, dtype, device, main_input(shape, dtype, device))


def _transpose(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    d0 = norm_dim(params["dim0"], len(shape), "params.dim0")
    d1 = norm_dim(params["dim1"], len(shape), "params.dim1")
    out = list(shape)
    out[d0], out[d1] = out[d1], out[d0]
    return one_out(tuple(out), dtype, device, main_input(shape, dtype, device))


def _view_only(shape: Shape, out: Shape, dtype: str, device: str) -> TensorPlan:
    # A view shares the input's storage: it is an output that costs no new bytes.
    return TensorPlan(inputs=(main_input(shape, dtype, device),), outputs=())


def _permute(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    dims = params.get("dims") or list(reversed(range(len(shape))))
    if sorted(dims) != list(range(len(shape))):
        raise CatalogError("params.dims", f"must be a permutation of 0..{len(shape) - 1}")
    out = tuple(shape[d] for d in dims)
    if params["contiguous"]:
        return one_out(out, dtype, device, main_input(shape, dtype, device))
    return _view_only(shape, out, dtype, device)


def _reshape(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    new = tuple(params["new_shape"])
    if math.prod(new) != math.prod(shape):
        raise CatalogError("params.new_shape", f"{list(new)} holds a different number of elements")
    if params["transpose_first"] and len(shape) < 2:
        raise CatalogError("params.transpose_first", "needs at least 2 dims")
    transposed = (shape[1], shape[0], *shape[2:]) if len(shape) >= 2 else shape
    if params["transpose_first"] and params["method"] == "reshape" and new != transposed:
        # A transposed tensor is not contiguous: reshape must copy (view would fail).
        plan = one_out(new, dtype, device, main_input(shape, dtype, device))
        caveat = "reshape copies here only when the strides cannot be expressed as a view"
        return TensorPlan(plan.inputs, plan.outputs, caveats=(caveat,))
    return _view_only(shape, new, dtype, device)


def _channels_last(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    if len(shape) != 4:
        raise CatalogError("shape", "channels_last takes a 4-D tensor [N, C, H, W]")
    return _copy(shape, params, dtype, device)


def _sparse_parts(shape: Shape, density: float, dtype: str, device: str) -> tuple[TensorSpec, ...]:
    nnz = round(math.prod(shape) * density)
    return (
        TensorSpec("indices", (len(shape), nnz), "int64", device),
        TensorSpec("values", (nnz,), dtype, device),
    )


def _to_sparse(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    parts = _sparse_parts(shape, params["density"], dtype, device)
    caveat = "nnz follows density of a regular pattern; finding the nonzeros uses temporaries"
    return TensorPlan((main_input(shape, dtype, device),), parts, caveats=(caveat,))


def _to_dense(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    parts = _sparse_parts(shape, params["density"], dtype, device)
    return TensorPlan(parts, (TensorSpec("out", shape, dtype, device),))


def _narrow(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    d = norm_dim(params["dim"], len(shape), "params.dim")
    start, length = params["start"], params["length"]
    if start + length > shape[d]:
        raise CatalogError("params.length", f"start + length exceeds dim {d}'s size {shape[d]}")
    piece = tuple(length if i == d else n for i, n in enumerate(shape))
    if params["clone"]:
        out = TensorSpec("out", piece, dtype, device)
        caveat = "the base is freed once the clone is made"
    else:
        # The slice is a view: its storage is the whole base, which stays alive with it.
        out = TensorSpec("out_base", shape, dtype, device)
        caveat = "the view's bytes are its base's: slicing keeps the whole base alive"
    return TensorPlan(inputs=(), outputs=(out,), caveats=(caveat,))


_DENSITY = Param(
    "density", "float", "fraction of nonzero elements", default=0.01, minimum=0, maximum=1
)

ENTRIES = (
    OpEntry(
        name="transpose_contiguous",
        summary="a.transpose(dim0, dim1).contiguous(): the copy a layout change makes",
        plan_fn=_transpose,
        params=(_DIM0, _DIM1, REQUIRES_GRAD),
        dtypes=ALL,
        min_dims=2,
        tags=("layout",),
    ),
    OpEntry(
        name="permute",
        summary="a.permute(dims), a view; with contiguous, the copy",
        plan_fn=_permute,
        params=(
            Param("dims", "shape", "the permutation (default: reversed dims)"),
            Param("contiguous", "bool", "call .contiguous() on the view", default=False),
            REQUIRES_GRAD,
        ),
        dtypes=ALL,
        tags=("layout",),
    ),
    OpEntry(
        name="reshape",
        summary="a.view(new_shape) vs a.reshape(new_shape): reshape copies a non-contiguous a",
        plan_fn=_reshape,
        params=(
            Param("new_shape", "shape", "the target shape", required=True),
            Param(
                "method",
                "choice",
                "view or reshape",
                default="reshape",
                choices=("view", "reshape"),
            ),
            Param("transpose_first", "bool", "transpose a first (non-contiguous)", default=False),
        ),
        dtypes=ALL,
        tags=("layout",),
    ),
    OpEntry(
        name="channels_last",
        summary="a.to(memory_format=torch.channels_last): the same shape, NHWC strides, a copy",
        plan_fn=_channels_last,
        dtypes=ALL,
        min_dims=4,
        tags=("layout",),
    ),
    OpEntry(
        name="to_sparse",
        summary="a.to_sparse(): dense to COO (indices int64 [ndim, nnz] + values)",
        plan_fn=_to_sparse,
        params=(_DENSITY,),
        dtypes=tuple(d for d in ALL if not d.startswith("float8")),
        min_dims=1,
        tags=("layout", "sparse"),
    ),
    OpEntry(
        name="to_dense",
        summary="s.to_dense(): COO to dense",
        plan_fn=_to_dense,
        params=(_DENSITY,),
        dtypes=tuple(d for d in ALL if not d.startswith("float8")),
        min_dims=1,
        tags=("layout", "sparse"),
    ),
    OpEntry(
        name="narrow",
        summary="base.narrow(dim, start, length) of a base made inside the op: a view keeps "
        "its whole base alive; with clone, only the slice stays",
        plan_fn=_narrow,
        params=(
            Param("dim", "int", "dim to slice", default=0, minimum=-8, maximum=7),
            Param("start", "int", "first index", default=0, minimum=0, maximum=2**31 - 1),
            Param("length", "int", "how many", default=1, minimum=0, maximum=2**31 - 1),
            Param("clone", "bool", "clone the slice so the base can be freed", default=False),
        ),
        dtypes=ALL,
        min_dims=1,
        tags=("layout", "views"),
    ),
)
