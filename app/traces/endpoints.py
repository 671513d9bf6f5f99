"""An experiment's allocator trace: paged JSON, a streamed NDJSON, or an export for
PyTorch's memory viewer (``memory_viz``) or Perfetto (``chrome``)."""

import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from app.api.deps import DatabaseDep, ExperimentDep, SessionDep, require
from app.core.db import Database
from app.core.errors import ERROR_RESPONSES
from app.traces import exports, memory_viz
from app.traces import service as traces
from vramlab.contract import TRACE_ACTIONS, TraceAction

# Its own JSON media type: the page schema of format=json does not describe it.
CHROME_MEDIA = "application/vnd.chrome-trace+json"
router = APIRouter(
    prefix="/v1/experiments",
    tags=["traces"],
    responses=ERROR_RESPONSES,
    dependencies=[require("read")],
)


TraceFormat = Literal["json", "ndjson", "memory_viz", "chrome"]


@dataclass(frozen=True)
class TraceQuery:
    """What a trace route is asked for: the format, and for ``json``/``ndjson`` the page
    and the filters."""

    format: TraceFormat
    offset: int
    limit: int
    actions: set[str] | None
    min_size: int


def trace_query(
    format: TraceFormat = "json",
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    action: Annotated[
        list[TraceAction] | None,
        Query(max_length=len(TRACE_ACTIONS), description="events of these actions only"),
    ] = None,
    min_size: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> TraceQuery:
    """The trace routes' query parameters, declared once (an experiment's and a
    snapshot's)."""
    return TraceQuery(format, offset, limit, set(action) if action else None, min_size)


TraceQueryDep = Annotated[TraceQuery, Depends(trace_query)]


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
    responses={
        200: {
            "content": {
                "application/x-ndjson": {},
                "application/octet-stream": {},
                CHROME_MEDIA: {},
            }
        }
    },
)
def trace(exp: ExperimentDep, s: SessionDep, db: DatabaseDep, q: TraceQueryDep) -> Any:
    """``offset`` counts matching events. ``json`` pages; ``ndjson`` streams every match.
    ``memory_viz`` (a pickle for pytorch.org/memory_viz) and ``chrome`` (trace-event JSON)
    stream the whole trace; filters do not apply to them."""
    format, offset, limit, actions, min_size = q.format, q.offset, q.limit, q.actions, q.min_size
    if format in EXPORTS:
        media, ext = EXPORTS[format]
        return StreamingResponse(
            traces.ahead(_export(db, exp.id, exp.device, format)),
            media_type=media,
            headers={"Content-Disposition": f'attachment; filename="{exp.id}.{ext}"'},
        )
    if format == "ndjson":
        return StreamingResponse(
            _stream(db, exp.id, actions, min_size), media_type="application/x-ndjson"
        )
    if actions is None and min_size == 0:
        # No filter: every event matches, so skip whole chunks up to the offset.
        window = list(itertools.islice(traces.iter_events(s, exp.id, offset), limit + 1))
    else:
        matching = (
            e for e in traces.iter_events(s, exp.id) if traces.matches(e, actions, min_size)
        )
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


EXPORTS = {
    "memory_viz": ("application/octet-stream", "pickle"),
    "chrome": (CHROME_MEDIA, "trace.json"),
}


def _export(
    db: Database, experiment_id: str, device: str, format: str
) -> Generator[bytes, None, None]:
    """The export's pieces; the route runs this in a thread of its own (``traces.ahead``),
    so the next piece is made while the event loop sends the one before."""
    with db.session(write=False) as s:
        if format == "memory_viz":
            blocks = traces.ahead(traces.iter_viz_blocks(s, experiment_id))
            yield from memory_viz.export(blocks, device)
        else:
            batches = traces.iter_event_batches(s, experiment_id)
            yield from exports.chrome_batches(batches, experiment_id, device)


def _stream(
    db: Database, experiment_id: str, actions: set[str] | None, min_size: int
) -> Iterator[bytes]:
    """The stored lines as they are: whole chunks when nothing is filtered, else the
    lines whose event matches."""
    with db.session(write=False) as s:
        if actions is None and min_size == 0:
            yield from traces.iter_ndjson(s, experiment_id)
            return
        for lines in traces.chunk_lines(s, experiment_id):
            events = traces.parse_lines(lines)
            kept = [
                line
                for line, event in zip(lines, events, strict=True)
                if traces.matches(event, actions, min_size)
            ]
            if kept:
                yield b"\n".join(kept) + b"\n"
