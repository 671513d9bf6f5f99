"""Presets: named, documented experiment specs, one or more per code example of four
articles (000-003) that people bring with their questions about GPU memory; what each
article claims and what was measured is in docs/findings.md. Data only: each builds a
plain spec.

A preset takes three overrides: ``device``, ``dtype`` (where the preset has one dtype to
vary) and ``size`` (``small`` for CPU tests, ``medium`` as the articles, ``large``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlab.contract import ErrorType

from app.catalog.model import CatalogError

SIZES = ("small", "medium", "large")
# Where a reader finds what an article claims and what the presets measured.
ARTICLES_DOC = "docs/findings.md"
Spec = dict[str, Any]
Builder = Callable[[str, str, str], Spec]


class PresetError(CatalogError):
    """A preset that cannot be built for these overrides (a CUDA-only preset on the CPU)."""


@dataclass(frozen=True)
class Refusal:
    """A preset whose answer is that PyTorch refuses: a failure of type ``error`` is that
    answer, said in a few words by ``answer``."""

    error: ErrorType
    answer: str


@dataclass(frozen=True)
class GpuQuestion:
    """A question about the GPU: ``asks`` names it, ``measures_on_cpu`` says what the same
    steps measure on the CPU."""

    asks: str
    measures_on_cpu: str


_ALLOCATOR = GpuQuestion(
    "the GPU's caching allocator",
    "CPU allocations, which no caching allocator keeps, so nothing fragments",
)


@dataclass(frozen=True)
class Preset:
    name: str
    question: str
    article: str  # which article the code comes from: "000" .. "003"
    example: str  # which of its examples
    build: Builder  # (device, dtype, size) -> spec
    default_dtype: str = "float32"
    needs_cuda: bool = False
    # Set where the question's answer is a refusal: the experiment fails, as expected.
    refusal: Refusal | None = None
    # Set where the question is about the GPU but the preset also runs on the CPU: what
    # it asks about, and what a CPU run measures instead.
    gpu_question: GpuQuestion | None = None

    def without_gpu(self, device: str) -> str | None:
        """What a run on ``device`` does not answer, where the question needs a GPU."""
        if self.gpu_question is None or device.startswith("cuda"):
            return None
        q = self.gpu_question
        return (
            f"Ran without a GPU (on {device}): this preset asks about {q.asks}, and a run on "
            f"the CPU measures {q.measures_on_cpu} instead, which does not answer that "
            f"question. Run it where a worker has a CUDA GPU "
            f"(vramlab run {self.name} --device cuda)."
        )

    def expected_refusal(self, error_type: str | None) -> str | None:
        """The preset's answer when a run failed with ``error_type``: the refusal it
        expects, else None (no failure, or one that answers nothing)."""
        if self.refusal is None or error_type != self.refusal.error:
            return None
        return self.refusal.answer

    def spec(self, device: str = "cuda", dtype: str | None = None, size: str = "medium") -> Spec:
        if size not in SIZES:
            raise PresetError("size", f"must be one of {', '.join(SIZES)}")
        if self.needs_cuda and not device.startswith("cuda"):
            raise PresetError(
                "device", f"preset {self.name!r} needs a CUDA device: {self.question}"
            )
        spec = self.build(device, dtype or self.default_dtype, size)
        spec.setdefault("device", device)
        spec.setdefault("dtype", dtype or self.default_dtype)
        spec["tags"] = [*spec.get("tags", []), f"preset:{self.name}", f"article:{self.article}"]
        return spec

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "question": self.question,
            "article": f"{ARTICLES_DOC}#article-{self.article}",
            "article_id": self.article,
            "example": self.example,
            "needs_cuda": self.needs_cuda,
            "expected_refusal": self.refusal.answer if self.refusal else None,
            "gpu_question": self.gpu_question.asks if self.gpu_question else None,
            "default_dtype": self.default_dtype,
            "spec": self.spec("cuda", None, "medium"),
        }


def _pick(size: str, small: Any, medium: Any, large: Any) -> Any:
    return {"small": small, "medium": medium, "large": large}[size]


def _square(size: str) -> list[int]:
    n = _pick(size, 64, 4096, 8192)
    return [n, n]


def _to(device: str, dtype: str, size: str, **params: Any) -> Spec:
    on_cpu = device == "cpu"
    return {
        "op": "to",
        "shape": _square(size),
        "params": {"copy": True, **params} if on_cpu else params,
        "dtype": dtype,
    }


def _scenario(steps: list[dict[str, Any]], **extra: Any) -> Spec:
    return {"op": "scenario", "shape": [], "steps": steps, "repeat": 1, "warmup": 0, **extra}


def _fragmentation(kind: str) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        m = _pick(size, 4096, 1024 * 1024, 4 * 1024 * 1024)  # elements: 4 MiB of float32
        if kind in ("article", "empty_cache"):
            # The article's loop: allocate and free the same size 100 times, then ask big.
            steps: list[dict[str, Any]] = [
                {
                    "do": "repeat",
                    "times": 100,
                    "steps": [
                        {"do": "create", "name": "t", "fn": "randn", "shape": [m]},
                        {"do": "delete", "name": "t"},
                    ],
                },
            ]
            if kind == "empty_cache":
                steps.append({"do": "empty_cache"})
            steps.append({"do": "create", "name": "large", "fn": "randn", "shape": [100 * m]})
            return _scenario(steps)
        # Holes: keep every other block, then ask for one larger than any hole.
        steps = [
            {"do": "create", "name": "xs", "fn": "empty", "shape": [m], "count": 64},
            {"do": "delete", "name": "xs", "every": 2},
            {"do": "create", "name": "large", "fn": "empty", "shape": [16 * m]},
            {"do": "empty_cache", "label": "empty_cache (cached holes go back)"},
        ]
        allocator = {"expandable_segments": True} if kind == "expandable" else {}
        return _scenario(steps, allocator=allocator)

    return build


def _cpu_then_cuda(device: str, dtype: str, size: str) -> Spec:
    shape = _pick(size, [64, 64], [1000, 1000], [8192, 8192])
    return _scenario(
        [
            {"do": "create", "name": "x", "fn": "randn", "shape": shape, "device": "cpu"},
            {"do": "move", "name": "x_dev", "src": "x", "device": device},
            {"do": "create", "name": "two", "fn": "full", "shape": [], "value": 2.0},
            {"do": "op", "name": "y", "fn": "mul", "args": ["x_dev", "two"]},
            {"do": "create", "name": "x_gpu", "fn": "randn", "shape": shape},
            {"do": "op", "name": "y_gpu", "fn": "mul", "args": ["x_gpu", "two"]},
        ]
    )


def _non_blocking(device: str, dtype: str, size: str) -> Spec:
    shape = _pick(size, [64, 64], [500, 500], [8192, 8192])
    return _scenario(
        [
            {"do": "create", "name": "cpu_tensor", "fn": "randn", "shape": shape, "device": "cpu"},
            {"do": "create", "name": "gpu_tensor", "fn": "randn", "shape": shape},
            {
                "do": "move",
                "name": "copy",
                "src": "cpu_tensor",
                "device": device,
                "non_blocking": True,
            },
            {"do": "op", "name": "result", "fn": "mul", "args": ["copy", "gpu_tensor"]},
            {"do": "move", "name": "cpu_result", "src": "result", "device": "cpu"},
        ]
    )


def _bf16(device: str, dtype: str, size: str) -> Spec:
    shape = _pick(size, [64, 64], [1024, 1024], [8192, 8192])
    return _scenario(
        [
            {"do": "create", "name": "t", "fn": "ones", "shape": shape, "device": "cpu"},
            {"do": "move", "name": "t_dev", "src": "t", "device": device},
            {"do": "op", "name": "y", "fn": "matmul", "args": ["t_dev", "t_dev"]},
            {"do": "op", "name": "s", "fn": "sum", "args": ["y"]},
        ],
        dtype=dtype,
    )


def _gpu_copy_modified(device: str, dtype: str, size: str) -> Spec:
    return _scenario(
        [
            {
                "do": "create",
                "name": "cpu_tensor",
                "fn": "ones",
                "shape": _square(size),
                "device": "cpu",
            },
            {"do": "move", "name": "gpu_tensor", "src": "cpu_tensor", "device": device},
            {"do": "create", "name": "ten", "fn": "full", "shape": [1], "value": 10.0},
            {"do": "op", "fn": "mul_", "args": ["gpu_tensor", "ten"]},
        ]
    )


def _add(device: str, dtype: str, size: str) -> Spec:
    return {"op": "add", "shape": _pick(size, [64, 64], [1000, 1000], [8192, 8192])}


def _matmul(device: str, dtype: str, size: str) -> Spec:
    a, b = _pick(
        size, ([64, 128], [128, 32]), ([1000, 2000], [2000, 500]), ([8000, 16000], [16000, 4000])
    )
    return {"op": "matmul", "shape": a, "params": {"other_shape": b}}


def _inplace(requires_grad: bool) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        return {
            "op": "add_",
            "shape": _pick(size, [64, 64], [1000, 1000], [8192, 8192]),
            "params": {"requires_grad": requires_grad},
        }

    return build


def _model(on_cpu: bool) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        batch = _pick(size, 1, 1, 4096)
        if on_cpu:
            return {
                "op": "mixed_device",
                "shape": [batch, 1000],
                "params": {"case": "module_on_cpu"},
            }
        return {
            "op": "module_forward",
            "shape": [batch, 1000],
            "params": {"module": "mlp", "width": 500, "out_features": 100, "layers": 1},
        }

    return build


def _numpy(device: str, dtype: str, size: str) -> Spec:
    shape = _pick(size, [10, 10], [4096, 4096], [8192, 8192])
    params: dict[str, Any] = {"source_kind": "numpy", "source_dtype": dtype}
    if device == "cpu":
        params["copy"] = True
    return {"op": "to", "shape": shape, "params": params, "dtype": dtype}


def _mixed(case: str) -> Builder:
    def build(device: str, dtype: str, size: str) -> Spec:
        return {
            "op": "mixed_device",
            "shape": _pick(size, [64], [1024, 1024], [8192, 8192]),
            "params": {"case": case},
        }

    return build


def _dtype_matrix(device: str, dtype: str, size: str) -> Spec:
    return {
        "op": "dtype_support",
        "shape": _pick(size, [8, 8], [64, 64], [1024, 1024]),
        "repeat": 1,
        "warmup": 0,
    }


_ALL = (
    Preset(
        "cpu_copy_stays_alive",
        "After tensor.to('cuda'), does the CPU copy stay alive, and what does host RSS do?",
        "000",
        "Examples 1-2",
        lambda d, t, s: _to(d, t, s),
        gpu_question=GpuQuestion(
            "what a move to the GPU leaves on the host", "a copy from one CPU tensor to another"
        ),
    ),
    Preset(
        "gpu_copy_modified",
        "Does modifying the GPU copy in place touch the CPU copy or allocate anything?",
        "000",
        "Example 3",
        _gpu_copy_modified,
        gpu_question=GpuQuestion(
            "a GPU copy changed in place", "a second CPU tensor changed in place"
        ),
    ),
    Preset(
        "transfer_pageable",
        "How fast is a pageable host-to-device copy, and what host memory does it use?",
        "000",
        "Example 2",
        lambda d, t, s: _to(d, t, s),
        gpu_question=GpuQuestion("a host-to-GPU copy", "a CPU-to-CPU copy"),
    ),
    Preset(
        "transfer_pinned",
        "How fast is a copy from pinned (page-locked) memory, and "
        "how much pinned host memory does it hold?",
        "000",
        "Example 2",
        lambda d, t, s: _to(d, t, s, pin_memory=True, non_blocking=True),
        needs_cuda=True,
    ),
    Preset(
        "bfloat16_moved_and_used",
        "Can a bfloat16 tensor be moved to the GPU and used (matmul, sum)?",
        "001",
        "Example 1",
        _bf16,
        default_dtype="bfloat16",
        gpu_question=GpuQuestion("bfloat16 on the GPU", "bfloat16 on the CPU"),
    ),
    Preset(
        "dtype_support_matrix",
        "Which dtypes can be created, moved and used by which op on this device?",
        "001",
        "Example 1",
        _dtype_matrix,
    ),
    Preset(
        "fragmentation_article_loop",
        "Do 100 allocate/free cycles of one size fragment memory before a large allocation?",
        "001",
        "Example 2",
        _fragmentation("article"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_empty_cache",
        "What does empty_cache() change before the large allocation?",
        "001",
        "Example 2",
        _fragmentation("empty_cache"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_holes",
        "Freeing every other block leaves holes: does a larger "
        "request reuse them or grow reserved memory?",
        "001",
        "Example 2",
        _fragmentation("holes"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "fragmentation_expandable_segments",
        "The same holes with expandable_segments: how much does reserved grow?",
        "001",
        "Example 2",
        _fragmentation("expandable"),
        gpu_question=_ALLOCATOR,
    ),
    Preset(
        "numpy_tensor_moved",
        "Does a NumPy-made (row-major) tensor move to the GPU, and at what size?",
        "001",
        "Example 3",
        _numpy,
        default_dtype="float64",
        gpu_question=GpuQuestion("a move to the GPU", "a copy on the CPU"),
    ),
    Preset(
        "elementwise_add", "Does a + b allocate more than its output?", "002", "Example 1", _add
    ),
    Preset(
        "matmul_1000x2000_2000x500",
        "How much does matmul allocate beyond its output?",
        "002",
        "Example 2",
        _matmul,
    ),
    Preset(
        "inplace_add_requires_grad",
        "Does add_ on a tensor with requires_grad allocate temporaries?",
        "002",
        "Example 3",
        _inplace(True),
        refusal=Refusal(ErrorType.AUTOGRAD_ERROR, "autograd refuses this"),
    ),
    Preset(
        "inplace_add_no_grad",
        "How much does add_ allocate without autograd?",
        "002",
        "Example 3",
        _inplace(False),
    ),
    Preset(
        "cpu_then_cuda_vs_on_gpu",
        "A tensor created on the CPU then moved, against one "
        "created on the GPU: what does each cost, on the device and the host?",
        "003",
        "Example 1",
        _cpu_then_cuda,
        gpu_question=GpuQuestion(
            "a tensor moved to the GPU against one made there", "two tensors made on the CPU"
        ),
    ),
    Preset(
        "model_left_on_cpu",
        "A model left on the CPU with its input on the GPU: does it silently run on the CPU?",
        "003",
        "Example 2",
        _model(True),
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
        _model(False),
        gpu_question=GpuQuestion("a model on the GPU", "the model on the CPU"),
    ),
    Preset(
        "non_blocking_copy_then_compute",
        "A non_blocking copy from pageable memory followed by a computation and a copy back",
        "003",
        "Example 3",
        _non_blocking,
        gpu_question=GpuQuestion("a non_blocking copy to the GPU", "a CPU-to-CPU copy"),
    ),
    Preset(
        "tensors_on_two_devices",
        "An op whose inputs sit on the CPU and the GPU",
        "003",
        "Clear explanation",
        _mixed("tensor_tensor"),
        needs_cuda=True,
        refusal=Refusal(ErrorType.DEVICE_MISMATCH, "PyTorch refuses inputs on two devices"),
    ),
    Preset(
        "cpu_scalar_with_gpu_tensor",
        "A CPU 0-dim tensor with a GPU tensor: allowed?",
        "003",
        "Clear explanation",
        _mixed("cpu_scalar"),
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
