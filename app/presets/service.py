"""Presets: list them, and queue one as an experiment with the client's overrides."""

from datetime import datetime

from sqlalchemy.orm import Session

from app.catalog import CatalogError
from app.catalog.presets.articles import PRESETS, get_preset
from app.catalog.presets.preset import Preset
from app.core.config import Settings
from app.core.errors import Conflict, InvalidSpec, NotFound
from app.core.signals import WorkSignal
from app.experiments import service as experiments
from app.experiments import views as experiment_views
from app.experiments.schemas import ExperimentOut
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import accept
from app.presets.schemas import PresetOut, PresetRun
from app.queue import workers


def _preset(name: str) -> Preset:
    try:
        return get_preset(name)
    except CatalogError as exc:
        raise NotFound(exc.message) from None


def listing() -> list[PresetOut]:
    return [PresetOut.model_validate(p.describe()) for p in PRESETS.values()]


def spec_of(name: str, run: PresetRun, device: str) -> ExperimentSpec:
    """The preset's spec with the overrides applied; 404 for an unknown name."""
    preset = _preset(name)
    try:
        raw = preset.spec(device, run.dtype, run.size)
    except CatalogError as exc:
        raise InvalidSpec(exc.field, exc.message) from None
    raw["tags"] = [*raw.get("tags", []), *run.tags]
    raw["priority"] = run.priority
    raw["isolation"] = run.isolation
    return ExperimentSpec.model_validate(raw)


def queue(
    session: Session,
    name: str,
    run: PresetRun,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    submitted_by: str | None,
) -> ExperimentOut:
    """Queue the preset and answer as a submit does."""
    device = run.device
    if device is None:
        device = workers.default_device(session, now, settings.worker_live_seconds)
        if _preset(name).needs_cuda and device != "cuda":
            raise Conflict(
                f"preset {name!r} needs a CUDA GPU and no live worker has one; start a worker "
                "on a machine with a GPU, or pass a device to queue it anyway"
            )
    spec = spec_of(name, run, device)
    accepted = accept(spec, settings)  # a preset is small: planning it here is cheap
    row = experiments.submit(
        session, accepted, settings, signal, now, submitted_by=submitted_by, preset=name
    )
    queue = experiments.queue_info(session, accepted, settings, now)
    return experiment_views.queued_out(row, accepted, queue)
