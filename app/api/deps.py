"""Typed dependencies: the request's session (committed before the response is sent),
settings, the work signal, and look-ups that 404."""

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.api import origins
from app.core.config import Settings
from app.core.db import Database
from app.errors import Forbidden, Unauthorized
from app.models import Experiment, Worker
from app.models.base import utcnow
from app.services import auth, experiments, sessions, workers
from app.services.signals import WorkSignal

READ_METHODS = ("GET", "HEAD", "OPTIONS")
SESSION_COOKIE = "vramlab_session"


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


bearer = HTTPBearer(auto_error=False, description="an API token: `vramlab token create`")


def check_same_site(request: Request, settings: Settings, *, required: bool) -> None:
    """Refuse a state change that a browser made from another site; with ``required``,
    also one that does not say where it comes from."""
    source = origins.same_origin(request, settings)
    if source is False or (required and source is None):
        raise Forbidden(
            "a change from another site (Origin, Referer or Sec-Fetch-Site) is refused: "
            "submit from this service's own pages, or send `Authorization: Bearer <token>`"
        )


def principal(
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> auth.Principal:
    """The caller. A token that is given must be valid even where auth is off.

    Its own short read session: a long-polling claim must not hold the request's
    (write) session while it waits.
    """
    changes = request.method not in READ_METHODS
    # The header, else the web pages' sign-in cookie (a page load cannot send a header).
    cookie = None if credentials is not None else request.cookies.get(SESSION_COOKIE)
    with db.session(write=False) as s:
        if credentials is not None:
            found = auth.authenticate(s, settings, credentials.credentials)
            if found is None:
                raise Unauthorized("the bearer token is unknown or revoked")
            return found
        required = auth.auth_required(s, settings)
        if cookie:
            key: bytes = request.app.state.session_key
            found = sessions.principal(s, key, cookie, utcnow())
            if found is not None:
                if changes:
                    check_same_site(request, settings, required=True)
                return found
            if required:
                raise Unauthorized("the sign-in has expired or its token was revoked")
    if required:
        raise Unauthorized(
            "this API needs a token: `Authorization: Bearer <token>` (`vramlab token create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not origins.open_host_allowed(request, settings):
        raise Forbidden(
            f"this open service answers only for {', '.join(settings.open_hosts)} "
            "(VRAMLAB_OPEN_HOSTS); the Host header named another"
        )
    if changes:
        check_same_site(request, settings, required=False)
    return auth.OPEN


PrincipalDep = Annotated[auth.Principal, Depends(principal)]


def require(scope: str) -> Any:
    """A dependency that lets only callers with ``scope`` (or ``admin``) through."""

    def check(who: PrincipalDep) -> auth.Principal:
        if not who.allows(scope):
            raise Forbidden(f"this needs the {scope!r} scope; the token has {sorted(who.scopes)}")
        return who

    return Depends(check)


def experiment(s: SessionDep, experiment_id: Annotated[str, Path(max_length=64)]) -> Experiment:
    return experiments.get(s, experiment_id)


ExperimentDep = Annotated[Experiment, Depends(experiment)]


def worker_of_experiment(
    experiment_id: Annotated[str, Path(max_length=64)],
    db: Annotated[Database, Depends(get_db)],
    who: PrincipalDep,
) -> None:
    """The worker protocol's calls on a claimed experiment come only from the token whose
    worker claimed it (the lease token is checked after, by the route)."""
    with db.session(write=False) as s:
        exp = s.get(Experiment, experiment_id)
        worker = s.get(Worker, exp.worker_id) if exp is not None and exp.worker_id else None
        if worker is not None and not workers.may_act_as(who, worker):
            raise Forbidden(f"experiment {experiment_id} was claimed by another token's worker")


WorkerOwnsExperiment = Depends(worker_of_experiment)


def metrics_reader(
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """GET /metrics: open to scrapers unless ``VRAMLAB_METRICS_NEED_TOKEN`` asks for a
    token (any scope) wherever tokens are required."""
    if settings.metrics_need_token:
        principal(request, db, settings, credentials)
