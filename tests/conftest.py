"""Fixtures: a fresh database per test on SQLite and on PostgreSQL, built by the
migrations once per session, and a real uvicorn serving the API on a free port."""

import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, text

from app.core.config import Settings, normalise_database_url
from app.core.migrate import upgrade
from app.main import create_app
from app.tables.base import utcnow

POSTGRES_URL = os.environ.get(
    "VRAMLAB_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
# The GPU host has no PostgreSQL: VRAMLAB_TEST_ENGINES=sqlite runs the SQLite half alone.
ENGINES = tuple(os.environ.get("VRAMLAB_TEST_ENGINES", "sqlite,postgres").split(","))


def _admin_url() -> str:
    return normalise_database_url(POSTGRES_URL)


def _pg_url(name: str) -> str:
    base = _admin_url().rsplit("/", 1)[0]
    return f"{base}/{name}"


def _pg_admin(sql: str) -> None:
    engine = create_engine(_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    name = f"vramlab_tmpl_{uuid.uuid4().hex[:8]}"
    try:
        _pg_admin(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        pytest.fail(f"PostgreSQL at {POSTGRES_URL} is not reachable: {exc}")
    upgrade(_pg_url(name))
    yield name
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_database(engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if engine == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "vramlab.db"
        shutil.copy(template, path)
        yield f"sqlite:///{path}"
        return
    template_name: str = request.getfixturevalue("postgres_template")
    name = f"vramlab_t_{uuid.uuid4().hex[:10]}"
    _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    yield _pg_url(name)
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``one_engine`` runs on the first test engine only: what it asks (a
    prediction, a search's steps, a page) goes through the same SQLAlchemy code on both,
    and each engine's own behaviour has tests of its own. The suite's time goes to what
    differs."""
    dropped = [item for item in items if _other_engine(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not _other_engine(item)]


def _other_engine(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker("one_engine") is None:
        return False
    engine = callspec.params.get("database_url")
    return engine is not None and engine != ENGINES[0]


@pytest.fixture(params=ENGINES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from fresh_database(request.param, request, tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Clock:
    """A clock that tests move instead of sleeping: the app's every "now" reads it."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class LiveServer:
    """The API under a real uvicorn, in a thread of the test process."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        if clock is not None:
            self.app.state.clock = clock
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def make_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "claim_wait_seconds": 2.0,
        "claim_poll_seconds": 0.2,
        "diagnostic_ops": True,
        # The predictor's children at the tests' own priority: on a machine shared with
        # other work, nice'd children would only stretch the tests' waits.
        "model_predictor_nice": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def server(database_url: str) -> Iterator[LiveServer]:
    with LiveServer(make_settings(database_url)) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three distributions' wheels (client, worker, server), built once a session
    from a copy of this checkout (tests/distributions.py)."""
    from tests.distributions import build_wheels

    return build_wheels(tmp_path_factory.mktemp("wheels"))
