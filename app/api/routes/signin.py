"""Signing in to the web pages: a token kept in an HttpOnly, same-site cookie.

A browser cannot add an Authorization header to a page load, so where tokens are
required the pages read the token from this cookie instead (app/api/deps.py).
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import TOKEN_COOKIE, get_db, get_settings
from app.api.routes.ui import TEMPLATES
from app.core.config import Settings
from app.core.db import Database
from app.services import auth

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, "signin.html", {"error": None})


@router.post("/signin")
def signin(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    db: Annotated[Database, Depends(get_db)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> Response:
    with db.session(write=False) as s:
        who = auth.authenticate(s, settings, token.strip())
    if who is None or not who.allows("read"):
        page = TEMPLATES.TemplateResponse(
            request, "signin.html", {"error": "unknown or revoked token, or no read scope"}
        )
        page.status_code = 401
        return page
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(
        TOKEN_COOKIE, token.strip(), httponly=True, samesite="strict", path="/", max_age=30 * 86400
    )
    return response


@router.post("/signout")
def signout() -> Response:
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response
