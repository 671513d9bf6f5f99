"""The FastAPI application."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import errors
from app.api.routes import catalog, experiments, health, traces, worker_protocol, workers
from app.core.config import Settings, get_settings
from app.core.db import Database
from app.services.signals import WorkSignal

log = logging.getLogger("vramlab")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.signal.bind(asyncio.get_running_loop())
        yield
        app.state.db.dispose()

    app = FastAPI(
        title="vramlab",
        version="1.0.0",
        summary="Run GPU memory experiments with PyTorch and read what was measured.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.db = Database(settings.database_url)
    app.state.signal = WorkSignal()
    errors.install(app)
    for module in (experiments, traces, catalog, workers, worker_protocol, health):
        app.include_router(module.router)
    return app
