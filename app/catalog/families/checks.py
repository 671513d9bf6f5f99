"""Device and dtype questions: what works where, and inputs on different devices."""

from app.catalog.families.common import ALL, Params, Shape
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec

MIXED_CASES = ("tensor_tensor", "module_on_cpu", "cpu_scalar")


def _dtype_support(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    caveat = "a matrix of outcomes: each cell's tensors are freed before the next"
    return TensorPlan(inputs=(), outputs=(), caveats=(caveat,))


def _mixed(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    case, other = params["case"], params["other_device"]
    if case == "module_on_cpu":
        if not shape:
            raise CatalogError("shape", "module_on_cpu takes [batch, features]")
        n = shape[-1]
        module_inputs = (
            TensorSpec("x", shape, dtype, device),
            TensorSpec("param:weight", (n, n), dtype, "cpu"),
            TensorSpec("param:bias", (n,), dtype, "cpu"),
        )
        return TensorPlan(module_inputs, (), caveats=("expected to fail when device is not cpu",))
    b_shape = () if case == "cpu_scalar" else shape
    b_device = "cpu" if case == "cpu_scalar" else other
    inputs = (TensorSpec("a", shape, dtype, device), TensorSpec("b", b_shape, dtype, b_device))
    if case == "cpu_scalar" or b_device == device:
        return TensorPlan(inputs, (TensorSpec("out", shape, dtype, device),))
    return TensorPlan(inputs, (), caveats=("expected to fail: inputs on two devices",))


ENTRIES = (
    OpEntry(
        name="dtype_support",
        summary="for the device: a matrix of dtypes x (create, move, ops) with PyTorch's exact "
        "error text where a cell fails",
        plan_fn=_dtype_support,
        params=(
            Param(
                "dtypes",
                "choice",
                "which dtypes: every dtype vramlab knows",
                default="all",
                choices=("all",),
            ),
        ),
        dtypes=ALL,
        tags=("dtype", "device"),
    ),
    OpEntry(
        name="mixed_device",
        summary="inputs on different devices: a + b across devices (fails), a module left "
        "on the CPU with input on the device (fails), a CPU 0-dim scalar + a tensor (allowed)",
        plan_fn=_mixed,
        params=(
            Param("case", "choice", "which case", default="tensor_tensor", choices=MIXED_CASES),
            Param("other_device", "device", "where b lives (tensor_tensor)", default="cpu"),
        ),
        dtypes=ALL,
        tags=("device",),
    ),
)
