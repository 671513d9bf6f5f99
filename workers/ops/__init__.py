"""The ops a worker can run: one small entry per catalog op (app/catalog/families/).

An op is two functions. ``setup`` makes the inputs (the set-up phase); ``run`` does the
work once and returns the outputs (the op phase calls it warmup + repeat times). Adding
an op is one entry in a family module here and one in the catalog, with the same name
and params. ``op_for`` wraps an op in autograd when the spec asks for requires_grad.
"""

from collections.abc import Mapping
from typing import Any

from workers.ops import (
    checks,
    creation,
    diagnostic,
    elementwise,
    layout,
    linalg,
    model,
    modules,
    transfer,
)
from workers.ops.autograd import with_grad
from workers.ops.base import (
    Inputs,
    Op,
    OpContext,
    Outputs,
    as_tuple,
    filled,
    storage_key,
    torch_dtype,
)

OPS: dict[str, Op] = {
    **creation.OPS,
    **elementwise.OPS,
    **linalg.OPS,
    **layout.OPS,
    **transfer.OPS,
    **modules.OPS,
    **checks.OPS,
    **diagnostic.OPS,
    **model.OPS,
}


def op_for(name: str, params: Mapping[str, Any]) -> Op:
    op = OPS[name]
    return with_grad(op) if params.get("requires_grad") else op


__all__ = [
    "OPS",
    "Inputs",
    "Op",
    "OpContext",
    "Outputs",
    "as_tuple",
    "filled",
    "op_for",
    "storage_key",
    "torch_dtype",
]
