"""The FastAPI application."""

import asyncio
import contextlib
import gc
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError

from app.access import endpoints as signin
from app.access import tokens as auth
from app.api import docs, health
from app.api.body_limit import BodyLimit
from app.api.edge import Edge
from app.api.metrics import BatchCalls, QueueCollector, claim_looks
from app.api.openapi import TAGS, operation_id
from app.catalog import endpoints as catalog
from app.compare import endpoints as compare
from app.core import errors
from app.core.config import Settings, get_settings
from app.core.db import Database
from app.core.signals import Replicas, WorkSignal
from app.experiments import endpoints as experiments
from app.experiments import predictor as predictor_service
from app.figures import endpoints as results
from app.fits import endpoints as fits
from app.fits import engine as fit_engine
from app.gpus import endpoints as gpus
from app.plans import endpoints as plans
from app.presets import endpoints as presets
from app.queue import endpoints as worker_protocol
from app.queue import local_worker, reaper
from app.queue import workers_endpoints as workers
from app.snapshots import endpoints as snapshots
from app.snapshots.admission import Admission
from app.sweeps import endpoints as sweeps
from app.tables.base import utcnow
from app.traces import endpoints as traces
from app.ui import endpoints as ui

log = logging.getLogger("vramlab")


def _say_how_auth_stands(db: Database, settings: Settings) -> None:
    try:
        with db.session(write=False) as s:
            required = auth.auth_required(s, settings)
    except SQLAlchemyError:
        log.warning("vramlab: database not reachable at start; requests will get 503 until it is")
        return
    if required:
        log.info("vramlab: API tokens are required (`vramlab token create --scope ...`)")
    else:
        log.warning(
            "vramlab: the API is OPEN: no token needed, listening on %s only. Create a token "
            "(`vramlab token create`) or listen beyond loopback and tokens become required.",
            settings.host,
        )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.signal.bind(asyncio.get_running_loop())
        _say_how_auth_stands(app.state.db, settings)
        housekeeping = asyncio.create_task(
            reaper.run(
                app.state.db,
                settings,
                lambda: app.state.clock(),
                app.state.signal,
                app.state.reaper_nudge,
            )
        )
        # Fit searches go on from where the database says they are.
        app.state.fit_wake.bind(asyncio.get_running_loop())
        app.state.fit_wake.notify()
        searches = asyncio.create_task(
            fit_engine.run(
                app.state.db,
                settings,
                lambda: app.state.clock(),
                app.state.signal,
                app.state.fit_wake,
            )
        )
        if settings.model_predictor_start:  # warm before the first model question
            predictor = predictor_service.shared(settings)
            if predictor is not None:
                predictor.start()
        # Replicas on one PostgreSQL database wake each other's waiting claims.
        listener = None
        if not app.state.db.is_sqlite:
            listener = asyncio.create_task(Replicas(settings.database_url, app.state.signal).run())
        # What start-up built (modules, the catalog, the app) lives as long as the process:
        # move it out of the collector's view, so that full collections no longer walk it
        # in the middle of a request (they cost tens of ms of tail latency on a listing).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            for task in (housekeeping, searches, listener):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            predictor_service.close_shared()  # the model predictor's child goes with us
            app.state.db.dispose()

    app = FastAPI(
        title="vramlab",
        version="1.0.0",
        summary="Run GPU memory experiments with PyTorch and read what was measured.",
        lifespan=lifespan,
        # /docs is served from local files (app/api/docs.py); ReDoc needs a CDN.
        docs_url=None,
        redoc_url=None,
        # Every failure can take the one error shape; document it on every operation.
        responses=errors.ERROR_RESPONSES,
        generate_unique_id_function=operation_id,
        openapi_tags=TAGS,
    )
    app.state.settings = settings
    # Every "now" of the API (requests, claims, housekeeping); tests replace it.
    app.state.clock = utcnow
    pool_size, max_overflow = settings.pool
    app.state.db = Database(
        settings.database_url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        wait_seconds=settings.db_wait_seconds,
    )
    app.state.signal = WorkSignal()
    # A claim that finds nothing asks the reaper to settle expired leases now.
    app.state.reaper_nudge = reaper.Nudge()
    app.state.fit_wake = fit_engine.FitWake()
    app.state.local_worker = local_worker.LocalWorker(settings)
    # Signs the web pages' sessions; a random key ends every session when the API restarts.
    app.state.session_key = (
        settings.session_secret.encode() if settings.session_secret else secrets.token_bytes(32)
    )
    app.state.snapshot_admission = Admission(settings)
    # Each app its own registry: tests run several apps in one process.
    app.state.metrics = CollectorRegistry(auto_describe=False)
    app.state.metrics.register(QueueCollector(app.state.db, settings, lambda: app.state.clock()))
    app.state.claim_looks = claim_looks(app.state.metrics)
    app.state.batch_calls = BatchCalls(app.state.metrics)
    errors.install(app)
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        large_paths=("/v1/worker/experiments/",),
        large_limit=settings.max_trace_chunk_bytes,
        exact={"/v1/snapshots": settings.max_snapshot_bytes},
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        )
    for module in (experiments, traces, catalog, workers, worker_protocol, health):
        app.include_router(module.router)
    for module in (results, sweeps, fits, plans, gpus, compare, snapshots, ui):
        app.include_router(module.router)
    app.include_router(presets.router)
    app.include_router(signin.router)
    # Outermost: a URL with a NUL never reaches a route; pages get their headers.
    app.add_middleware(Edge)
    docs.install(app)
    return app
