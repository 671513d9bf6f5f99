"""The presets: one or more per code example of four articles (000-003) that people
bring with their questions about GPU memory; what each article claims and what was
measured is in docs/findings.md. Data only: each builds a plain spec (builders.py).
"""

from __future__ import annotations

from app.catalog.model import CatalogError
from app.catalog.presets import builders
from app.catalog.presets.preset import GpuQuestion, Preset, Refusal
from vramlab.contract import ErrorType

_ALLOCATOR = GpuQuestion(
    "the GPU's caching allocator",
    "CPU allocations, which no caching allocator keeps, so nothing fragments",
)


_ALL = (
    Preset(
        "cpu_copy_stays_alive",
        "After tensor.to('cuda'), does the CPU copy stay alive, and what does host RSS do?",
        "000",
        "Examples 1-2",
        lambda d, t, s: builders.moved(d, t, s),
        gpu_question=GpuQuestion(
            "what a move to the GPU leaves on the host", "a copy from one CPU tensor to another"
        ),
    ),
    Preset(
        "gpu_copy_modified",
        "Does modifying the GPU copy in place touch the CPU copy or allocate anything?",
        "000",
        "Example 3",
        builders.gpu_copy_modified,
        gpu_question=GpuQuestion(
            "a GPU copy changed in place", "a second CPU tensor changed in place"
        ),
    ),
    Preset(
        "transfer_pageable",
        "How fast is a pageable host-to-device copy, and what host memory does it use?",
        "000",
        "Example 2",
        lambda d, t, s: builders.moved(d, t, s),
        gpu_question=GpuQuestion("a host-to-GPU copy", "a CPU-to-CPU copy"),
    ),
    Preset(
        "transfer_pinned",
        "How fast is a copy from pinned (page-locked) memory, and "
        "how much pinned host memory does it hold?",
        "000",
        "Example 2",
        lambda d, t, s: builders.moved(d, t, s, pin_memory=True, non_blocking=True),
        needs_cuda=True,
    ),
    Preset(
        "bfloat16_moved_and_used",
        "Can a bfloat16 tensor be moved to the GPU and used (matmul, sum)?",
        "001",
        "Example 1",
        builders.bf16,
        default_dtype="bfloat16",
        gpu_question=GpuQuestion("bfloat16 on the GPU", "bfloat16 on the CPU"),
    ),
    Preset(
        "dtype_support_matrix",
        "Which dtypes can be created, moved and used by which op on this device?",
        "001",
        "Example 1",
        builders.dtype_matrix,
    ),
    Preset(
        "fragmentation_article_loop",
        "Do 100 allocate/free cycles of one size fragment memory before a large allocation?",
        "001",
        "Example 2",
        builders.fragmentation("article"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_empty_cache",
        "What does empty_cache() change before the large allocation?",
        "001",
        "Example 2",
        builders.fragmentation("empty_cache"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_holes",
        "Freeing every other block leaves holes: does a larger "
        "request reuse them or grow reserved memory?",
        "001",
        "Example 2",
        builders.fragmentation("holes"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_expandable_segments",
        "The same holes with expandable_segments: how much does reserved grow?",
        "001",
        "Example 2",
        builders.fragmentation("expandable"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "numpy_tensor_moved",
        "Does a NumPy-made (row-major) tensor move to the GPU, and at what size?",
        "001",
        "Example 3",
        builders.from_numpy,
        default_dtype="float64",
        gpu_question=GpuQuestion("a move to the GPU", "a copy on the CPU"),
    ),
    Preset(
        "elementwise_add",
        "Does a + b allocate more than its output?",
        "002",
        "Example 1",
        builders.add,
    ),
    Preset(
        "matmul_1000x2000_2000x500",
        "How much does matmul allocate beyond its output?",
        "002",
        "Example 2",
        builders.matmul,
    ),
    Preset(
        "inplace_add_requires_grad",
        "Does add_ on a tensor with requires_grad allocate temporaries?",
        "002",
        "Example 3",
        builders.inplace(True),
        refusal=Refusal(ErrorType.AUTOGRAD_ERROR, "autograd refuses this"),
    ),
    Preset(
        "inplace_add_no_grad",
        "How much does add_ allocate without autograd?",
        "002",
        "Example 3",
        builders.inplace(False),
    ),
    Preset(
        "cpu_then_cuda_vs_on_gpu",
        "A tensor created on the CPU then moved, against one "
        "created on the GPU: what does each cost, on the device and the host?",
        "003",
        "Example 1",
        builders.cpu_then_cuda,
        gpu_question=GpuQuestion(
            "a tensor moved to the GPU against one made there", "two tensors made on the CPU"
        ),
    ),
    Preset(
        "model_left_on_cpu",
        "A model left on the CPU with its input on the GPU: does it silently run on the CPU?",
        "003",
        "Example 2",
        builders.model(True),
        needs_cuda=True,
        refusal=Refusal(
            ErrorType.DEVICE_MISMATCH, "PyTorch refuses inputs on two devices (no silent CPU run)"
        ),
    ),
    Preset(
        "model_moved_to_gpu",
        "The same MLP (1000-500-100) on the device: parameters, output and what autograd keeps",
        "003",
        "Example 2",
        builders.model(False),
        gpu_question=GpuQuestion("a model on the GPU", "the model on the CPU"),
    ),
    Preset(
        "non_blocking_copy_then_compute",
        "A non_blocking copy from pageable memory followed by a computation and a copy back",
        "003",
        "Example 3",
        builders.non_blocking,
        gpu_question=GpuQuestion("a non_blocking copy to the GPU", "a CPU-to-CPU copy"),
    ),
    Preset(
        "tensors_on_two_devices",
        "An op whose inputs sit on the CPU and the GPU",
        "003",
        "Clear explanation",
        builders.mixed("tensor_tensor"),
        needs_cuda=True,
        refusal=Refusal(ErrorType.DEVICE_MISMATCH, "PyTorch refuses inputs on two devices"),
    ),
    Preset(
        "cpu_scalar_with_gpu_tensor",
        "A CPU 0-dim tensor with a GPU tensor: allowed?",
        "003",
        "Clear explanation",
        builders.mixed("cpu_scalar"),
        gpu_question=GpuQuestion("a CPU scalar beside a GPU tensor", "two CPU tensors"),
    ),
)

PRESETS: dict[str, Preset] = {p.name: p for p in _ALL}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise CatalogError(
            "name", f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}"
        ) from None
