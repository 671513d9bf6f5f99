"""Transfers between devices (catalog family transfer)."""

import numpy as np
import torch

from workers.ops.base import Inputs, Op, OpContext, Outputs, filled, torch_dtype


def _setup(ctx: OpContext) -> Inputs:
    p = ctx.params
    dtype = torch_dtype(p["source_dtype"]) if p.get("source_dtype") else ctx.dtype
    device = p.get("source_device") or "cpu"
    if p.get("source_kind") == "numpy":
        # NumPy's default row-major (C-contiguous) array, shared by the tensor, not copied.
        array = np.ones(ctx.shape, dtype=str(dtype).removeprefix("torch."))
        source = torch.from_numpy(array)
        ctx.extras["numpy"] = {
            "c_contiguous": bool(array.flags["C_CONTIGUOUS"]),
            "tensor_is_contiguous": source.is_contiguous(),
            "shares_memory_with_array": source.data_ptr() == array.ctypes.data,
            "dtype": str(array.dtype),
        }
        if p.get("pin_memory"):
            source = source.pin_memory()
        return {"source": source}
    return {"source": filled(ctx.shape, dtype, device, pin_memory=bool(p.get("pin_memory")))}


def _run(i: Inputs, c: OpContext) -> Outputs:
    out = i["source"].to(
        c.device,
        c.dtype,
        non_blocking=bool(c.params.get("non_blocking")),
        copy=bool(c.params.get("copy")),
    )
    src = i["source"]
    c.extras["copies"] = {
        "source": {"device": str(src.device), "bytes": src.nbytes, "pinned": src.is_pinned()},
        "out": {"device": str(out.device), "bytes": out.nbytes},
        "same_tensor": out is src,
        "both_alive": out is not src,
    }
    return out


OPS = {"to": Op(_setup, _run, bytes_moved=lambda i, _: i["source"].nbytes)}
