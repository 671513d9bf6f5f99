"""Autograd for any op: inputs that require grad, forward, then backward.

What autograd saves for backward is counted through saved-tensor hooks (unique
storages, the inputs' own apart); forward and backward are sections with their own
peaks (workers/sections.py).
"""

from __future__ import annotations

from typing import Any

import torch

from workers.ops.base import Inputs, Op, OpContext, Outputs, as_tuple, storage_key
from workers.sections import section


class SavedCounter:
    """Counts the tensors autograd saves for backward, by storage, without holding them."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.storages: dict[int, int] = {}
        self.count = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.count += 1
        key = storage_key(t)
        if key and key not in self.exclude:
            self.storages[key] = t.untyped_storage().nbytes()
        # A detached alias, not ``t``: when autograd saves a node's own output, packing
        # the tensor itself makes a reference cycle (tensor -> grad_fn -> saved tensor)
        # that outlives the graph until the garbage collector runs, so each repeat
        # would keep its activations alive. The alias shares storage and version counter.
        return t.detach()

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def summary(self) -> dict[str, Any]:
        return {
            "tensors_saved": self.count,
            "new_bytes_saved": sum(self.storages.values()),
            "note": "storages autograd saved that are not the op's inputs (or parameters): "
            "they stay alive until backward frees the graph",
        }


def _grad_dtype(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and t.element_size() > 1


def with_grad(op: Op) -> Op:
    def setup(ctx: OpContext) -> Inputs:
        inputs = op.setup(ctx)
        for t in inputs.values():
            if _grad_dtype(t):
                t.requires_grad_(True)
        return inputs

    def run(inputs: Inputs, ctx: OpContext) -> Outputs:
        leaves = [t for t in inputs.values() if t.requires_grad]
        for t in leaves:
            t.grad = None  # each call starts without grads, so each repeat is alike
        saved = SavedCounter({storage_key(t) for t in inputs.values()})
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            with section("forward", ctx.device):
                outs = as_tuple(op.run(inputs, ctx))
        ctx.extras["autograd"] = saved.summary()
        roots = [o for o in outs if o.requires_grad]
        with section("backward", ctx.device):
            if roots:
                torch.autograd.backward(roots, [torch.ones_like(o) for o in roots])
        grads = tuple(t.grad for t in leaves if t.grad is not None)
        return (*(o.detach() for o in outs), *grads)

    return Op(setup, run, op.bytes_moved, op.probe)
