"""The worker protocol: register, long-poll claims, heartbeats, trace upload, outcome.

Every call after the claim carries the lease token; a token that no longer owns the
experiment gets 409 ``lease_lost``, so a worker presumed dead never overwrites a re-run.
"""

import asyncio
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from app.access.tokens import Principal
from app.api.deps import (
    ClockDep,
    DatabaseDep,
    NowDep,
    PrincipalDep,
    ReaperNudgeDep,
    SessionDep,
    SettingsDep,
    SignalDep,
    WorkerOwnsExperiment,
    principal_apart,
    require,
)
from app.api.openapi import WORKER_TAG
from app.core.config import Settings
from app.core.db import Database
from app.core.errors import ERROR_RESPONSES
from app.core.signals import WorkSignal, wait_for
from app.queue import local_worker, workers
from app.queue import service as queue
from app.queue.reaper import Nudge
from app.queue.run_specs import run_spec
from app.queue.schemas import (
    ClaimedBatch,
    ClaimedExperiment,
    ClaimRequest,
    ClaimsRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    OutcomeRequest,
    RegisterRequest,
    RegisterResponse,
    ReportBatchRequest,
    ReportBatchResponse,
    ReportItemVerdict,
    StopRequest,
    WorkerLimits,
)
from app.traces import service as traces
from vramlab.contract import CLAIM_BATCH_PATH, REPORT_BATCH_PATH

router = APIRouter(prefix="/v1/worker", tags=[WORKER_TAG], responses=ERROR_RESPONSES)
# Every call needs the worker scope: checked here for register and the claim (whose
# caller is looked up apart: it holds no session while it waits), and with the ownership
# of the experiment for the calls on a claimed one (WorkerOwnsExperiment).
WORKER = [require("worker")]
WORKER_APART = [require("worker", apart=True)]


@router.post("/register", response_model=RegisterResponse, dependencies=WORKER)
def register(
    request: Request,
    req: RegisterRequest,
    s: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    who: PrincipalDep,
) -> RegisterResponse:
    worker = workers.register(s, req, now, registered_by=who.id)
    local_worker.of(request).registered(who)
    return RegisterResponse(
        worker_id=worker.id,
        lease_seconds=settings.lease_seconds,
        heartbeat_seconds=settings.heartbeat_seconds,
        limits=WorkerLimits(
            max_body_bytes=settings.max_body_bytes,
            max_trace_chunk_bytes=settings.max_trace_chunk_bytes,
            max_trace_chunk_events=settings.max_trace_chunk_events,
        ),
    )


def _check_owner(db: Database, worker_id: str, who: Principal) -> None:
    with db.session(write=False) as s:
        workers.get_for(s, worker_id, who)


def _try_claim(
    db: Database, worker_id: str, settings: Settings, clock: Callable[[], datetime], limit: int
) -> list[ClaimedExperiment]:
    with db.session() as s:
        worker = workers.get(s, worker_id)
        claimed = []
        for claim in queue.claim_many(s, worker, settings, clock(), limit):
            exp = claim.experiment
            assert exp.lease_expires_at is not None
            claimed.append(
                ClaimedExperiment(
                    id=exp.id,
                    attempt=exp.attempts,
                    lease_token=claim.lease_token,
                    lease_expires_at=exp.lease_expires_at,
                    spec=run_spec(exp, settings).wire(),
                )
            )
        return claimed


def _give_back(
    db: Database, claimed: list[ClaimedExperiment], clock: Callable[[], datetime]
) -> None:
    with db.session() as s:
        for one in sorted(claimed, key=lambda c: c.id):
            queue.release(s, one.id, one.lease_token, clock())


async def _long_poll(
    request: Request,
    req: ClaimRequest,
    limit: int,
    db: Database,
    settings: Settings,
    signal: WorkSignal,
    clock: Callable[[], datetime],
    nudge: Nudge,
    who: Principal,
) -> list[ClaimedExperiment]:
    """Up to ``limit`` experiments for the worker, waiting up to ``wait_s`` for one."""
    await run_in_threadpool(_check_owner, db, req.worker_id, who)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(req.wait_s, settings.claim_wait_seconds)
    # A worker that stops cuts its poll short by closing the connection: notice it at
    # once, so that nothing is claimed for it and a shutting-down server is not held up.
    gone = asyncio.ensure_future(_client_gone(request))
    ticket = signal.enlist()  # before looking, so no wake-up slips between
    unused_wake = False  # woken, and not looked since
    try:
        while True:
            if gone.done():
                return []
            claimed = await run_in_threadpool(_try_claim, db, req.worker_id, settings, clock, limit)
            request.app.state.claim_looks.labels(found=str(bool(claimed)).lower()).inc()
            if claimed:
                request.app.state.batch_calls.count("claim", len(claimed))
            unused_wake = False
            if claimed and gone.done():
                # The worker left while this claim waited for the database: nobody would
                # read the answer, so the experiments go back unrun, for another claim.
                await run_in_threadpool(_give_back, db, claimed, clock)
                signal.notify(len(claimed))
                return []
            if claimed:
                return claimed
            # Nothing to take: expired leases may be waiting for the reaper, which puts
            # them back and wakes this wait (a claim never settles them itself).
            nudge()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            await _first(gone, wait_for(ticket, min(remaining, settings.claim_poll_seconds)))
            if ticket.is_set():
                ticket = signal.enlist()
                unused_wake = True
    finally:
        gone.cancel()
        signal.leave(ticket, unused_wake=unused_wake)


@router.post(
    "/claim",
    response_model=ClaimedExperiment,
    responses={204: {"description": "no work arrived within wait_s"}},
    summary="Long-poll for an experiment this worker can run",
    dependencies=WORKER_APART,
)
async def claim(
    req: ClaimRequest,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    signal: SignalDep,
    clock: ClockDep,
    nudge: ReaperNudgeDep,
    who: Annotated[Principal, Depends(principal_apart)],  # holds no session while it waits
) -> ClaimedExperiment | Response:
    claimed = await _long_poll(request, req, 1, db, settings, signal, clock, nudge, who)
    return claimed[0] if claimed else Response(status_code=204)


@router.post(
    CLAIM_BATCH_PATH.removeprefix("/v1/worker"),
    response_model=ClaimedBatch,
    summary="Long-poll for up to `max` experiments this worker can run, each its own lease",
    dependencies=WORKER_APART,
    responses={204: {"description": "no experiment came within wait_s"}},
)
async def claim_batch(
    req: ClaimsRequest,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    signal: SignalDep,
    clock: ClockDep,
    nudge: ReaperNudgeDep,
    who: Annotated[Principal, Depends(principal_apart)],  # holds no session while it waits
) -> ClaimedBatch | Response:
    claimed = await _long_poll(request, req, req.max, db, settings, signal, clock, nudge, who)
    # Nothing came: 204, as the single claim answers (an idle worker's polls stay quiet).
    return ClaimedBatch(experiments=claimed) if claimed else Response(status_code=204)


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects. The body was read already: the server's
    receive waits until the connection ends (or the response is sent)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _first(gone: "asyncio.Future[None]", wake: Coroutine[Any, Any, bool]) -> None:
    waiting = asyncio.ensure_future(wake)
    either: set[asyncio.Future[Any]] = {gone, waiting}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()


ExperimentId = Annotated[str, Path(max_length=64)]


@router.post(
    "/experiments/{experiment_id}/heartbeat",
    response_model=HeartbeatResponse,
    dependencies=[WorkerOwnsExperiment],
)
def heartbeat(
    experiment_id: ExperimentId,
    req: HeartbeatRequest,
    s: SessionDep,
    settings: SettingsDep,
    now: NowDep,
) -> HeartbeatResponse:
    exp = queue.heartbeat(s, experiment_id, req.lease_token, settings, now)
    assert exp.lease_expires_at is not None
    return HeartbeatResponse(
        lease_expires_at=exp.lease_expires_at, cancel_requested=exp.cancel_requested
    )


@router.put(
    "/experiments/{experiment_id}/trace/{seq}",
    summary="Upload one gzip-compressed NDJSON chunk of the trace",
    dependencies=[WorkerOwnsExperiment],
    openapi_extra={
        # gzip bytes, declared as octet-stream: the generic binary type that clients and
        # schema tools know how to send.
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_trace(
    experiment_id: ExperimentId,
    seq: Annotated[int, Path(ge=0, le=100_000)],
    request: Request,
    x_lease_token: Annotated[str, Header(max_length=64)],
    db: DatabaseDep,
    settings: SettingsDep,
) -> dict[str, int]:
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > settings.max_trace_chunk_bytes:
            break

    data = bytes(body)
    del body

    def store() -> int:
        # Checked before the lease's row is locked: a large chunk holds no lock meanwhile.
        checked = traces.check_chunk(data, settings)
        with db.session() as s:
            exp = queue.owned(s, experiment_id, x_lease_token)
            traces.store_chunk(s, exp, seq, data, checked.n_events, checked.columns)
        return checked.n_events

    return {"seq": seq, "events": await run_in_threadpool(store)}


@router.post(
    "/experiments/{experiment_id}/result",
    summary="Report the outcome",
    dependencies=[WorkerOwnsExperiment],
)
def result(
    experiment_id: ExperimentId,
    req: OutcomeRequest,
    s: SessionDep,
    now: NowDep,
    request: Request,
) -> dict[str, str]:
    exp = queue.finish(s, experiment_id, req, now)
    if exp.fit_id is not None:  # a fit's trial: its search takes its next step
        request.app.state.fit_wake.after_commit(s)
    return {"id": exp.id, "status": exp.status}


@router.post(
    REPORT_BATCH_PATH.removeprefix("/v1/worker"),
    response_model=ReportBatchResponse,
    summary="Report several outcomes at once; each is stored or refused on its own",
    dependencies=WORKER,
)
def report_batch(
    req: ReportBatchRequest,
    s: SessionDep,
    now: NowDep,
    who: PrincipalDep,
    request: Request,
    settings: SettingsDep,
) -> ReportBatchResponse:
    # Traces sent with their outcomes are checked before the outcomes' rows are locked.
    inline = {
        item.experiment_id: traces.check_inline(item.trace_gz, settings)
        for item in req.results
        if item.trace_gz is not None
    }
    verdicts = queue.finish_many(s, req.results, who, now, inline)
    request.app.state.batch_calls.count("report", len(req.results))
    return ReportBatchResponse(
        results=[
            ReportItemVerdict(
                experiment_id=v.experiment_id, verdict=v.verdict, status=v.status, error=v.error
            )
            for v in verdicts
        ]
    )


@router.post(
    "/experiments/{experiment_id}/release",
    summary="Give the experiment back unrun",
    dependencies=[WorkerOwnsExperiment],
)
def release(
    experiment_id: ExperimentId, req: LeaseRequest, s: SessionDep, now: NowDep, signal: SignalDep
) -> dict[str, str]:
    exp = queue.release(s, experiment_id, req.lease_token, now)
    signal.after_commit(s, 1)  # queued again: a waiting claim takes it now, not at its poll
    return {"id": exp.id, "status": exp.status}


@router.post(
    "/stop",
    status_code=204,
    dependencies=WORKER,
    summary="Say this worker exits: it stops counting as live at once",
)
def stop(req: StopRequest, s: SessionDep, now: NowDep, who: PrincipalDep) -> Response:
    workers.stop(s, req.worker_id, who, now)
    return Response(status_code=204)
