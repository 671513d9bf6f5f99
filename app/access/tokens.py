"""API tokens: created once, stored as SHA-256 hashes, each granting scopes.

Tokens are 256 random bits, so a plain SHA-256 is the right hash: there is nothing to
brute-force, and look-up by hash stays one indexed query.
"""

import functools
import hashlib
import ipaddress
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.db import Reader
from app.core.errors import Forbidden, NotFound
from app.tables import ApiToken

SCOPES = ("read", "submit", "worker", "admin")
TOKEN_PREFIX = "vl_"


@functools.lru_cache(maxsize=256)  # asked on each request, mostly of the address served
def is_loopback(host: str) -> bool:
    """Whether an address (or host name) reaches this machine alone. ``0.0.0.0``, ``::``
    and any other name or address listen beyond it."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id and scopes, or the open local service."""

    id: str | None
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


OPEN = Principal(id=None, name="open", scopes=frozenset(SCOPES))
STATIC_WORKER = Principal(
    id="worker-token", name="VRAMLAB_WORKER_TOKEN", scopes=frozenset({"worker"})
)
LOCAL_WORKER = Principal(id="local-worker", name="vramlab up", scopes=frozenset({"worker"}))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(session: Session, name: str, scopes: list[str], now: datetime) -> tuple[ApiToken, str]:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {scopes}")
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        id=str(uuid.uuid4()),
        name=name,
        token_hash=hash_token(plain),
        scopes=sorted(set(scopes)),
        created_at=now,
    )
    session.add(row)
    return row, plain


def revoke(session: Session, token_id: str, now: datetime) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token {token_id!r}")
    row.revoked_at = now
    return row


def list_all(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at)))


# Built once: on SQLite, building a statement costs more than running it.
_ANY_TOKEN = select(ApiToken.id).where(ApiToken.revoked_at.is_(None)).limit(1)
# Columns, not the ORM object: the look-up runs on a session or a Core connection alike.
_BY_HASH = select(ApiToken.id, ApiToken.name, ApiToken.scopes, ApiToken.revoked_at).where(
    ApiToken.token_hash == bindparam("token_hash")
)


def tokens_exist(session: Reader) -> bool:
    return session.scalar(_ANY_TOKEN) is not None


def auth_required(session: Reader, settings: Settings) -> bool:
    """On when configured so, when listening beyond loopback, or once any token exists."""
    if settings.auth == "on":
        return True
    if settings.auth == "off":
        return False
    if not is_loopback(settings.host) or settings.worker_token is not None:
        return True
    return tokens_exist(session)


def _same(token: str, secret: str | None) -> bool:
    return secret is not None and secrets.compare_digest(token.encode(), secret.encode())


def authenticate(session: Reader, settings: Settings, token: str) -> Principal | None:
    if _same(token, settings.worker_token):
        return STATIC_WORKER
    if _same(token, settings.local_worker_token):
        return LOCAL_WORKER
    row = session.execute(_BY_HASH, {"token_hash": hash_token(token)}).first()
    if row is None or row.revoked_at is not None:
        return None
    return Principal(id=row.id, name=row.name, scopes=frozenset(row.scopes))


def check_priority(who: Principal, priority: int, settings: Settings) -> None:
    """Only admins put work ahead of the shared queue: others may set ``priority`` up to
    ``VRAMLAB_MAX_PRIORITY`` (0 unless the operator raises it)."""
    if priority > settings.max_priority and not who.allows("admin"):
        raise Forbidden(
            f"priority {priority} needs the 'admin' scope; without it, at most "
            f"{settings.max_priority} (VRAMLAB_MAX_PRIORITY)"
        )
