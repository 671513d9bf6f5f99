"""Swagger UI served from local files: /docs works offline (FastAPI's default page loads
its script and styles from a CDN). The files come from the fastapi-offline package, whose
Swagger UI 5 reads OpenAPI 3.1 (FastAPI's schema version; Swagger UI 4 cannot)."""

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/swagger-ui"
FILES = Path(fastapi_offline.__file__).resolve().parent / "static"
router = APIRouter(include_in_schema=False)


@router.get("/docs")
def docs() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="vramlab: API docs",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
        oauth2_redirect_url="/docs/oauth2-redirect",
    )


@router.get("/docs/oauth2-redirect")
def oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


def install(app: FastAPI) -> None:
    """The docs page and its assets; create the app with ``docs_url=None, redoc_url=None``."""
    app.mount(ASSETS, StaticFiles(directory=str(FILES)), name="swagger-ui")
    app.include_router(router)
