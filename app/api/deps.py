"""Typed dependencies: the request's session (committed before the response is sent),
the caller (looked up in that same session), settings, the work signal, and look-ups
that 404.

A request holds at most one database connection at a time: the caller's look-up shares
the request's session, and the few handlers that wait (long-polling claims, snapshot
imports) resolve the caller in a short session of its own and open theirs only after it
is closed. A handler on the hot path (the submit) takes ``OneTripDep`` instead and does
the caller's look-up with the rest of its database work, in one trip to the thread pool."""

from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.access import sessions
from app.access import tokens as auth
from app.api import origins
from app.core.config import Settings
from app.core.db import Database, Reader
from app.core.errors import Forbidden, Unauthorized
from app.core.signals import WorkSignal
from app.experiments import service as experiments
from app.queue import workers
from app.queue.reaper import Nudge
from app.tables import Experiment

READ_METHODS = ("GET", "HEAD", "OPTIONS")
SESSION_COOKIE = "vramlab_session"
# Dependencies that do no I/O are ``async def``: FastAPI runs them on the event loop,
# where a plain ``def`` would cost a hop to the thread pool each (a real share of a
# submit's time on a busy machine). Those that touch the database stay ``def``.


async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_signal(request: Request) -> WorkSignal:
    signal: WorkSignal = request.app.state.signal
    return signal


async def session(
    request: Request, db: Annotated[Database, Depends(get_db)]
) -> AsyncIterator[Session]:
    """One unit of work per request: commit at the end, roll back on any error.

    The session touches the database on first use (in the caller's look-up or the
    handler, both in the thread pool); committing is one more trip there, and none is
    needed for a session that was never used.
    """
    s = db.open(write=request.method not in READ_METHODS)
    try:
        yield s
    except BaseException:
        await run_in_threadpool(db.close, s, ok=False)
        raise
    if s.in_transaction() or s.new or s.dirty or s.deleted:
        await run_in_threadpool(db.close, s, ok=True)
    else:
        s.close()


async def get_clock(request: Request) -> Callable[[], datetime]:
    """The app's clock (``app.state.clock``): tests move it instead of sleeping."""
    clock: Callable[[], datetime] = request.app.state.clock
    return clock


async def now(clock: Annotated[Callable[[], datetime], Depends(get_clock)]) -> datetime:
    return clock()


async def csp_nonce(request: Request) -> str:
    """This response's Content-Security-Policy nonce (``app/api/edge.py`` makes one for
    every request): a page's scripts run only if they carry it."""
    nonce: str = request.state.csp_nonce
    return nonce


SessionDep = Annotated[Session, Depends(session, scope="function")]
NonceDep = Annotated[str, Depends(csp_nonce)]
DatabaseDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SignalDep = Annotated[WorkSignal, Depends(get_signal)]


async def get_reaper_nudge(request: Request) -> Nudge:
    nudge: Nudge = request.app.state.reaper_nudge
    return nudge


ReaperNudgeDep = Annotated[Nudge, Depends(get_reaper_nudge)]
ClockDep = Annotated[Callable[[], datetime], Depends(get_clock)]
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


def _resolve(
    request: Request,
    s: Reader,
    settings: Settings,
    credentials: HTTPAuthorizationCredentials | None,
) -> auth.Principal:
    """The caller. A token that is given must be valid even where auth is off."""
    changes = request.method not in READ_METHODS
    # The header, else the web pages' sign-in cookie (a page load cannot send a header).
    cookie = None if credentials is not None else request.cookies.get(SESSION_COOKIE)
    if credentials is not None:
        found = auth.authenticate(s, settings, credentials.credentials)
        if found is None:
            raise Unauthorized("the bearer token is unknown or revoked")
        return found
    required = auth.auth_required(s, settings)
    if cookie:
        key: bytes = request.app.state.session_key
        found = sessions.principal(s, key, cookie, request.app.state.clock())
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


def principal(
    request: Request,
    s: SessionDep,
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> auth.Principal:
    """The caller, looked up in the request's own session: one connection a request.

    On SQLite a write request's session holds the process's write slot from its first
    statement to its commit; the caller is looked up first, in a short read session that
    is closed before the handler opens the request's (``Database.reads_before_writing``),
    so that the slot is not held across this extra trip to the thread pool. Still one
    connection at a time.
    """
    if request.method in READ_METHODS:
        return _resolve(request, s, settings, credentials)
    with db.reads_before_writing(s) as read:
        return _resolve(request, read, settings, credentials)


def principal_apart(
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> auth.Principal:
    """The caller, looked up in a short read session that is closed before the handler
    runs: for handlers that open sessions of their own around a wait (a long-polling
    claim, a trace upload that reads its body first, a snapshot import) and so hold none
    while waiting."""
    with db.session(write=False) as s:
        return _resolve(request, s, settings, credentials)


PrincipalDep = Annotated[auth.Principal, Depends(principal)]


@dataclass(frozen=True)
class OneTrip:
    """What a handler that does all its database work in one trip to the thread pool
    needs of the app and the request, in one dependency (each dependency FastAPI
    resolves costs about what a short statement does): the database, settings, the
    work signal, the time, and the caller as the request describes them, which
    ``principal`` looks up in a session of that work, as ``principal()`` would."""

    request: Request
    db: Database
    settings: Settings
    signal: WorkSignal
    now: datetime
    credentials: HTTPAuthorizationCredentials | None

    def principal(self, s: Reader, scope: str) -> auth.Principal:
        """The caller, if they have ``scope``; else 401 or 403."""
        return _check(scope, _resolve(self.request, s, self.settings, self.credentials))


async def one_trip(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> OneTrip:
    state = request.app.state
    return OneTrip(request, state.db, state.settings, state.signal, state.clock(), credentials)


OneTripDep = Annotated[OneTrip, Depends(one_trip)]


class AuthenticateFirst(APIRoute):
    """For routes whose caller is looked up in the handler (``OneTripDep``), after
    FastAPI has validated the body: a request that fails validation is answered 401 (or
    403) first when its caller would be refused, so that no one learns of field errors
    before they authenticate. The look-up runs on that error path alone."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError:
                state = request.app.state
                credentials = await bearer(request)
                await run_in_threadpool(
                    principal_apart, request, state.db, state.settings, credentials
                )
                raise

        return run


def _check(scope: str, who: auth.Principal) -> auth.Principal:
    if not who.allows(scope):
        raise Forbidden(f"this needs the {scope!r} scope; the token has {sorted(who.scopes)}")
    return who


def require(scope: str, *, apart: bool = False) -> Any:
    """A dependency that lets only callers with ``scope`` (or ``admin``) through.

    ``apart``: resolve the caller in its own short session (see ``principal_apart``) for
    a handler that takes no ``SessionDep``.
    """
    if apart:

        async def check_apart(
            who: Annotated[auth.Principal, Depends(principal_apart)],
        ) -> auth.Principal:
            return _check(scope, who)

        return Depends(check_apart)

    async def check(who: PrincipalDep) -> auth.Principal:
        return _check(scope, who)

    return Depends(check)


SHORT_ID = "the id, or a unique prefix of it of 4 characters or more (the 8 that lists print)"


def experiment(
    s: SessionDep, experiment_id: Annotated[str, Path(max_length=64, description=SHORT_ID)]
) -> Experiment:
    return experiments.get(s, experiment_id)


ExperimentDep = Annotated[Experiment, Depends(experiment)]


def worker_of_experiment(
    experiment_id: Annotated[str, Path(max_length=64)],
    request: Request,
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """The worker protocol's calls on a claimed experiment come only from a worker token,
    the one whose worker claimed it (the lease token is checked after, by the route). In
    a short read session of its own, closed before the route opens the request's (one
    connection at a time; the trace upload takes no request session at all)."""
    with db.session(write=False) as s:
        who = _check("worker", _resolve(request, s, settings, credentials))
        if not workers.may_act_for_claim(s, experiment_id, who):
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
        principal_apart(request, db, settings, credentials)
