"""Typed dependencies: the request's session (committed before the response is sent),
settings, the work signal, and look-ups that 404."""

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.db import Database
from app.models import Experiment
from app.models.base import utcnow
from app.services import experiments
from app.services.signals import WorkSignal

READ_METHODS = ("GET", "HEAD", "OPTIONS")


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_signal(request: Request) -> WorkSignal:
    signal: WorkSignal = request.app.state.signal
    return signal


def session(request: Request, db: Annotated[Database, Depends(get_db)]) -> Iterator[Session]:
    """One unit of work per request: commit at the end, roll back on any error."""
    with db.session(write=request.method not in READ_METHODS) as s:
        yield s


def now() -> datetime:
    return utcnow()


SessionDep = Annotated[Session, Depends(session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SignalDep = Annotated[WorkSignal, Depends(get_signal)]
NowDep = Annotated[datetime, Depends(now)]


def experiment(s: SessionDep, experiment_id: Annotated[str, Path(max_length=64)]) -> Experiment:
    return experiments.get(s, experiment_id)


ExperimentDep = Annotated[Experiment, Depends(experiment)]
