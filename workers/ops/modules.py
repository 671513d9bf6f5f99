"""Modules: forward, forward + backward, a training step; memory by category.

Categories follow PyTorch's memory profiler: parameters, gradients, optimizer state,
activations (what autograd saves), counted from the live tensors' storages.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from workers.ops.autograd import SavedCounter
from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, storage_key
from workers.sections import section


def build_module(kind: str, shape: tuple[int, ...], p: Any) -> tuple[nn.Module, Callable[..., Any]]:
    last, width = shape[-1], p["width"]
    module: nn.Module
    if kind == "linear":
        module = nn.Linear(last, width)
    elif kind == "conv2d":
        k = p["kernel_size"]
        module = nn.Conv2d(shape[1], width, k, padding=k // 2)
    elif kind == "layer_norm":
        module = nn.LayerNorm(last)
    elif kind == "multihead_attention":
        mha = nn.MultiheadAttention(
            last, p["heads"], dropout=float(p.get("dropout") or 0.0), batch_first=True
        )
        return mha, lambda x: mha(x, x, x, need_weights=False)[0]
    elif kind == "mlp":
        dims = [last] + [width] * p["layers"] + [p.get("out_features") or last]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            layers += [nn.Linear(a, b), nn.ReLU()]
        module = nn.Sequential(*layers[:-1])  # no ReLU after the last layer
    else:
        # No dropout given: PyTorch's own default for the layer applies (0.1).
        module = (
            nn.TransformerEncoderLayer(last, p["heads"], width, batch_first=True)
            if p.get("dropout") is None
            else nn.TransformerEncoderLayer(
                last, p["heads"], width, dropout=float(p["dropout"]), batch_first=True
            )
        )
    return module, module


def _optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-4, momentum=0.9 if name == "sgd_momentum" else 0.0)


def _setup(mode: str) -> Callable[[OpContext], Inputs]:
    def setup(ctx: OpContext) -> Inputs:
        p = ctx.params
        module, call = build_module(p["module"], ctx.shape, p)
        module.to(device=ctx.device, dtype=ctx.dtype)
        ctx.state.update(module=module, call=call)
        if mode == "train_step":
            ctx.state["optimizer"] = _optimizer(p["optimizer"], list(module.parameters()))
        inputs = {"x": filled(ctx.shape, ctx.dtype, ctx.device)}
        inputs.update({f"param:{n}": t.data for n, t in module.named_parameters()})
        return inputs

    return setup


def _bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen[storage_key(t) or id(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _run(mode: str) -> Callable[[Inputs, OpContext], Outputs]:
    def run(inputs: Inputs, ctx: OpContext) -> Outputs:
        p, module = ctx.params, ctx.state["module"]
        call, x = ctx.state["call"], inputs["x"]
        optimizer = ctx.state.get("optimizer")
        module.zero_grad(set_to_none=True)
        params = list(module.parameters())
        saved = SavedCounter({storage_key(t) for t in (x, *params)})
        autocast = (
            torch.autocast(ctx.device.type, dtype=getattr(torch, p["autocast"]))
            if p["autocast"] != "none"
            else contextlib.nullcontext()
        )
        no_grad = torch.no_grad() if p.get("no_grad") else contextlib.nullcontext()
        with no_grad, torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            with section("forward", ctx.device), autocast:
                out = checkpoint(call, x, use_reentrant=False) if p["checkpoint"] else call(x)
        result: tuple[torch.Tensor, ...] = (out,)
        if mode != "forward":
            with section("backward", ctx.device):
                out.float().square().mean().backward()
            result = ()
            del out
        if optimizer is not None:
            with section("optimizer_step", ctx.device):
                optimizer.step()
        state = [
            v
            for s in (optimizer.state.values() if optimizer else [])
            for v in s.values()
            if isinstance(v, torch.Tensor)
        ]
        ctx.extras["categories"] = {
            "parameters": _bytes(params),
            "gradients": _bytes([q.grad for q in params if q.grad is not None]),
            "optimizer_state": _bytes([v for v in state if v.device == ctx.device]),
            "optimizer_state_on_cpu": _bytes([v for v in state if v.device.type == "cpu"])
            if ctx.device.type != "cpu"
            else None,
            "activations_saved": saved.summary()["new_bytes_saved"],
            "inputs": x.nbytes,
            "outputs": sum(t.nbytes for t in result),
            "source": "counted from the live tensors' storages (not the allocator)",
        }
        ctx.extras["parameter_devices"] = sorted({str(q.device) for q in params})
        return result

    return run


OPS = {
    f"module_{mode}": Op(_setup(mode), _run(mode)) for mode in ("forward", "backward", "train_step")
}
