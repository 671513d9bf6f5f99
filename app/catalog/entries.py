"""The ops vramlab can run, as catalog entries gathered from their families.

Each entry has one function of the same name in workers/ops/ (the ``scenario`` entry is
run by workers/scenario.py from the spec's steps).
"""

from collections.abc import Mapping
from typing import Any

from app.catalog.families import (
    checks,
    conv,
    copies,
    creation,
    diagnostic,
    elementwise,
    layout,
    linalg,
    model,
    modules,
    reduction,
    transfer,
)
from app.catalog.families.scenario import SCENARIO
from app.catalog.model import CatalogError, OpEntry, TensorPlan

_FAMILIES = (
    creation,
    elementwise,
    reduction,
    linalg,
    conv,
    layout,
    copies,
    transfer,
    modules,
    model,
    checks,
    diagnostic,
)

OPS: dict[str, OpEntry] = {op.name: op for family in _FAMILIES for op in family.ENTRIES} | {
    SCENARIO.name: SCENARIO
}


def get_op(name: str) -> OpEntry:
    try:
        return OPS[name]
    except KeyError:
        raise CatalogError("op", f"unknown op {name!r}; allowed: {', '.join(OPS)}") from None


def plan_spec(
    op: str, shape: tuple[int, ...], params: Mapping[str, Any], dtype: str, device: str
) -> tuple[dict[str, Any], TensorPlan]:
    """Check a spec's op, params, dtype and device; return the full params and the plan."""
    entry = get_op(op)
    checked = entry.check_params(params)
    return checked, entry.plan(shape, checked, dtype, device)
