"""Element-wise ops, out of place and in place, with broadcasting."""

from app.catalog.families.common import (
    ALL,
    FLOAT,
    NUMERIC,
    OTHER_SHAPE,
    REQUIRES_GRAD,
    Params,
    Shape,
    main_input,
    one_out,
    other_shape,
)
from app.catalog.model import CatalogError, OpEntry, PlanFn, TensorPlan, TensorSpec
from app.catalog.shapes import broadcast


def _binary(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    other = other_shape(shape, params)
    out = broadcast(shape, other, "params.other_shape")
    return one_out(
        out, dtype, device, main_input(shape, dtype, device), TensorSpec("b", other, dtype, device)
    )


def _binary_inplace(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    other = other_shape(shape, params)
    if broadcast(shape, other, "params.other_shape") != shape:
        raise CatalogError(
            "params.other_shape",
            f"an in-place op writes into a of shape {list(shape)}; other_shape must broadcast "
            f"to it, not grow it",
        )
    # The result is a itself: no new tensor.
    return TensorPlan(
        inputs=(main_input(shape, dtype, device), TensorSpec("b", other, dtype, device)),
        outputs=(),
    )


def _unary(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    return one_out(shape, dtype, device, main_input(shape, dtype, device))


def _unary_inplace(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    return TensorPlan(inputs=(main_input(shape, dtype, device),), outputs=())


def _where(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    other = other_shape(shape, params)
    out = broadcast(shape, other, "params.other_shape")
    return one_out(
        out,
        dtype,
        device,
        TensorSpec("cond", shape, "bool", device),
        main_input(shape, dtype, device),
        TensorSpec("b", other, dtype, device),
    )


def _entry(
    name: str, summary: str, plan_fn: PlanFn, dtypes: tuple[str, ...], binary: bool
) -> OpEntry:
    params = (OTHER_SHAPE, REQUIRES_GRAD) if binary else (REQUIRES_GRAD,)
    return OpEntry(
        name=name,
        summary=summary,
        plan_fn=plan_fn,
        params=params,
        dtypes=dtypes,
        tags=("elementwise",),
    )


ENTRIES = (
    _entry("add", "a + b, out of place; b may broadcast", _binary, ALL, True),
    _entry("mul", "a * b, out of place; b may broadcast", _binary, ALL, True),
    _entry("add_", "a.add_(b), in place: a is the result", _binary_inplace, ALL, True),
    _entry("mul_", "a.mul_(b), in place: a is the result", _binary_inplace, ALL, True),
    _entry("relu", "torch.relu(a)", _unary, NUMERIC, False),
    _entry("relu_", "torch.relu_(a), in place", _unary_inplace, NUMERIC, False),
    _entry("exp", "torch.exp(a)", _unary, FLOAT, False),
    _entry("sigmoid", "torch.sigmoid(a)", _unary, FLOAT, False),
    _entry("where", "torch.where(cond, a, b) with a bool cond of shape", _where, ALL, True),
)
