"""Liveness and readiness."""

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.api.deps import SessionDep, metrics_reader

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers and the schema is migrated")
def readyz(s: SessionDep) -> JSONResponse:
    try:
        version = s.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except SQLAlchemyError as exc:
        body = {
            "error": {
                "type": "not_ready",
                "message": f"database not ready: {exc.__class__.__name__}",
            }
        }
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
    return JSONResponse({"status": "ready", "schema": version})


@router.get(
    "/metrics",
    summary="Prometheus metrics: experiments by status, failures by type, live workers",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    dependencies=[Depends(metrics_reader)],
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
