"""What the families share: dtype groups, common parameters, plan helpers."""

from collections.abc import Mapping
from typing import Any

from app.catalog.model import GRAD_DTYPES, Param, TensorPlan, TensorSpec
from vramlab.catalog.dtypes import COMPLEX_DTYPES, DTYPES, FLOATING_DTYPES

Params = Mapping[str, Any]
Shape = tuple[int, ...]
ALL = tuple(DTYPES)
NUMERIC = tuple(d for d in DTYPES if d != "bool")
# Floating and complex dtypes that kernels generally implement (float8 is storage-first).
FLOAT = GRAD_DTYPES
REAL_FLOAT = tuple(d for d in FLOATING_DTYPES if not d.startswith("float8"))
RANDOM = tuple(d for d in (*FLOATING_DTYPES, *COMPLEX_DTYPES) if not d.startswith("float8"))

REQUIRES_GRAD = Param(
    "requires_grad",
    "bool",
    "make the floating inputs leaves that require grad; the op runs forward then backward",
    default=False,
)
OTHER_SHAPE = Param(
    "other_shape", "shape", "shape of the second operand; broadcasts against shape (default: shape)"
)
DIM = Param(
    "dim",
    "int",
    "the dim to work along (negative counts from the end)",
    default=-1,
    minimum=-8,
    maximum=7,
)


def one_out(shape: Shape, dtype: str, device: str, *inputs: TensorSpec) -> TensorPlan:
    return TensorPlan(inputs=inputs, outputs=(TensorSpec("out", shape, dtype, device),))


def main_input(shape: Shape, dtype: str, device: str, name: str = "a") -> TensorSpec:
    return TensorSpec(name, shape, dtype, device)


def other_shape(shape: Shape, params: Params) -> Shape:
    other = params.get("other_shape")
    return tuple(other) if other is not None else shape
