"""Experiments side by side: figures, differences, environments, overlaid timelines."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app.api.deps import NonceDep, SessionDep, require
from app.compare import service
from app.compare.schemas import CompareOut
from app.core.errors import ERROR_RESPONSES
from app.figures import service as figures
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond

router = APIRouter(
    prefix="/v1/compare",
    tags=["results"],
    responses=ERROR_RESPONSES,
    dependencies=[require("read")],
)
Ids = Annotated[
    str,
    Query(
        max_length=400,
        description="experiment or snapshot ids, or unique prefixes of them (4 characters or "
        "more), separated by commas",
    ),
]


@router.get("", response_model=CompareOut, summary="Compare experiments")
def compare(ids: Ids, s: SessionDep) -> CompareOut:
    return service.compare(service.load(s, service.parse_ids(ids)))


@router.get(
    "/timeline",
    summary="Allocated over time, overlaid",
    responses=FIGURE_RESPONSES,
    response_class=Response,
)
def timeline(ids: Ids, s: SessionDep, nonce: NonceDep, format: FigureFormat = "html") -> Response:
    return respond(figures.overlay(s, service.load(s, service.parse_ids(ids))), format, nonce)
