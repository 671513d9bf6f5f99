"""Responses of the GPU catalog (``/v1/gpus``)."""

from typing import Literal

from pydantic import BaseModel, Field


class GpuOut(BaseModel):
    name: str
    aliases: list[str] = Field(description="other names that resolve to it (loosely matched)")
    architecture: str
    compute_capability: str = Field(examples=["9.0"])
    total_bytes: int = Field(description="the card's memory as PyTorch reports it")
    usable_bytes: int = Field(
        description="what a PyTorch process's caching allocator may reserve: total less the "
        "CUDA context, what the driver keeps and cuBLAS's handles (capacity_bytes' scale)"
    )
    overhead_bytes: int = Field(description="total_bytes - usable_bytes")
    usable_source: Literal["measured", "placeholder", "estimate"] = Field(
        description="measured on the card (bench/usable_memory.py); placeholder: to be "
        "measured, the architecture's estimate meanwhile; estimate: the architecture's"
    )
    source: str = Field(description="where the figures come from")
    bf16: bool = Field(description="native bf16 (sm80+)")
    flash_attention: bool = Field(description="FlashAttention kernels (sm80+)")
    cublas_workspace_bytes: int = Field(description="cuBLAS's workspace per handle")
    marketing_bytes: int | None = Field(default=None, description="the size it is sold as (GB)")
    from_worker: bool = Field(description="a live worker's own GPU")


class GpuList(BaseModel):
    items: list[GpuOut]
