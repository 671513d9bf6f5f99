"""CUDA's choices, made on the CPU's fake tensors, so a prediction without a GPU holds
what a GPU would hold.

The predictor traces a step on fake CPU tensors. Three things CUDA does differently change
the bytes a step holds, and each is decided above the kernels, where a function mode
can make the CUDA choice instead:

- Attention. ``scaled_dot_product_attention`` on Hopper with the torch the worker runs
  (2.11) runs cuDNN's attention for half precision (with or without a mask, dropout or
  grouped key/value heads: measured over 60 shapes on an H200, bench/kernel_scratch.py
  ``--sdpa-choice``) and the memory-efficient kernel for float32; both keep only the
  output and a log-sum-exp for the backward, where the CPU falls back to the math path,
  which keeps the whole attention matrix. Here the call goes to the CUDA kernel's own op
  (its shapes are known without a device); the buffers cuDNN's backward takes for
  itself are made by workers/models/kernel_scratch.py. The memory-efficient kernel
  takes no grouped heads, so float32 grouped attention runs the math path on CUDA, keys
  and values repeated to every head and the whole attention matrix kept (the CPU's own
  fused kernel would keep neither). A QLoRA base prepared by peft
  (float32 norms, so float32 queries) attends this way.
- Dropout. CUDA runs a training dropout as one fused kernel that keeps a one-byte mask
  for the backward; the CPU keeps its noise, a mask of the input's dtype. Here the call
  goes to the fused op.
- Autocast. CUDA's autocast casts matmuls and convolutions to the low precision and runs
  norms, softmax, losses and reductions in float32; the CPU's lists differ. Here the
  CUDA lists are applied to the calls, with autocast's cache of cast weights (alive to
  the end of the autocast region, as on CUDA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

# CUDA's autocast lists (ATen's autocast_mode.cpp), by the name of the Python call.
LOW = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "__matmul__",
        "einsum",
        "mm",
        "mv",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "scaled_dot_product_attention",
    }
)
FP32 = frozenset(
    {
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "__pow__",
        "softplus",
        "layer_norm",
        "group_norm",
        "norm",
        "cosine_similarity",
        "nll_loss",
        "cross_entropy",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "binary_cross_entropy_with_logits",
        "cdist",
        "logsumexp",
    }
)
# Reductions that CUDA's autocast runs with a float32 output (no copy of the input).
SET_FP32 = frozenset({"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum"})
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "cat", "stack", "index_put", "scatter_add"})
_LOW_DTYPES = (torch.float16, torch.bfloat16)


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", ""))


class CudaSemantics(TorchFunctionMode):
    """Make CUDA's attention kernel and (inside ``autocast``) its autocast lists apply."""

    def __init__(self) -> None:
        super().__init__()
        self.autocast_dtype: torch.dtype | None = None
        self._cache: dict[int, torch.Tensor] = {}

    @contextmanager
    def autocast(self, dtype: torch.dtype) -> Iterator[None]:
        outer, self.autocast_dtype = self.autocast_dtype, dtype
        try:
            yield
        finally:
            self.autocast_dtype = outer
            if outer is None:
                self._cache.clear()  # CUDA drops its cast weights as the region ends

    def checkpointing(self, model: torch.nn.Module) -> None:
        """Keep these semantics in what activation checkpointing recomputes during the
        backward (where neither this mode nor the forward's autocast is on by itself)."""
        for module in model.modules():
            original = getattr(module, "_gradient_checkpointing_func", None)
            if original is not None:
                module._gradient_checkpointing_func = self._checkpointed(original)

    def _checkpointed(self, original: Any) -> Any:
        def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            dtype = self.autocast_dtype

            def run(*a: Any, **k: Any) -> Any:
                with contextlib.ExitStack() as stack:
                    if self not in _get_current_function_mode_stack():
                        stack.enter_context(self)
                    if dtype is not None and self.autocast_dtype != dtype:
                        stack.enter_context(self.autocast(dtype))
                    return fn(*a, **k)

            return original(run, *args, **kwargs)

        return call

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        dtype = self.autocast_dtype
        if dtype is not None:
            if name == "cross_entropy":
                return _cross_entropy(*args, **kwargs)
            if name in SET_FP32:
                return _in_fp32(func, args, kwargs)
            if name in LOW:
                args, kwargs = self._cast(args, kwargs, dtype)
            elif name in FP32:
                args, kwargs = self._cast(args, kwargs, torch.float32, only=_LOW_DTYPES)
            elif name in PROMOTE:
                args, kwargs = self._promote(args, kwargs)
        if name == "scaled_dot_product_attention":
            return attention(*args, **kwargs)
        if name == "dropout":
            return dropout(func, *args, **kwargs)
        return func(*args, **kwargs)

    def _cast(
        self,
        args: Any,
        kwargs: dict[str, Any],
        dtype: torch.dtype,
        only: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16),
    ) -> tuple[Any, dict[str, Any]]:
        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype in only:
                if x.dtype == dtype:
                    return x
                if x.is_leaf and x.requires_grad:  # a weight: cast once per region
                    hit = self._cache.get(id(x))
                    if hit is None:
                        hit = self._cache[id(x)] = x.to(dtype)
                    return hit
                return x.to(dtype)
            if isinstance(x, list | tuple):
                return type(x)(cast(v) for v in x)
            return x

        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def _promote(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        found: list[torch.dtype] = []

        def scan(x: Any) -> None:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                found.append(x.dtype)
            elif isinstance(x, list | tuple):
                for v in x:
                    scan(v)

        for a in (*args, *kwargs.values()):
            scan(a)
        if len(set(found)) <= 1:
            return args, kwargs
        widest = torch.float32 if torch.float32 in found else found[0]
        return self._cast(args, kwargs, widest)


def _in_fp32(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    first = args[0] if args else None
    if (
        isinstance(first, torch.Tensor)
        and first.dtype in _LOW_DTYPES
        and kwargs.get("dtype") is None
        and len(args) <= 2
    ):
        kwargs = {**kwargs, "dtype": torch.float32}
    return func(*args, **kwargs)


def dropout(func: Any, input: torch.Tensor, p: float = 0.5, *args: Any, **kwargs: Any) -> Any:
    """A dropout as CUDA runs it: ATen's fused kernel (``native_dropout``), which keeps a
    one-byte mask for the backward; the CPU's keeps a mask of the input's own dtype (its
    noise, four bytes an element in float32). ``F.dropout(input, p, training, inplace)``
    and ``torch.dropout(input, p, train)``; in-place and the cases ATen does not fuse (not
    training, p of 0 or 1, an empty input) run as they are."""
    training = args[0] if args else kwargs.get("training", kwargs.get("train", True))
    inplace = args[1] if len(args) > 1 else kwargs.get("inplace", False)
    fused = isinstance(input, torch.Tensor) and input.numel() > 0 and 0 < p < 1
    if not training or inplace or not fused:
        return func(input, p, *args, **kwargs)
    return torch.native_dropout(input, p, True)[0]


def _cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """CUDA's cross entropy under autocast: log_softmax with a float32 output, nll_loss."""
    logs = torch.log_softmax(input, 1 if input.dim() > 1 else 0, dtype=torch.float32)
    if weight is not None:
        weight = weight.float()
    return torch.nn.functional.nll_loss(
        logs, target, weight, ignore_index=ignore_index, reduction=reduction
    )


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA runs it on Hopper with torch 2.11: cuDNN's
    attention for half precision (masks, dropout and grouped heads included), the
    memory-efficient kernel for float32; the math path where neither applies (grouped
    heads in float32; other shapes as on the CPU)."""
    head_dim = query.shape[-1]
    heads_match = query.shape[-3] == key.shape[-3] == value.shape[-3]
    fallback = torch.nn.functional.scaled_dot_product_attention
    low = query.dtype in _LOW_DTYPES
    if query.dim() == 4 and enable_gqa and not heads_match and not low:
        # No fused kernel takes these grouped heads on CUDA: the math path, as CUDA runs
        # it (the CPU would pick its own fused kernel instead).
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=True
        )[0]
    grouped = low and enable_gqa
    if query.dim() != 4 or not (heads_match or grouped) or head_dim % 8 or head_dim > 256:
        return fallback(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:  # turned into an additive mask
        bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill(~bias, float("-inf"))
    if low:
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, False, scale=scale
        )[0]
    if bias is not None:
        length = bias.shape[-1]
        if length % 16:  # the memory-efficient kernel pads the key length to its alignment
            bias = _pad_bias(bias, length)
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale
    )
    return out[0]


def _pad_bias(bias: torch.Tensor, length: int) -> torch.Tensor:
    pad = 16 - length % 16
    return torch.nn.functional.pad(bias, (0, pad))[..., :length]
