"""vramlab's errors and the handlers that render every failure in one shape.

``{"error": {"type": ..., "message": ..., "details": ...}}``: ``type`` is stable for
programs to act on; ``message`` is for people; ``details`` lists fields at fault.
"""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.schemas.error import ErrorResponse

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


class InvalidSpec(ApiError):
    status_code = 422
    type = "validation_error"

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}", details=[{"field": field, "message": message}])


class Unauthorized(ApiError):
    status_code = 401
    type = "unauthorized"


class PayloadTooLarge(ApiError):
    status_code = 413
    type = "payload_too_large"


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


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        _body(exc.type, exc.message, exc.details), status_code=exc.status_code, headers=exc.headers
    )


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [{"field": _field_path(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()]
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
    return JSONResponse(_body("validation_error", summary, details), status_code=422)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        _body(type_, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(_body("internal", "internal error (a bug in vramlab)"), status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (404, "not found"),
        (409, "conflict: the lease or the state does not allow it"),
        (422, "the input is invalid: details name each field and what is allowed"),
    )
}
