"""Presets: list them, and queue one as an experiment with the client's overrides."""

from datetime import datetime

from sqlalchemy.orm import Session

from app.catalog import CatalogError
from app.catalog.presets import PRESETS, get_preset
from app.core.config import Settings
from app.errors import InvalidSpec, NotFound
from app.models import Experiment
from app.schemas.preset import PresetOut, PresetRun
from app.schemas.spec import ExperimentSpec
from app.services import experiments
from app.services.signals import WorkSignal


def listing() -> list[PresetOut]:
    return [PresetOut.model_validate(p.describe()) for p in PRESETS.values()]


def spec_of(name: str, run: PresetRun) -> ExperimentSpec:
    """The preset's spec with the overrides applied; 404 for an unknown name."""
    try:
        preset = get_preset(name)
    except CatalogError as exc:
        raise NotFound(exc.message) from None
    try:
        raw = preset.spec(run.device, run.dtype, run.size)
    except CatalogError as exc:
        raise InvalidSpec(exc.field, exc.message) from None
    raw["tags"] = [*raw.get("tags", []), *run.tags]
    raw["priority"] = run.priority
    return ExperimentSpec.model_validate(raw)


def queue(
    session: Session,
    name: str,
    run: PresetRun,
    settings: Settings,
    signal: WorkSignal,
    now: datetime,
    submitted_by: str | None,
) -> Experiment:
    spec = spec_of(name, run)
    experiments.check_quota(session, submitted_by, settings)
    return experiments.submit(
        session, spec, settings, signal, now, submitted_by=submitted_by, preset=name
    )
