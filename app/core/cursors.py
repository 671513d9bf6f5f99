"""Keyset cursors of the listings (experiments, fits): newest first, by (created_at, id).

A cursor is the last row's creation time and id, base64url without padding; a client gets
it as ``next_cursor`` and passes it back. A forged or mangled one is a 400-class error.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

from app.core.errors import ApiError


def encode(created_at: datetime, row_id: str) -> str:
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, row_id = raw.split("|", 1)
        at = datetime.fromisoformat(stamp)
        # The cursors this API writes carry UTC; a forged one without a zone is no cursor.
        if at.tzinfo is None or "\x00" in row_id:
            raise ValueError("not a cursor")
        return at.astimezone(UTC), row_id
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise ApiError(
            "cursor: not a cursor this API returned",
            details=[{"field": "cursor", "message": "pass next_cursor from a previous page"}],
        ) from None
