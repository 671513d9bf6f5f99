"""Memory snapshots users recorded from their own programs: import, read, and the views
an experiment has (trace and its exports, peak, timeline).

The upload is the snapshot file (a pickle as ``torch.cuda.memory._dump_snapshot``
writes it, or gzipped), as the request body itself or as the ``file`` field of a
multipart form (``curl -F file=@snap.pickle``); streamed to a temp file and parsed as
data in a bounded child process, it never reaches an unpickler that resolves globals.
The request's database session opens only after parsing: a long upload holds no lock.
Who may upload at once, and the import slot: ``admission``.
"""

from collections.abc import AsyncIterator, Generator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import FormData, UploadFile

from app.access.tokens import Principal
from app.api.deps import SHORT_ID, NonceDep, NowDep, SessionDep, SettingsDep, get_db, require
from app.core.db import Database
from app.core.error_body import ErrorResponse
from app.core.errors import ERROR_RESPONSES
from app.experiments import service as experiments
from app.experiments.spec_schemas import Tag
from app.figures.responses import FIGURE_RESPONSES, FigureFormat, respond
from app.figures.schemas import PeakOut
from app.snapshots import service as snapshots
from app.snapshots import upload as uploads
from app.snapshots.admission import Admission, submitter
from app.snapshots.schemas import SnapshotOut, SnapshotPage
from app.tables import Experiment
from app.traces import endpoints as trace_routes
from app.traces import memory_viz
from app.traces import service as traces
from vramlab.contract import Figure

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"], responses=ERROR_RESPONSES)
DbDep = Annotated[Database, Depends(get_db)]
_FILE = {"type": "string", "format": "binary"}
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {"schema": _FILE},
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"file": _FILE}, "required": ["file"]}
            },
        },
        "description": "the snapshot file: a pickle from torch.cuda.memory._dump_snapshot, "
        "or the same gzipped; the body itself or a form's `file` field",
    }
}
_READ = 2**20


def snapshot(
    s: SessionDep, snapshot_id: Annotated[str, Path(max_length=64, description=SHORT_ID)]
) -> Experiment:
    return snapshots.get(s, snapshot_id)


SnapshotDep = Annotated[Experiment, Depends(snapshot)]


def _store(
    db: Database,
    upload: uploads.Upload,
    parsed: snapshots.Parsed,
    name: str,
    tags: list[str],
    who: Principal,
    now: Any,
    program_exit: int | None,
) -> SnapshotOut:
    with db.session() as s:
        exp = snapshots.store(
            s,
            upload,
            parsed,
            name=name,
            tags=tags,
            submitted_by=who.id,
            now=now,
            program_exit=program_exit,
        )
        s.flush()
        return snapshots.to_out(s, exp)


@router.post(
    "",
    status_code=201,
    response_model=SnapshotOut,
    summary="Import a PyTorch memory snapshot",
    openapi_extra=_BODY,
    responses={408: {"model": ErrorResponse, "description": "the body came too slowly"}},
)
async def import_snapshot(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    now: NowDep,
    # Apart: the import waits on a parsing child and opens its own session to store.
    who: Annotated[Principal, require("submit", apart=True)],
    name: Annotated[str, Query(min_length=1, max_length=200)] = "snapshot",
    tag: Annotated[list[Tag] | None, Query(max_length=32)] = None,
    device: Annotated[int | None, Query(ge=0, le=63, description="default: the busiest")] = None,
    program_exit: Annotated[
        int | None,
        Query(
            ge=-64,
            le=255,
            description="how the recorded program ended (`vramlab record` sends it): its exit "
            "status, or minus the signal that killed it; anything but 0 marks the snapshot "
            "partial",
        ),
    ] = None,
) -> SnapshotOut:
    """Send the file as the body or as a form's `file` field:

        curl -X POST 'localhost:8000/v1/snapshots?name=train' --data-binary @snap.pickle
        curl -X POST 'localhost:8000/v1/snapshots?name=train' -F file=@snap.pickle

    A pickle that names any class or function is refused (422 ``snapshot_refused``)
    and nothing in it runs; so are gzip data that expands past
    ``VRAMLAB_MAX_SNAPSHOT_EXPANDED_BYTES`` or more than
    ``VRAMLAB_MAX_SNAPSHOT_GZIP_RATIO`` times its size (413, as it arrives) and data that
    is not a snapshot (422). The body must come at 64 KiB/s at least over each 30 s
    (408); one submitter may have 2 uploads in flight, all together 8 (429)."""
    admission: Admission = request.app.state.snapshot_admission
    with admission.admitted(submitter(who, request)):
        # The body is read to disk first, at a minimum rate; only then is an import slot
        # waited for, so that a slow sender holds its own share of the uploads alone.
        body = Request(request.scope, uploads.paced(request.receive, settings))
        if _is_form(body):
            async with body.form(max_files=1, max_fields=16) as form:
                upload = await uploads.receive(_form_file(form), settings)
        else:
            upload = await uploads.receive(body.stream(), settings)
        try:
            async with admission.importing():
                parsed = await run_in_threadpool(snapshots.parse, upload, settings, device)
                return await run_in_threadpool(
                    _store, db, upload, parsed, name, list(tag or []), who, now, program_exit
                )
        finally:
            uploads.discard(upload)


def _is_form(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media == "multipart/form-data"


async def _form_file(form: FormData) -> AsyncIterator[bytes]:
    """The form's file (spooled to disk by the form parser), read back a MiB at a time."""
    file = form.get("file")
    if not isinstance(file, UploadFile):
        files = [k for k, v in form.multi_items() if isinstance(v, UploadFile)]
        if len(files) != 1:
            fields = ", ".join(sorted(set(form.keys()))) or "none"
            raise uploads.SnapshotRefused(
                f"the form has no `file` field with the snapshot file (its fields: {fields}): "
                "send `-F file=@snap.pickle`, or the file itself as the body "
                "(`--data-binary @snap.pickle`)"
            )
        file = form[files[0]]
        assert isinstance(file, UploadFile)
    while chunk := await file.read(_READ):
        yield chunk


@router.get(
    "",
    response_model=SnapshotPage,
    summary="List snapshots, newest first",
    dependencies=[require("read")],
)
def list_snapshots(
    s: SessionDep,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> SnapshotPage:
    filters = experiments.Filters(tag=tag, kind=snapshots.KIND)
    rows, next_cursor = experiments.page(s, filters, limit, cursor)
    return SnapshotPage(items=[snapshots.to_out(s, e) for e in rows], next_cursor=next_cursor)


@router.get(
    "/{snapshot_id}",
    response_model=SnapshotOut,
    summary="One snapshot, explained",
    dependencies=[require("read")],
)
def read(exp: SnapshotDep, s: SessionDep) -> SnapshotOut:
    """The summary made at import: peak (replayed, and PyTorch's counters where the
    recorder saved them), blocks alive at the peak, largest blocks, categories (inferred),
    segments, OOM events."""
    return snapshots.to_out(s, exp)


@router.get(
    "/{snapshot_id}/peak",
    response_model=PeakOut,
    summary="What held memory at the peak",
    dependencies=[require("read")],
)
def peak(exp: SnapshotDep, top: Annotated[int, Query(ge=1, le=20)] = 20) -> PeakOut:
    """From the summary made at import (no replay): the same shape as an experiment's."""
    summary = snapshots.summary(exp)
    counters = summary.get("counters") or {}
    return PeakOut.model_validate(
        {
            "experiment_id": exp.id,
            "events": summary["events"],
            "peak": summary["peak"],
            "alive_at_peak": summary["alive_at_peak"][:top],
            "alive_count": summary["alive_count"],
            "largest": summary["largest"][:top],
            "measured_allocated_peak": counters.get(Figure.ALLOCATED_PEAK),
        }
    )


@router.get(
    "/{snapshot_id}/trace",
    response_model=trace_routes.TracePage,
    summary="The snapshot's trace, as an experiment's",
    responses={
        200: {
            "content": {
                "application/x-ndjson": {},
                "application/octet-stream": {},
                trace_routes.CHROME_MEDIA: {},
            }
        }
    },
    dependencies=[require("read")],
)
def trace(exp: SnapshotDep, s: SessionDep, db: DbDep, q: trace_routes.TraceQueryDep) -> Any:
    """``memory_viz`` gives back the snapshot's own segments with its trace, so PyTorch's
    viewer shows what it showed before import."""
    if q.format == "memory_viz":
        return StreamingResponse(
            traces.ahead(_memory_viz(db, exp.id, exp.device)),  # made while sent
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{exp.id}.pickle"'},
        )
    return trace_routes.trace(exp, s, db, q)


def _memory_viz(db: Database, snapshot_id: str, device: str) -> Generator[bytes, None, None]:
    with db.session(write=False) as s:
        exp = snapshots.get(s, snapshot_id)
        segments = snapshots.segments(s, exp)
        blocks = traces.ahead(traces.iter_line_blocks(s, snapshot_id))
        yield from memory_viz.export(blocks, device, segments)


@router.get(
    "/{snapshot_id}/timeline",
    summary="Allocated and reserved bytes over time",
    responses=FIGURE_RESPONSES,
    response_class=Response,
    dependencies=[require("read")],
)
def timeline(
    exp: SnapshotDep, s: SessionDep, nonce: NonceDep, format: FigureFormat = "html"
) -> Response:
    """Bands (each large block from its alloc to its free, named by its inferred category)
    for traces of up to 500,000 entries; past that, allocated and reserved from the points
    kept at import (about 2,000), so a snapshot of millions of entries draws at once."""
    return respond(snapshots.timeline(s, exp), format, nonce)
