"""Linear algebra: matmul, bmm, linear (with bias), einsum with a fixed set of equations."""

from app.catalog.families.common import (
    FLOAT,
    NUMERIC,
    REQUIRES_GRAD,
    Params,
    Shape,
    main_input,
    one_out,
)
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import einsum_shape, matmul_shape

# Validated equations only: the equation is data picked from this list, never parsed code.
EINSUM_EQUATIONS: tuple[str, ...] = (
    "ij,jk->ik",
    "bij,bjk->bik",
    "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bhqd",
    "ij->ji",
    "ii->i",
    "ij->",
    "i,j->ij",
    "bi,bi->b",
)
_WORKSPACE = "cuBLAS's workspace (made on its first use in a process) is measured, not predicted"


def _workspace(device: str) -> tuple[str, ...]:
    """The cuBLAS caveat, where it applies: on CUDA only."""
    return (_WORKSPACE,) if device.startswith("cuda") else ()


def _matmul(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    other = tuple(params["other_shape"])
    out = matmul_shape(shape, other, "params.other_shape")
    plan = one_out(
        out, dtype, device, main_input(shape, dtype, device), TensorSpec("b", other, dtype, device)
    )
    return TensorPlan(plan.inputs, plan.outputs, caveats=_workspace(device))


def _bmm(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    other = tuple(params["other_shape"])
    if len(shape) != 3 or len(other) != 3 or shape[0] != other[0]:
        raise CatalogError("params.other_shape", "bmm takes [b, n, m] @ [b, m, p] with the same b")
    return _matmul(shape, params, dtype, device)


def _linear(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    n_in, n_out = shape[-1], params["out_features"]
    inputs = [
        main_input(shape, dtype, device, "x"),
        TensorSpec("weight", (n_out, n_in), dtype, device),
    ]
    if params["bias"]:
        inputs.append(TensorSpec("bias", (n_out,), dtype, device))
    out = one_out((*shape[:-1], n_out), dtype, device, *inputs)
    return TensorPlan(out.inputs, out.outputs, caveats=_workspace(device))


def _einsum(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    equation = params["equation"]
    inputs = [main_input(shape, dtype, device)]
    if "," in equation.partition("->")[0]:
        if params.get("other_shape") is None:
            raise CatalogError("params.other_shape", f"{equation!r} takes a second operand")
        inputs.append(TensorSpec("b", tuple(params["other_shape"]), dtype, device))
    out = einsum_shape(equation, [t.shape for t in inputs], "params.equation")
    plan = one_out(out, dtype, device, *inputs)
    caveat = "einsum may permute or copy operands into temporaries before its matmul"
    return TensorPlan(plan.inputs, plan.outputs, caveats=(caveat, *_workspace(device)))


_OTHER = Param("other_shape", "shape", "shape of the right operand", required=True)

ENTRIES = (
    OpEntry(
        name="matmul",
        summary="torch.matmul(a, b) with a of shape and b of other_shape",
        plan_fn=_matmul,
        params=(_OTHER, REQUIRES_GRAD),
        dtypes=NUMERIC,
        min_dims=1,
        tags=("linalg",),
    ),
    OpEntry(
        name="bmm",
        summary="torch.bmm(a, b): [b, n, m] @ [b, m, p]",
        plan_fn=_bmm,
        params=(_OTHER, REQUIRES_GRAD),
        dtypes=NUMERIC,
        min_dims=3,
        tags=("linalg",),
    ),
    OpEntry(
        name="linear",
        summary="F.linear(x, weight, bias): x of shape [..., in] to [..., out_features]",
        plan_fn=_linear,
        params=(
            Param("out_features", "int", "output features", default=256, minimum=1, maximum=2**20),
            Param("bias", "bool", "with a bias", default=True),
            REQUIRES_GRAD,
        ),
        dtypes=FLOAT,
        min_dims=1,
        tags=("linalg",),
    ),
    OpEntry(
        name="einsum",
        summary="torch.einsum(equation, a[, b]) for one of a fixed set of equations",
        plan_fn=_einsum,
        params=(
            Param(
                "equation", "choice", "the equation", default="ij,jk->ik", choices=EINSUM_EQUATIONS
            ),
            Param("other_shape", "shape", "shape of the second operand, for two-operand equations"),
            REQUIRES_GRAD,
        ),
        dtypes=NUMERIC,
        tags=("linalg",),
    ),
)
