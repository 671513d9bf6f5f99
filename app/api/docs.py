"""Swagger UI served from local files: /docs works offline (FastAPI's default page loads
its script and styles from a CDN). The files come from the fastapi-offline package, whose
Swagger UI 5 reads OpenAPI 3.1 (FastAPI's schema version; Swagger UI 4 cannot).

The page is FastAPI's, written here so that both its scripts carry the response's CSP
nonce (``app/api/edge.py``): the policy of every page holds for /docs too. There is no
OAuth2 redirect page: tokens are bearer tokens, pasted into "Authorize"."""

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.api.deps import NonceDep

ASSETS = "/static/swagger-ui"
FILES = Path(fastapi_offline.__file__).resolve().parent / "static"
router = APIRouter(include_in_schema=False)


def page(nonce: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>vramlab: API docs</title>
<link rel="stylesheet" href="{ASSETS}/swagger-ui.css">
<link rel="icon" href="{ASSETS}/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script nonce="{nonce}" src="{ASSETS}/swagger-ui-bundle.js"></script>
<script nonce="{nonce}">
SwaggerUIBundle({{
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
}});
</script>
</body>
</html>
"""


@router.get("/docs")
def docs(nonce: NonceDep) -> HTMLResponse:
    return HTMLResponse(page(nonce))


def install(app: FastAPI) -> None:
    """The docs page and its assets; create the app with ``docs_url=None, redoc_url=None``."""
    app.mount(ASSETS, StaticFiles(directory=str(FILES)), name="swagger-ui")
    app.include_router(router)
