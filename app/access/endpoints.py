"""Signing in to the web pages: a signed session in an HttpOnly, same-site cookie.

A browser cannot add an Authorization header to a page load, so where tokens are
required the pages read a session from this cookie instead (app/api/deps.py). The cookie
holds no token: a session names the token, expires (``VRAMLAB_SESSION_SECONDS``) and dies
when the token is revoked (app/access/sessions.py). It is ``Secure`` unless the page was
reached on a loopback name. Sign-in and sign-out refuse forms posted from other sites.
"""

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from app.access import sessions
from app.access import tokens as auth
from app.api import origins
from app.api.deps import SESSION_COOKIE, DatabaseDep, SettingsDep, check_same_site
from app.core.config import Settings
from app.tables import ApiToken
from app.tables.base import utcnow
from app.ui.endpoints import TEMPLATES

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, "signin.html", {"error": None})


def _token_row(s: Session, settings: Settings, token: str) -> ApiToken | None:
    who = auth.authenticate(s, settings, token)
    if who is None or who.id is None or not who.allows("read"):
        return None
    return s.get(ApiToken, who.id)


@router.post("/signin")
def signin(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    db: DatabaseDep,
    settings: SettingsDep,
) -> Response:
    check_same_site(request, settings, required=False)
    with db.session(write=False) as s:
        row = _token_row(s, settings, token.strip())
        value = None
        if row is not None:
            value = sessions.issue(
                request.app.state.session_key, row, utcnow(), settings.session_seconds
            )
    if value is None:
        page = TEMPLATES.TemplateResponse(
            request, "signin.html", {"error": "unknown or revoked token, or no read scope"}
        )
        page.status_code = 401
        return page
    response = RedirectResponse("/ui/", status_code=303)
    loopback = auth.is_loopback(origins.host_name(request.headers.get("host", "")))
    response.set_cookie(
        SESSION_COOKIE,
        value,
        httponly=True,
        samesite="strict",
        secure=not loopback,
        path="/",
        max_age=settings.session_seconds,
    )
    return response


@router.post("/signout")
def signout(request: Request, settings: SettingsDep) -> Response:
    check_same_site(request, settings, required=False)
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
