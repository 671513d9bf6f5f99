"""vramlab's errors and the handlers that render every failure in one shape.

``{"error": {"type": ..., "message": ..., "details": ...}}``: ``type`` is stable for
programs to act on; ``message`` is for people; ``details`` lists fields at fault.
"""

import logging
from html import escape
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.core.db import Busy
from app.core.error_body import ErrorResponse

log = logging.getLogger(__name__)


class ApiError(Exception):
    status_code = 400
    type = "bad_request"

    def __init__(self, message: str, *, details: Any = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers


class NotFound(ApiError):
    status_code = 404
    type = "not_found"


class Conflict(ApiError):
    status_code = 409
    type = "conflict"


class LeaseLost(Conflict):
    """The lease token no longer owns the experiment (expired and re-claimed, or finished)."""

    type = "lease_lost"


class WorkerTooOld(ApiError):
    """A worker registered with a version this API no longer speaks to: upgrade it."""

    type = "worker_too_old"


class InvalidSpec(ApiError):
    status_code = 422
    type = "validation_error"

    def __init__(self, field: str, message: str, *more: tuple[str, str]):
        problems = [(field, message), *more]
        super().__init__(
            "; ".join(f"{f}: {m}" for f, m in problems),
            details=[{"field": f, "message": m} for f, m in problems],
        )


class Unauthorized(ApiError):
    status_code = 401
    type = "unauthorized"


class Forbidden(ApiError):
    status_code = 403
    type = "forbidden"


class TooManyRequests(ApiError):
    status_code = 429
    type = "too_many_requests"


class PayloadTooLarge(ApiError):
    status_code = 413
    type = "payload_too_large"


class RequestTimeout(ApiError):
    """The request's body came too slowly."""

    status_code = 408
    type = "request_timeout"


def _body(type_: str, message: str, details: Any = None) -> dict[str, Any]:
    return ErrorResponse.model_validate(
        {"error": {"type": type_, "message": message, "details": details}}
    ).model_dump(exclude_none=True)


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for part in parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or "body"


def _for_person(request: Request) -> bool:
    path = request.url.path
    return path == "/ui" or path.startswith("/ui/")


def _html_page(status: int, title: str, message: str) -> HTMLResponse:
    """The error as a small page of its own, for a person at /ui/ (no template: an error
    page must not fail for the reasons the page itself failed)."""
    body = (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · vramlab</title></head>"
        '<body style="font-family: system-ui, sans-serif; margin: 2em">'
        f"<h1>{status} {escape(title)}</h1><p id=error-message>{escape(message)}</p>"
        '<p><a href="/ui/">back to the experiments</a></p></body></html>'
    )
    return HTMLResponse(body, status_code=status)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if isinstance(exc, Unauthorized) and _for_person(request):
        # A person at a web page: send them to sign in rather than show JSON.
        return RedirectResponse("/ui/signin", status_code=303)
    if _for_person(request):
        return _html_page(exc.status_code, exc.type.replace("_", " "), exc.message)
    return JSONResponse(
        _body(exc.type, exc.message, exc.details), status_code=exc.status_code, headers=exc.headers
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    details = [{"field": _field_path(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()]
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
    if _for_person(request):
        return _html_page(422, "invalid request", summary)
    return JSONResponse(_body("validation_error", summary, details), status_code=422)


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed(request: Request) -> list[str]:
    """Every method that some route of this path answers (the router's own 405 names
    those of the first route alone, and a path often has a route per method): each
    method asked of the app's routes, on this error path alone."""
    routes = request.app.router.routes
    methods = [
        m
        for m in _METHODS
        if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)
    ]
    return sorted([*methods, "OPTIONS"]) if methods else []


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405 and (allowed := _allowed(request)):
        allow = {"Allow": ", ".join(allowed)}
        if request.method == "OPTIONS":  # what this path answers: a question, not an error
            return Response(status_code=204, headers=allow)
        exc = StarletteHTTPException(405, exc.detail, headers={**(exc.headers or {}), **allow})
    type_ = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    if _for_person(request):
        return _html_page(exc.status_code, type_.replace("_", " "), str(exc.detail))
    return JSONResponse(
        _body(type_, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _bad_text(_: Request, exc: Exception) -> JSONResponse:
    # JSON may carry lone UTF-16 surrogates ("\\ud800"), which no database can store.
    message = "text must be valid Unicode: a lone surrogate (\\ud800-\\udfff) was sent"
    return JSONResponse(
        _body("validation_error", message, [{"field": "body", "message": message}]),
        status_code=422,
    )


async def _database_down(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return JSONResponse(
        _body("unavailable", "the database is not answering; try again shortly"),
        status_code=503,
        headers={"Retry-After": "2"},
    )


async def _saturated(_: Request, exc: Exception) -> JSONResponse:
    # Overload, not a fault: every connection or the write slot stayed taken for the
    # bounded wait. Answered at once so that clients back off instead of piling up.
    retry_after = exc.retry_after if isinstance(exc, Busy) else 1
    return JSONResponse(
        _body("unavailable", f"the service is saturated; try again shortly ({exc})"),
        status_code=503,
        headers={"Retry-After": str(retry_after)},
    )


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(_body("internal", "internal error (a bug in vramlab)"), status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # A lost connection or a server that is down or restarting: the client may retry.
    app.add_exception_handler(UnicodeEncodeError, _bad_text)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(InterfaceError, _database_down)
    app.add_exception_handler(Busy, _saturated)
    app.add_exception_handler(PoolTimeout, _saturated)
    app.add_exception_handler(Exception, _unexpected)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "a request the API cannot use (a bad cursor, a malformed upload)"),
        (401, "no token, or an unknown or revoked one"),
        (403, "the token lacks the scope this needs"),
        (404, "not found"),
        (409, "conflict: the lease or the state does not allow it, or an id prefix is ambiguous"),
        (413, "the request body is over the size limit"),
        (422, "the input is invalid: details name each field and what is allowed"),
        (429, "too many queued experiments for this token; see Retry-After"),
        (
            503,
            "the database is not answering, the service is saturated, or the model hub "
            "is not answering (hub_unavailable); see Retry-After",
        ),
    )
}
