"""Web sign-in sessions: what the pages' cookie holds instead of the API token.

A session is ``<token id>.<expiry>.<signature>``: an HMAC-SHA256, under the service's
session key, of the token id, the expiry and the token's stored hash. It names the token
without carrying it, ends at its expiry, and dies with its token: a revoked (or deleted)
token's sessions are refused on their next request.
"""

import hashlib
import hmac
import re
from datetime import datetime

from sqlalchemy import bindparam, select

from app.access.tokens import Principal
from app.core.db import Reader
from app.tables import ApiToken

_SESSION = re.compile(r"([0-9a-f-]{1,36})\.([0-9]{1,12})\.([0-9a-f]{64})")
# Columns, not the ORM object: the look-up runs on a session or a Core connection alike.
_BY_ID = select(
    ApiToken.id, ApiToken.name, ApiToken.scopes, ApiToken.revoked_at, ApiToken.token_hash
).where(ApiToken.id == bindparam("token_id"))


def _sign(key: bytes, token_id: str, expires: int, token_hash: str) -> str:
    message = f"{token_id}.{expires}.{token_hash}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def issue(key: bytes, token: ApiToken, now: datetime, seconds: int) -> str:
    expires = int(now.timestamp()) + seconds
    return f"{token.id}.{expires}.{_sign(key, token.id, expires, token.token_hash)}"


def principal(session: Reader, key: bytes, value: str, now: datetime) -> Principal | None:
    """The signed-in token, or None if the session is forged, expired or revoked."""
    match = _SESSION.fullmatch(value)
    if match is None:
        return None
    token_id, expires_text, signature = match.groups()
    expires = int(expires_text)
    if expires <= now.timestamp():
        return None
    row = session.execute(_BY_ID, {"token_id": token_id}).first()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(signature, _sign(key, token_id, expires, row.token_hash)):
        return None
    return Principal(id=row.id, name=row.name, scopes=frozenset(row.scopes))
