"""Modules: forward, forward + backward, and a full training step, by memory category.

Parameters, gradients and optimizer state are predicted exactly (their tensors' bytes);
activations (what autograd saves) depend on the module's internals and are measured.
"""

import itertools

from app.catalog.families.common import REAL_FLOAT, Params, Shape
from app.catalog.model import CatalogError, OpEntry, Param, PlanFn, TensorPlan, TensorSpec

MODULES = ("linear", "conv2d", "layer_norm", "multihead_attention", "mlp", "transformer_block")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam")


def _linear(prefix: str, n_in: int, n_out: int) -> list[tuple[str, Shape]]:
    return [(f"{prefix}weight", (n_out, n_in)), (f"{prefix}bias", (n_out,))]


def _mha(prefix: str, e: int) -> list[tuple[str, Shape]]:
    return [
        (f"{prefix}in_proj_weight", (3 * e, e)),
        (f"{prefix}in_proj_bias", (3 * e,)),
        *_linear(f"{prefix}out_proj.", e, e),
    ]


def module_parameters(shape: Shape, params: Params) -> tuple[list[tuple[str, Shape]], Shape]:
    """The module's parameters (name, shape), as PyTorch names them, and the output shape."""
    kind, width = params["module"], params["width"]
    if not shape:
        raise CatalogError("shape", "a module takes an input of at least 1 dim")
    last = shape[-1]
    heads = params["heads"]
    if kind in ("multihead_attention", "transformer_block"):
        if len(shape) != 3:
            raise CatalogError("shape", f"{kind} takes [batch, seq, embed]")
        if last % heads:
            raise CatalogError("params.heads", f"embed {last} must divide by heads {heads}")
    if kind == "linear":
        return _linear("", last, width), (*shape[:-1], width)
    if kind == "conv2d":
        if len(shape) != 4:
            raise CatalogError("shape", "conv2d takes [N, C, H, W]")
        k = params["kernel_size"]
        n, c, h, w = shape
        out = (n, width, h - k + 1 + 2 * (k // 2), w - k + 1 + 2 * (k // 2))
        return [("weight", (width, c, k, k)), ("bias", (width,))], out
    if kind == "layer_norm":
        return [("weight", (last,)), ("bias", (last,))], shape
    if kind == "multihead_attention":
        return _mha("", last), shape
    if kind == "mlp":
        out_f = params["out_features"] or last
        dims = [last] + [width] * params["layers"] + [out_f]
        named: list[tuple[str, Shape]] = []
        for i, (a, b) in enumerate(itertools.pairwise(dims)):
            named += _linear(f"{2 * i}.", a, b)  # Sequential numbers Linear and ReLU alike
        return named, (*shape[:-1], out_f)
    # transformer_block: nn.TransformerEncoderLayer(d, heads, width, batch_first=True)
    d = last
    named = [
        *_mha("self_attn.", d),
        *_linear("linear1.", d, width),
        *_linear("linear2.", width, d),
        ("norm1.weight", (d,)),
        ("norm1.bias", (d,)),
        ("norm2.weight", (d,)),
        ("norm2.bias", (d,)),
    ]
    return named, shape


def _plan(mode: str) -> PlanFn:
    def plan(shape: Shape, params: Params, dtype: str, device: str) -> TensorPlan:
        named, out_shape = module_parameters(shape, params)
        if params["autocast"] != "none" and dtype != "float32":
            raise CatalogError("params.autocast", "autocast expects float32 parameters")
        weights = [TensorSpec(f"param:{n}", s, dtype, device) for n, s in named]
        inputs = (TensorSpec("x", shape, dtype, device), *weights)
        caveats = ["activations (tensors autograd saves) are measured, not predicted"]
        if params["autocast"] != "none":
            caveats.append("autocast keeps low-precision copies of weights: measured")
        if mode == "forward":
            out_dtype = params["autocast"] if params["autocast"] != "none" else dtype
            if params["module"] == "layer_norm":
                out_dtype = "float32" if params["autocast"] != "none" else dtype
            return TensorPlan(
                inputs, (TensorSpec("out", out_shape, out_dtype, device),), caveats=tuple(caveats)
            )
        outputs = [TensorSpec(f"grad:{n}", s, dtype, device) for n, s in named]
        if mode == "train_step":
            copies = {
                "sgd": (),
                "sgd_momentum": ("momentum_buffer",),
                "adam": ("exp_avg", "exp_avg_sq"),
            }[params["optimizer"]]
            outputs += [
                TensorSpec(f"state:{n}.{c}", s, dtype, device) for n, s in named for c in copies
            ]
            if params["optimizer"] == "adam":
                caveats.append("Adam's per-parameter step counters (0-dim) live on the CPU")
        return TensorPlan(inputs, tuple(outputs), caveats=tuple(caveats))

    return plan


def _params(train: bool) -> tuple[Param, ...]:
    common = (
        Param(
            "module",
            "choice",
            "which module, built as: linear nn.Linear(in, width); conv2d nn.Conv2d(C, width, "
            "kernel_size, padding=kernel_size//2); layer_norm nn.LayerNorm(in); "
            "multihead_attention nn.MultiheadAttention(in, heads, batch_first=True); mlp "
            "nn.Sequential of `layers` Linear(.., width)+ReLU then Linear(width, out_features); "
            "transformer_block nn.TransformerEncoderLayer(in, heads, width, batch_first=True) "
            "(in: the input's last dim; modules in training mode, PyTorch's defaults unless a "
            "parameter says otherwise)",
            default="linear",
            choices=MODULES,
        ),
        Param(
            "width",
            "int",
            "out_features / out_channels / hidden size / feed-forward size",
            default=256,
            minimum=1,
            maximum=65536,
        ),
        Param(
            "out_features",
            "int",
            "mlp output features (default: the input's)",
            minimum=1,
            maximum=65536,
        ),
        Param("layers", "int", "mlp hidden layers", default=1, minimum=1, maximum=16),
        Param(
            "dropout",
            "float",
            "dropout probability of transformer_block and multihead_attention (default: "
            "PyTorch's own, 0.1 for nn.TransformerEncoderLayer, 0.0 for nn.MultiheadAttention)",
            minimum=0,
            maximum=1,
        ),
        Param("heads", "int", "attention heads", default=4, minimum=1, maximum=128),
        Param(
            "kernel_size",
            "int",
            "conv2d kernel (odd; padding keeps H and W)",
            default=3,
            minimum=1,
            maximum=15,
        ),
        Param(
            "autocast",
            "choice",
            "run under torch.autocast with this dtype",
            default="none",
            choices=("none", "float16", "bfloat16"),
        ),
        Param(
            "checkpoint", "bool", "activation checkpointing (torch.utils.checkpoint)", default=False
        ),
    )
    if train:
        return (
            *common,
            Param("optimizer", "choice", "the optimizer", default="adam", choices=OPTIMIZERS),
        )
    return common


def _entry(name: str, mode: str, summary: str) -> OpEntry:
    params = _params(mode == "train_step")
    if mode == "forward":
        params = (*params, Param("no_grad", "bool", "run under torch.no_grad()", default=False))
    return OpEntry(
        name=name,
        summary=summary,
        plan_fn=_plan(mode),
        params=params,
        dtypes=REAL_FLOAT,
        min_dims=1,
        tags=("module",),
    )


ENTRIES = (
    _entry("module_forward", "forward", "module(x): the output, and what autograd keeps for it"),
    _entry(
        "module_backward",
        "backward",
        "module(x), then backward of out.float().square().mean(): "
        "gradients and the peak of backward",
    ),
    _entry(
        "module_train_step",
        "train_step",
        "a full training step: zero_grad, forward, "
        "backward, optimizer.step; parameters, gradients, optimizer state, activations",
    ),
)
