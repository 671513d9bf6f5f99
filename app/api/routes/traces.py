"""An experiment's allocator trace: paged JSON or a streamed NDJSON."""

import itertools
import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from app.api.deps import ExperimentDep, SessionDep, get_db
from app.core.db import Database
from app.errors import ERROR_RESPONSES
from app.services import traces

router = APIRouter(prefix="/v1/experiments", tags=["traces"], responses=ERROR_RESPONSES)


class TracePage(BaseModel):
    experiment_id: str
    total: int
    offset: int
    limit: int
    events: list[dict[str, Any]]
    next_offset: int | None


@router.get(
    "/{experiment_id}/trace",
    response_model=TracePage,
    summary="The allocator's event trace",
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def trace(
    exp: ExperimentDep,
    s: SessionDep,
    db: Annotated[Database, Depends(get_db)],
    format: Literal["json", "ndjson"] = "json",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    action: Annotated[list[str] | None, Query()] = None,
    min_size: Annotated[int, Query(ge=0)] = 0,
) -> Any:
    """``offset`` counts matching events. ``json`` pages; ``ndjson`` streams every match."""
    actions = set(action) if action else None
    if format == "ndjson":
        return StreamingResponse(
            _stream(db, exp.id, actions, min_size), media_type="application/x-ndjson"
        )
    matching = (e for e in traces.iter_events(s, exp.id) if traces.matches(e, actions, min_size))
    window = list(itertools.islice(matching, offset, offset + limit + 1))
    more = len(window) > limit
    return TracePage(
        experiment_id=exp.id,
        total=traces.count(s, exp.id),
        offset=offset,
        limit=limit,
        events=window[:limit],
        next_offset=offset + limit if more else None,
    )


def _stream(
    db: Database, experiment_id: str, actions: set[str] | None, min_size: int
) -> Iterator[bytes]:
    with db.session(write=False) as s:
        for event in traces.iter_events(s, experiment_id):
            if traces.matches(event, actions, min_size):
                yield json.dumps(event, separators=(",", ":")).encode() + b"\n"
