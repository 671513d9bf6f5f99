"""A preset: a named, documented experiment spec that answers one question of an
article, built for a device, a dtype and a size.

A preset takes three overrides: ``device``, ``dtype`` (where the preset has one dtype to
vary) and ``size`` (``small`` for CPU tests, ``medium`` as the articles, ``large``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.catalog.model import CatalogError
from vramlab.contract import ErrorType

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
