"""Creation ops (app/catalog/families/creation.py)."""

import math

import torch

from workers.ops.base import Op, OpContext, Outputs, no_inputs


def _arange(_: object, c: OpContext) -> Outputs:
    return torch.arange(math.prod(c.shape), dtype=c.dtype, device=c.device).reshape(c.shape)


def _full(_: object, c: OpContext) -> Outputs:
    return torch.full(c.shape, c.params["value"], dtype=c.dtype, device=c.device)


OPS = {
    "empty": Op(no_inputs, lambda _, c: torch.empty(c.shape, dtype=c.dtype, device=c.device)),
    "zeros": Op(no_inputs, lambda _, c: torch.zeros(c.shape, dtype=c.dtype, device=c.device)),
    "ones": Op(no_inputs, lambda _, c: torch.ones(c.shape, dtype=c.dtype, device=c.device)),
    "randn": Op(no_inputs, lambda _, c: torch.randn(c.shape, dtype=c.dtype, device=c.device)),
    "arange": Op(no_inputs, _arange),
    "full": Op(no_inputs, _full),
}
