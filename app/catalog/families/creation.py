"""Creation ops: a tensor made on the device, nothing before it."""

from app.catalog.families.common import ALL, NUMERIC, RANDOM, Params, Shape
from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan, TensorSpec
from vramlab.catalog.dtypes import fill_problem


def _creation(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    return TensorPlan(inputs=(), outputs=(TensorSpec("out", shape, dtype, device),))


def _full(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
    if (why := fill_problem(params["value"], dtype)) is not None:
        raise CatalogError("params.value", why)
    return _creation(shape, params, dtype, device)


def _entry(
    name: str, summary: str, dtypes: tuple[str, ...] = ALL, params: tuple[Param, ...] = ()
) -> OpEntry:
    return OpEntry(
        name=name,
        summary=summary,
        plan_fn=_full if name == "full" else _creation,
        params=params,
        dtypes=dtypes,
        tags=("creation",),
    )


ENTRIES = (
    _entry("empty", "torch.empty(shape): allocate without initialising"),
    _entry("zeros", "torch.zeros(shape): allocate and fill with zeros"),
    _entry("ones", "torch.ones(shape): allocate and fill with ones"),
    _entry("randn", "torch.randn(shape): allocate and fill with normal samples", RANDOM),
    _entry(
        "arange",
        "torch.arange(numel).reshape(shape): a counting sequence",
        tuple(d for d in NUMERIC if not d.startswith(("float8", "complex"))),
    ),
    _entry(
        "full",
        "torch.full(shape, value)",
        params=(Param("value", "float", "the fill value", default=1.0),),
    ),
)
