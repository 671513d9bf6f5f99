"""Convolution: conv2d with channels, kernel, stride, padding, groups and cudnn.benchmark."""

from app.catalog.families.common import (
    REAL_FLOAT,
    REQUIRES_GRAD,
    Params,
    Shape,
    main_input,
    one_out,
)
from app.catalog.model import OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import conv2d_shape


def _conv2d(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    k, groups, out_c = params["kernel_size"], params["groups"], params["out_channels"]
    out = conv2d_shape(shape, out_c, k, params["stride"], params["padding"], groups)
    inputs = [
        main_input(shape, dtype, device, "x"),
        TensorSpec("weight", (out_c, shape[1] // groups, k, k), dtype, device),
    ]
    if params["bias"]:
        inputs.append(TensorSpec("bias", (out_c,), dtype, device))
    plan = one_out(out, dtype, device, *inputs)
    caveat = (
        "cuDNN's workspace for the chosen algorithm (and, with cudnn_benchmark, the "
        "workspaces of the algorithms it tries) is measured, not predicted"
    )
    return TensorPlan(plan.inputs, plan.outputs, caveats=(caveat,))


def _int(name: str, description: str, default: int, minimum: int, maximum: int) -> Param:
    return Param(name, "int", description, default=default, minimum=minimum, maximum=maximum)


ENTRIES = (
    OpEntry(
        name="conv2d",
        summary="F.conv2d(x, weight, bias) with x of shape [N, C, H, W]",
        plan_fn=_conv2d,
        params=(
            _int("out_channels", "output channels", 64, 1, 65536),
            _int("kernel_size", "square kernel size", 3, 1, 31),
            _int("stride", "stride", 1, 1, 16),
            _int("padding", "zero padding on each side", 1, 0, 31),
            _int("groups", "groups (in and out channels must divide by it)", 1, 1, 65536),
            Param("bias", "bool", "with a bias", default=True),
            Param(
                "cudnn_benchmark",
                "bool",
                "torch.backends.cudnn.benchmark: let cuDNN time algorithms and pick the fastest",
                default=False,
            ),
            REQUIRES_GRAD,
        ),
        dtypes=REAL_FLOAT,
        min_dims=4,
        tags=("convolution",),
    ),
)
