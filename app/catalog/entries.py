"""The ops vramlab can run, as catalog entries. Each has one function in workers/ops.py."""

from collections.abc import Mapping
from typing import Any

from app.catalog.dtypes import COMPLEX_DTYPES, DTYPES, FLOATING_DTYPES
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import broadcast, matmul_shape

Params = Mapping[str, Any]
NUMERIC = tuple(d for d in DTYPES if d != "bool")
RANDOM = tuple(d for d in (*FLOATING_DTYPES, *COMPLEX_DTYPES) if not d.startswith("float8"))


def _creation(shape: tuple[int, ...], params: Params, dtype: str, device: str) -> TensorPlan:
    return TensorPlan(inputs=(), outputs=(TensorSpec("out", shape, dtype, device),))


def _add(shape: tuple[int, ...], params: Params, dtype: str, device: str) -> TensorPlan:
    other = tuple(params["other_shape"]) if params.get("other_shape") is not None else shape
    out = broadcast(shape, other, "params.other_shape")
    return TensorPlan(
        inputs=(TensorSpec("a", shape, dtype, device), TensorSpec("b", other, dtype, device)),
        outputs=(TensorSpec("out", out, dtype, device),),
    )


def _matmul(shape: tuple[int, ...], params: Params, dtype: str, device: str) -> TensorPlan:
    other = tuple(params["other_shape"])
    out = matmul_shape(shape, other, "params.other_shape")
    return TensorPlan(
        inputs=(TensorSpec("a", shape, dtype, device), TensorSpec("b", other, dtype, device)),
        outputs=(TensorSpec("out", out, dtype, device),),
    )


def _to(shape: tuple[int, ...], params: Params, dtype: str, device: str) -> TensorPlan:
    source = params["source_device"]
    source_dtype = params["source_dtype"] or dtype
    if params["pin_memory"] and source != "cpu":
        raise CatalogError("params.pin_memory", "only a tensor on the CPU can be pinned")
    src = TensorSpec("source", shape, source_dtype, source)
    # Tensor.to returns the source itself when nothing changes, unless copy=True.
    same = source == device and source_dtype == dtype and not params["copy"]
    outputs = () if same else (TensorSpec("out", shape, dtype, device),)
    extra = ("cuda:0",) if params["pin_memory"] and device == "cpu" else ()
    return TensorPlan(inputs=(src,), outputs=outputs, extra_devices=extra)


_OTHER_SHAPE_OPTIONAL = Param(
    "other_shape", "shape", "shape of the second operand; broadcasts against shape (default: shape)"
)

OPS: dict[str, OpEntry] = {
    op.name: op
    for op in (
        OpEntry(
            name="empty",
            summary="torch.empty(shape): allocate without initialising",
            plan_fn=_creation,
            tags=("creation",),
        ),
        OpEntry(
            name="randn",
            summary="torch.randn(shape): allocate and fill with normal samples",
            plan_fn=_creation,
            dtypes=RANDOM,
            tags=("creation",),
        ),
        OpEntry(
            name="add",
            summary="a + b, out of place; b may broadcast",
            plan_fn=_add,
            params=(_OTHER_SHAPE_OPTIONAL,),
            dtypes=tuple(DTYPES),
            tags=("elementwise",),
        ),
        OpEntry(
            name="matmul",
            summary="torch.matmul(a, b) with a of shape and b of other_shape",
            plan_fn=_matmul,
            params=(Param("other_shape", "shape", "shape of the right operand", required=True),),
            dtypes=NUMERIC,
            min_dims=1,
            tags=("linalg",),
        ),
        OpEntry(
            name="sleep",
            summary="diagnostic: hold the shape's tensor and sleep (tests timeouts and cancel)",
            plan_fn=_creation,
            params=(
                Param(
                    "seconds", "float", "how long to sleep", default=1.0, minimum=0, maximum=3600
                ),
            ),
            tags=("diagnostic",),
        ),
        OpEntry(
            name="abort",
            summary="diagnostic: the child process aborts (tests crash handling)",
            plan_fn=_creation,
            tags=("diagnostic",),
        ),
        OpEntry(
            name="to",
            summary="tensor.to(device, dtype): a copy between devices or dtypes",
            plan_fn=_to,
            params=(
                Param("source_device", "device", "where the source tensor is made", default="cpu"),
                Param("source_dtype", "dtype", "dtype of the source tensor (default: dtype)"),
                Param(
                    "pin_memory", "bool", "pin the source in page-locked host memory", default=False
                ),
                Param(
                    "non_blocking", "bool", "asynchronous copy (pinned memory only)", default=False
                ),
                Param("copy", "bool", "copy even when nothing would change", default=False),
            ),
            tags=("transfer",),
        ),
    )
}


def get_op(name: str) -> OpEntry:
    try:
        return OPS[name]
    except KeyError:
        raise CatalogError("op", f"unknown op {name!r}; allowed: {', '.join(OPS)}") from None


def plan_spec(
    op: str, shape: tuple[int, ...], params: Params, dtype: str, device: str
) -> tuple[dict[str, Any], TensorPlan]:
    """Check a spec's op, params, dtype and device; return the full params and the plan."""
    entry = get_op(op)
    checked = entry.check_params(params)
    return checked, entry.plan(shape, checked, dtype, device)
