"""Presets as the API shows them, and the overrides a client may send to run one."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.data import RequestBody
from app.experiments.spec_schemas import Tag
from vramlab.contract import Isolation


class PresetOut(BaseModel):
    name: str
    question: str = Field(description="the question the preset answers")
    article: str = Field(
        description="where to read what its article claims and what was measured: a "
        "section of docs/findings.md in the repository"
    )
    article_id: str = Field(description="the article (000-003) whose code it measures")
    example: str
    needs_cuda: bool
    expected_refusal: str | None = Field(
        default=None,
        description="where the preset's answer is a refusal by PyTorch: that refusal (a run "
        "that fails with it has answered the question)",
    )
    gpu_question: str | None = Field(
        default=None,
        description="where the question is about the GPU but the preset also runs on the "
        "CPU: what it asks about (a CPU run says that it does not answer it)",
    )
    default_dtype: str
    spec: dict[str, Any] = Field(description="the spec it queues at size medium on cuda")


class PresetRun(RequestBody):
    """Overrides for one run of a preset; every field is optional."""

    model_config = ConfigDict(extra="forbid")

    device: str | None = Field(
        default=None,
        max_length=16,
        description="'cpu', 'cuda' or 'cuda:N'; left out: CUDA where a live worker offers it, "
        "else the CPU (a preset that needs CUDA is refused while no live worker has it)",
    )
    dtype: str | None = Field(default=None, max_length=32, description="the preset's dtype")
    size: Literal["small", "medium", "large"] = Field(
        default="medium", description="small (CPU tests), medium (the articles' sizes), large"
    )
    isolation: Isolation = Field(
        default=Isolation.CLEAN,
        description="'clean' or 'shared' (a worker's long-lived process; see the spec's "
        "isolation); a preset that sets allocator options runs clean only",
    )
    tags: list[Tag] = Field(default_factory=list, max_length=16)
    priority: int = Field(default=0, ge=-100, le=100)
