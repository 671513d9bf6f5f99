"""What GET /v1/catalog says: the ops a client may queue, their parameters and limits."""

from typing import Any

from pydantic import BaseModel, Field

from app.catalog.model import ParamKind


class ParamOut(BaseModel):
    name: str
    kind: ParamKind
    description: str
    required: bool
    default: Any = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: list[Any] | None = None


class OpOut(BaseModel):
    name: str
    summary: str
    params: list[ParamOut]
    dtypes: list[str]
    devices: list[str]
    min_dims: int
    tags: list[str]


class DtypeOut(BaseModel):
    name: str
    itemsize: int


class Limits(BaseModel):
    max_experiment_bytes: int
    max_dims: int
    max_repeat: int
    max_timeout_s: float


class CatalogOut(BaseModel):
    ops: list[OpOut]
    dtypes: list[DtypeOut]
    devices: list[str] = Field(description='"cpu", "cuda", or "cuda:N" for GPU N')
    limits: Limits


class PresetModelOut(BaseModel):
    name: str
    model_type: str
    kind: str
    about: str
    config: dict[str, Any]


class ModelCatalogOut(BaseModel):
    """What op ``model`` builds: named presets, hub names mapped to them, and every
    transformers model_type by task kind (random weights; nothing is downloaded)."""

    presets: list[PresetModelOut]
    hub_names: dict[str, str] = Field(
        description="hub checkpoint names and the preset with their shape"
    )
    model_types: dict[str, list[str]] = Field(description="task kind: model_types built for it")
