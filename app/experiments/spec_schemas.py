"""The experiment spec a client submits: plain data, checked field by field."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.core.data import TEXT_PATTERN, DataDict, RequestBody
from vramlab import runspec as run
from vramlab.contract import Isolation

Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f]+$")]
Dim = Annotated[int, Field(ge=0, le=run.MAX_DIM_SIZE, strict=True)]


class AllocatorSettings(BaseModel):
    """PyTorch caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF) for this experiment alone."""

    model_config = ConfigDict(extra="forbid")

    expandable_segments: bool | None = Field(default=None, strict=True)
    max_split_size_mb: int | None = Field(default=None, ge=20, le=2**20, strict=True)
    garbage_collection_threshold: float | None = Field(default=None, gt=0, lt=1, strict=True)
    roundup_power2_divisions: int | None = Field(default=None, ge=1, le=64, strict=True)
    backend: Literal["native", "cudaMallocAsync"] | None = None


class Requirements(BaseModel):
    """What a worker must have beyond the spec's device."""

    model_config = ConfigDict(extra="forbid")

    gpu_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=TEXT_PATTERN,
        description="a substring of the GPU's name",
    )
    min_memory_bytes: int | None = Field(default=None, ge=0, le=2**50, strict=True)


class ExperimentSpec(RequestBody):
    """One experiment: an op from the catalog, its shapes, dtype, device and options."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "op": "matmul",
                    "shape": [1000, 2000],
                    "params": {"other_shape": [2000, 500]},
                    "dtype": "float32",
                }
            ]
        },
    )

    op: str = Field(max_length=64, description="an op from GET /v1/catalog")
    shape: list[Dim] = Field(
        default_factory=list,
        max_length=run.MAX_DIMS,
        description="the main tensor's shape; [] for a scenario",
    )
    params: DataDict = Field(default_factory=dict, description="the op's parameters")
    dtype: str = Field(default=run.DEFAULT_DTYPE, max_length=32)
    device: str | None = Field(
        default=None,
        max_length=16,
        description="'cpu', 'cuda' or 'cuda:N'; left out, the service picks one that a live "
        "worker offers (CUDA where one can run it, else the CPU) and the experiment records it",
    )
    warmup: int = Field(default=run.DEFAULT_WARMUP, ge=0, le=run.MAX_WARMUP, strict=True)
    repeat: int = Field(default=run.DEFAULT_REPEAT, ge=1, strict=True)
    timeout_s: float = Field(default=run.DEFAULT_TIMEOUT_S, gt=0, strict=True)
    allocator: AllocatorSettings = Field(default_factory=AllocatorSettings)
    trace: run.TraceMode = run.DEFAULT_TRACE
    isolation: Isolation = Field(
        default=run.DEFAULT_ISOLATION,
        description="'clean': a process of its own (the allocator, the CUDA context and every "
        "library start fresh, as in a new program). 'shared': a long-lived worker process "
        "that runs many experiments, emptied and checked before each (allocator empty, stats "
        "reset, cuBLAS workspace freed) but with kernels, library handles and the CUDA "
        "context kept: far faster for sweeps of many small points. Shared takes no "
        "allocator settings (they are fixed when the allocator starts)",
    )
    tags: list[Tag] = Field(default_factory=list, max_length=32)
    priority: int = Field(default=0, ge=-100, le=100, strict=True)
    requirements: Requirements = Field(default_factory=Requirements)
    steps: list[DataDict] | None = Field(
        default=None,
        max_length=64,
        description="with op 'scenario': named-tensor steps (create, op, move, pin, delete, "
        "empty_cache, synchronize, repeat), validated as data; see docs/catalog.md",
    )
