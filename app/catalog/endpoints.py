"""The catalog: which ops exist, their parameters, dtypes and devices."""

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from app.api.deps import SettingsDep, require
from app.catalog import DTYPES, OPS
from app.catalog.schemas import CatalogOut, ModelCatalogOut, PresetModelOut
from app.core.config import Settings
from vramlab.catalog.model_zoo import HUB_NAMES, PRESETS, model_types
from vramlab.runspec import MAX_DIMS

router = APIRouter(prefix="/v1", tags=["catalog"], dependencies=[require("read")])


@router.get(
    "/catalog",
    response_model=CatalogOut,
    response_model_exclude_none=True,
    summary="Ops, their parameters, dtypes and devices",
)
def catalog(settings: SettingsDep) -> CatalogOut:
    return CatalogOut.model_validate(listing(settings))


@router.get(
    "/catalog/models",
    response_model=ModelCatalogOut,
    summary="The models op `model` builds: presets, hub names, transformers model_types",
)
def model_catalog() -> ModelCatalogOut:
    return ModelCatalogOut(
        presets=[PresetModelOut.model_validate(asdict(p)) for p in PRESETS.values()],
        hub_names=dict(HUB_NAMES),
        model_types={kind: list(types) for kind, types in model_types().items()},
    )


def listing(settings: Settings) -> dict[str, Any]:
    """The catalog as clients see it (the submit page builds its form from it too)."""
    ops = [
        op.describe()
        for op in OPS.values()
        if settings.diagnostic_ops or "diagnostic" not in op.tags
    ]
    return {
        "ops": ops,
        "dtypes": [{"name": name, "itemsize": size} for name, size in DTYPES.items()],
        "devices": ["cpu", "cuda", "cuda:N"],
        "limits": {
            "max_experiment_bytes": settings.max_experiment_bytes,
            "max_dims": MAX_DIMS,
            "max_repeat": settings.max_repeat,
            "max_timeout_s": settings.max_timeout_s,
        },
    }
