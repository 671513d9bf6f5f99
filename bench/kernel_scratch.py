"""Memory that kernels allocate for themselves, op by op, in a real training step on CUDA.

Fake tensors see an op's outputs only; a kernel may also allocate buffers of its own
(FlashAttention's float32 gradient accumulator, say) and free them before it returns. This
watches every ATen op of step 2 under a dispatch mode and reads the caching allocator's
counters around it: ``scratch = peak during the op - allocated after it``, the bytes that
existed inside the op and not after. Plain transformers and PyTorch (no vramlab code):

    python -m bench.kernel_scratch \
        '{"model": "vit-base", "batch_size": 64, "precision": "bf16-autocast"}'

Prints the ops with scratch, largest first, and the op during which step 2 peaked, as JSON.
A second mode measures ``scaled_dot_product_attention``'s backward alone over a grid of
shapes (``--sdpa``), the table a prediction rule is read from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Scratch(TorchDispatchMode):
    """Each op's bytes allocated inside it and freed before it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"count": 0, "max": 0, "total": 0, "shapes": None}
        )
        self.peak = 0
        self.peak_op = ""
        self.peak_scratch = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        after = torch.cuda.memory_allocated()
        peak = torch.cuda.max_memory_allocated()
        scratch = peak - after
        name = str(func)
        if scratch > 0:
            row = self.ops[name]
            row["count"] += 1
            row["total"] += scratch
            if scratch > row["max"]:
                row["max"] = scratch
                row["shapes"] = [
                    [list(a.shape), str(a.dtype), list(a.stride())]
                    for a in args
                    if isinstance(a, torch.Tensor)
                ][:6]
        if peak > self.peak:
            self.peak, self.peak_op, self.peak_scratch = peak, name, scratch
        return out


def build(params: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, torch.Tensor], Any]:
    import transformers

    from vramlab.catalog.model_zoo import resolve  # the preset's config (plain data)

    resolved = resolve(params["model"])
    config = transformers.AutoConfig.for_model(
        resolved.model_type, **{**resolved.config, **params.get("config", {})}
    )
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }[resolved.kind]
    precision = params.get("precision", "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    device = torch.device(os.environ.get("SCRATCH_DEVICE", "cuda:0"))
    with device:
        model = auto.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.train()
    batch, seq = params.get("batch_size", 1), params.get("seq_len", 128)
    if resolved.kind == "image-classification":
        size = getattr(config, "image_size", 224)
        pixels = torch.zeros(batch, 3, size, size, device=device, dtype=dtype)
        inputs = {
            "pixel_values": pixels,
            "labels": torch.zeros(batch, dtype=torch.long, device=device),
        }
    else:
        ids = (torch.arange(batch * seq, device=device) % config.vocab_size).reshape(batch, seq)
        inputs = {"input_ids": ids, "labels": ids.clone()}
    autocast = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}.get(precision)
    return model, inputs, autocast


def step_scratch(params: dict[str, Any]) -> dict[str, Any]:
    model, inputs, autocast = build(params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    result: dict[str, Any] = {"params": params}
    for step in (1, 2):
        optimizer.zero_grad(set_to_none=True)
        watch = Scratch() if step == 2 else None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with watch if watch is not None else contextlib.nullcontext():
            with torch.autocast(model.device.type, dtype=autocast, enabled=autocast is not None):
                loss = model(**inputs).loss
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        if watch is not None:
            ops = sorted(watch.ops.items(), key=lambda kv: -kv[1]["max"])
            result.update(
                peak=watch.peak,
                peak_op=watch.peak_op,
                peak_scratch=watch.peak_scratch,
                ops=[{"op": k, **v} for k, v in ops[:25]],
            )
    return result


def sdpa_grid() -> list[dict[str, Any]]:
    """SDPA's backward alone: its scratch for each kernel, dtype and shape, with q, k and v
    laid out as transformers makes them ((batch, seq, heads, dim) transposed)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    shapes = [
        # batch, heads, kv heads, seq, dim
        (64, 12, 12, 197, 64),
        (32, 12, 12, 197, 64),
        (64, 12, 12, 256, 64),
        (8, 12, 12, 1024, 64),
        (4, 16, 16, 512, 64),
        (2, 32, 32, 1024, 128),
        (2, 32, 8, 1024, 128),
        (1, 32, 8, 4096, 128),
        (16, 12, 12, 100, 64),
        (1, 12, 12, 77, 64),
        (3, 8, 8, 300, 80),
        (2, 16, 16, 1000, 96),
    ]
    cases = [
        ("flash", torch.bfloat16, False),
        ("flash", torch.bfloat16, True),
        ("efficient", torch.float32, False),
        ("efficient", torch.bfloat16, False),
        ("efficient", torch.float32, True),
    ]
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    dev = torch.device("cuda:0")
    for b, h, hk, s, d in shapes:
        for kernel, dtype, causal in cases:
            if hk != h and kernel == "efficient":
                continue
            q0 = torch.randn(b, s, h, d, device=dev, dtype=dtype, requires_grad=True)
            k0 = torch.randn(b, s, hk, d, device=dev, dtype=dtype, requires_grad=True)
            v0 = torch.randn(b, s, hk, d, device=dev, dtype=dtype, requires_grad=True)
            q, k, v = (t.transpose(1, 2) for t in (q0, k0, v0))
            try:
                with sdpa_kernel([backends[kernel]]):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal, enable_gqa=hk != h
                    )
                    gout = torch.randn(b, s, h, d, device=dev, dtype=dtype).transpose(1, 2)
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    grads = torch.autograd.grad(out, (q, k, v), gout)
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated()
                    after = torch.cuda.memory_allocated()
            except RuntimeError as exc:
                rows.append({"shape": [b, h, hk, s, d], "kernel": kernel, "error": str(exc)[:120]})
                continue
            held = sum(-(-g.untyped_storage().nbytes() // 512) * 512 for g in grads)
            rows.append(
                {
                    "shape": [b, h, hk, s, d],
                    "kernel": kernel,
                    "dtype": str(dtype).removeprefix("torch."),
                    "causal": causal,
                    "scratch": peak - base - held,
                    "left": after - base - held,
                }
            )
            del out, gout, grads, q, k, v, q0, k0, v0
            torch.cuda.empty_cache()
    return rows


def _grad_scratch(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], gout: torch.Tensor) -> int:
    """The backward's bytes beyond the gradients it returns (the peak over what was live)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(out, inputs, gout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    held = sum(-(-g.untyped_storage().nbytes() // 512) * 512 for g in grads)
    return peak - base - held


def sdpa_choice() -> list[dict[str, Any]]:
    """Which kernel SDPA picks by default, and its backward's scratch, over dtypes, masks,
    dropout, head sizes and lengths (q, k and v laid out as transformers makes them)."""
    rows = []
    dev = torch.device("cuda:0")
    grid = []
    for d in (32, 64, 80, 96, 128, 192, 256):
        for s in (77, 197, 256, 1000, 1024):
            grid.append((4, 8, 8, s, d, torch.bfloat16, None, False, 0.0))
    for dtype in (torch.float16, torch.float32):
        for s in (197, 1024):
            grid.append((4, 8, 8, s, 64, dtype, None, False, 0.0))
    for mask in ("bool", "float", "bool-expanded"):
        for s in (197, 1024):
            grid.append((4, 8, 8, s, 64, torch.bfloat16, mask, False, 0.0))
    for s in (197, 1024, 4096):
        grid.append((2, 8, 8, s, 64, torch.bfloat16, None, True, 0.0))
        grid.append((2, 8, 8, s, 64, torch.bfloat16, None, False, 0.1))
        grid.append((2, 32, 8, s, 128, torch.bfloat16, None, True, 0.0))
        grid.append((2, 32, 8, s, 64, torch.bfloat16, None, True, 0.0))
    grid.append((1, 32, 8, 8192, 128, torch.bfloat16, None, True, 0.0))
    grid.append((64, 12, 12, 197, 64, torch.bfloat16, None, False, 0.0))
    grid.append((64, 12, 12, 197, 64, torch.bfloat16, None, False, 0.1))
    for b, h, hk, s, d, dtype, mask, causal, p in grid:
        q0 = torch.randn(b, s, h, d, device=dev, dtype=dtype, requires_grad=True)
        k0 = torch.randn(b, s, hk, d, device=dev, dtype=dtype, requires_grad=True)
        v0 = torch.randn(b, s, hk, d, device=dev, dtype=dtype, requires_grad=True)
        q, k, v = (t.transpose(1, 2) for t in (q0, k0, v0))
        m = None
        if mask == "bool":
            m = torch.ones(b, 1, s, s, device=dev, dtype=torch.bool).tril()
        elif mask == "bool-expanded":
            m = torch.ones(b, 1, s, s, device=dev, dtype=torch.bool).tril().expand(b, h, s, s)
        elif mask == "float":
            m = torch.zeros(b, 1, s, s, device=dev, dtype=dtype)
        row: dict[str, Any] = {
            "shape": [b, h, hk, s, d],
            "dtype": str(dtype).removeprefix("torch."),
            "mask": mask,
            "causal": causal,
            "dropout": p,
        }
        try:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=m, dropout_p=p, is_causal=causal, enable_gqa=hk != h
            )
            row["kernel"] = type(out.grad_fn).__name__
            gout = torch.randn(b, s, h, d, device=dev, dtype=dtype).transpose(1, 2)
            row["scratch"] = _grad_scratch(out, (q, k, v), gout)
        except RuntimeError as exc:
            row["error"] = str(exc)[:160]
        rows.append(row)
        del q0, k0, v0, q, k, v, m
        torch.cuda.empty_cache()
    return rows


def _reduction_scratch(x: torch.Tensor, op: str, dims: list[int]) -> int:
    """The bytes a reduction held inside its kernel beyond its output."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    y = getattr(torch, op)(x, dim=dims)
    torch.cuda.synchronize()
    scratch = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    del y
    return scratch


def reductions() -> list[dict[str, Any]]:
    """The scratch of CUDA's reduction kernel (its global buffer across blocks) for sums and
    means over shapes, strides and dtypes as training steps make them."""
    rows = []
    dev = torch.device("cuda:0")
    cases: list[tuple[list[int], Any, str, str]] = []
    for shape in (
        [12608, 3072],
        [12608, 768],
        [8192, 2304],
        [8192, 768],
        [2048, 2048],
        [1000, 1000],
        [300, 4096],
        [64, 50257],
        [4096, 128],
        [100000, 64],
        [16384, 4096],
        [512, 12],
        [3, 1000000],
    ):
        for dtype in ("bfloat16", "float32"):
            cases.append((shape, [0], dtype, "sum"))
    for shape, dims in (
        ([2, 1024, 2048], [0, 1]),
        ([8, 1024, 768], [0, 1]),
        ([64, 197, 768], [0, 1]),
        ([8, 1024, 768], [1]),
        ([8, 1024, 768], [2]),
        ([8, 1024, 768], [0]),
        ([64, 768, 14, 14], [0, 2, 3]),
        ([8, 12, 1024, 64], [0, 2]),
        ([4096, 4096], [1]),
        ([1, 16384, 4096], [0, 1]),
        ([7, 333, 1001], [0, 1]),
    ):
        for dtype in ("bfloat16", "float32"):
            cases.append((shape, dims, dtype, "sum"))
    cases.append(([12608, 3072], [0], "float16", "sum"))
    cases.append(([12608, 3072], [0], "float32", "mean"))
    cases.append(([12608, 3072], [0], "float64", "sum"))
    for shape, dims, dtype, op in cases:
        x = torch.randn(*shape, device=dev, dtype=getattr(torch, dtype))
        row = {"shape": shape, "dims": dims, "dtype": dtype, "op": op}
        rows.append({**row, "scratch": _reduction_scratch(x, op, dims)})
        if len(shape) == 2 and dims == [0]:  # through a transposed view: the fastest dim
            xt = x.t().contiguous().t()
            rows.append(
                {**row, "layout": "transposed", "scratch": _reduction_scratch(xt, op, dims)}
            )
            del xt
        del x
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    rows.append(
        {
            "sms": props.multi_processor_count,
            "threads_per_sm": props.max_threads_per_multi_processor,
        }
    )
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("params", nargs="*")
    parser.add_argument("--sdpa", action="store_true")
    parser.add_argument("--sdpa-choice", action="store_true")
    parser.add_argument("--reductions", action="store_true")
    args = parser.parse_args(argv)
    if args.sdpa_choice:
        for row in sdpa_choice():
            print(json.dumps(row))
    if args.reductions:
        for row in reductions():
            print(json.dumps(row))
    if args.sdpa:
        for row in sdpa_grid():
            print(json.dumps(row))
    for text in args.params:
        print(json.dumps(step_scratch(json.loads(text))))


if __name__ == "__main__":
    main(sys.argv[1:])
