"""Presets: named experiment specs for the classic questions, and queuing one."""

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path

from app.access import tokens as auth
from app.access.tokens import Principal
from app.api.deps import NowDep, SessionDep, SettingsDep, SignalDep, require
from app.core.errors import ERROR_RESPONSES
from app.experiments.schemas import ExperimentOut
from app.presets import service as presets
from app.presets.schemas import PresetOut, PresetRun
from app.queue import local_worker

router = APIRouter(prefix="/v1/presets", tags=["presets"], responses=ERROR_RESPONSES)


@router.get(
    "",
    response_model=list[PresetOut],
    summary="Named experiments, each with the question it answers and its article",
    dependencies=[require("read")],
)
def list_presets() -> list[PresetOut]:
    return presets.listing()


@router.post(
    "/{name}/runs",
    status_code=202,
    response_model=ExperimentOut,
    summary="Queue a preset",
    dependencies=[Depends(local_worker.wait_for_it)],
)
def run_preset(
    name: Annotated[str, Path(max_length=64)],
    s: SessionDep,
    settings: SettingsDep,
    signal: SignalDep,
    now: NowDep,
    who: Annotated[Principal, require("submit")],
    run: Annotated[PresetRun | None, Body()] = None,
) -> ExperimentOut:
    run = run or PresetRun()
    auth.check_priority(who, run.priority, settings)
    return presets.queue(s, name, run, settings, signal, now, who.id)
