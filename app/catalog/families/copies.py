"""Concatenation and copies: cat, stack, clone, expand vs repeat, dtype conversion."""

from app.catalog.families.common import ALL, REQUIRES_GRAD, Params, Shape, main_input, one_out
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from app.catalog.shapes import norm_dim

_COUNT = Param("count", "int", "how many tensors of shape", default=4, minimum=1, maximum=64)
_DIM = Param("dim", "int", "the dim", default=0, minimum=-9, maximum=8)


def _parts(shape: Shape, count: int, dtype: str, device: str) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(f"t{i}", shape, dtype, device) for i in range(count))


def _cat(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    if not shape:
        raise CatalogError("shape", "cat needs at least 1 dim")
    d = norm_dim(params["dim"], len(shape), "params.dim")
    out = tuple(n * params["count"] if i == d else n for i, n in enumerate(shape))
    return one_out(out, dtype, device, *_parts(shape, params["count"], dtype, device))


def _stack(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    d = norm_dim(params["dim"], len(shape) + 1, "params.dim")
    out = (*shape[:d], params["count"], *shape[d:])
    return one_out(out, dtype, device, *_parts(shape, params["count"], dtype, device))


def _clone(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    return one_out(shape, dtype, device, main_input(shape, dtype, device))


def _expand_target(shape: Shape, sizes: list[int]) -> Shape:
    if len(sizes) < len(shape):
        raise CatalogError("params.sizes", "needs at least as many dims as shape")
    lead = len(sizes) - len(shape)
    for i, n in enumerate(shape):
        if n != 1 and sizes[lead + i] != n:
            raise CatalogError("params.sizes", f"dim {i} of size {n} can only expand if it is 1")
    return tuple(sizes)


def _expand(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    target = _expand_target(shape, params["sizes"])
    if params["contiguous"]:
        return one_out(target, dtype, device, main_input(shape, dtype, device))
    # A broadcast view with stride 0: no bytes, whatever its apparent size.
    return TensorPlan(inputs=(main_input(shape, dtype, device),), outputs=())


def _repeat(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    reps = params["repeats"]
    if len(reps) < len(shape):
        raise CatalogError("params.repeats", "needs at least as many entries as shape has dims")
    padded = (1,) * (len(reps) - len(shape)) + shape
    out = tuple(n * r for n, r in zip(padded, reps, strict=True))
    return one_out(out, dtype, device, main_input(shape, dtype, device))


def _to_dtype(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    source = params["source_dtype"]
    if source == dtype:
        # Tensor.to with nothing to change returns the tensor itself.
        return TensorPlan(inputs=(TensorSpec("source", shape, source, device),), outputs=())
    return one_out(shape, dtype, device, TensorSpec("source", shape, source, device))


ENTRIES = (
    OpEntry(
        name="cat",
        summary="torch.cat of count tensors of shape along dim",
        plan_fn=_cat,
        params=(_COUNT, _DIM, REQUIRES_GRAD),
        dtypes=ALL,
        tags=("copies",),
    ),
    OpEntry(
        name="stack",
        summary="torch.stack of count tensors of shape along a new dim",
        plan_fn=_stack,
        params=(_COUNT, _DIM, REQUIRES_GRAD),
        dtypes=ALL,
        tags=("copies",),
    ),
    OpEntry(
        name="clone",
        summary="a.clone()",
        plan_fn=_clone,
        params=(REQUIRES_GRAD,),
        dtypes=ALL,
        tags=("copies",),
    ),
    OpEntry(
        name="expand",
        summary="a.expand(sizes): a stride-0 view; with contiguous, the materialised copy",
        plan_fn=_expand,
        params=(
            Param("sizes", "shape", "target sizes; only dims of size 1 grow", required=True),
            Param("contiguous", "bool", "call .contiguous() (materialise)", default=False),
        ),
        dtypes=ALL,
        tags=("copies", "views"),
    ),
    OpEntry(
        name="repeat",
        summary="a.repeat(repeats): always a copy",
        plan_fn=_repeat,
        params=(Param("repeats", "shape", "times along each dim", required=True), REQUIRES_GRAD),
        dtypes=ALL,
        tags=("copies",),
    ),
    OpEntry(
        name="to_dtype",
        summary="a.to(dtype) on the same device: a converted copy (none if nothing changes)",
        plan_fn=_to_dtype,
        params=(Param("source_dtype", "dtype", "the source's dtype", default="float32"),),
        dtypes=ALL,
        tags=("copies", "dtype"),
    ),
)
