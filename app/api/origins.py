"""Where a browser's request comes from, for the checks a token cannot make.

- Open mode (no token required) answers only host names in ``VRAMLAB_OPEN_HOSTS``: a page
  on another site that points its own name at 127.0.0.1 (DNS rebinding) sends its own
  name in ``Host`` and is refused.
- A state change that a browser authenticates by itself (the sign-in cookie, or nothing
  in open mode) must come from this site: the ``Origin`` (else ``Referer``) of a request
  from another site names that site, as browsers guarantee, and ``Sec-Fetch-Site`` says
  so where it is sent. A bearer header needs no such check: another site cannot set it.
"""

from urllib.parse import urlsplit

from fastapi import Request

from app.core.config import Settings

_DEFAULT_PORTS = {"http": "80", "https": "443"}


def host_name(host_header: str) -> str:
    """``example.org:8000`` → ``example.org``; ``[::1]:8000`` → ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def open_host_allowed(request: Request, settings: Settings) -> bool:
    name = host_name(request.headers.get("host", ""))
    if not name:
        return False
    for allowed in settings.open_hosts:
        allowed = allowed.lower()
        if allowed == "*" or name == allowed:
            return True
        if allowed.startswith("*.") and name.endswith(allowed[1:]):
            return True
    return False


def _netloc(scheme: str, netloc: str) -> str:
    netloc = netloc.lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default and netloc.endswith(f":{default}"):
        netloc = netloc[: -len(default) - 1]
    return netloc


def same_origin(request: Request, settings: Settings) -> bool | None:
    """True if the request says it comes from this site (or an origin the operator trusts
    in ``VRAMLAB_CORS_ORIGINS``), False if it says it comes from elsewhere, None if it says
    nothing (not a browser)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site in ("cross-site", "same-site"):
        return request.headers.get("origin", "") in settings.cors_origins
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False if source == "null" else None
    if source.rstrip("/") in settings.cors_origins:
        return True
    parts = urlsplit(source)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False
    own = request.headers.get("host", "")
    return _netloc(parts.scheme, parts.netloc) == _netloc(parts.scheme, own)
