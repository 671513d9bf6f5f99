"""Ids as people give them: a full id, or a unique prefix of one (the 8 characters that
``vramlab ls`` and the pages print), for every route that names an experiment, a sweep or
a snapshot.

A full id is one primary-key look-up. A prefix is a range on the key
(``id >= prefix AND id < successor``), which walks the primary key's index on SQLite and
on PostgreSQL whatever the column's collation (ids are lower-case UUIDs: hex digits and
hyphens in the same places, which every collation orders alike), with a ``LIKE`` beside
it for the exact meaning.
"""

import re
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from app.core.errors import Conflict, InvalidSpec, NotFound

MIN_PREFIX = 4
FULL_LENGTH = 36
# How many matches an ambiguous prefix lists.
SHOWN = 10
_PREFIX = re.compile(r"^[0-9a-f]+(-[0-9a-f]+)*-?$")


class AmbiguousId(Conflict):
    type = "ambiguous_id"


def _successor(prefix: str) -> str | None:
    """The least string above every id that starts with ``prefix`` (None: no bound)."""
    for i in range(len(prefix) - 1, -1, -1):
        c = prefix[i]
        if c == "-" or c == "f":
            continue
        return prefix[:i] + ("a" if c == "9" else chr(ord(c) + 1))
    return None


def resolve(
    session: Session,
    model: Any,
    given: str,
    *,
    noun: str,
    field: str,
    where: tuple[ColumnElement[bool], ...] = (),
) -> Any:
    """The row of ``model`` whose id is ``given`` or starts with it.

    404 when none does, 409 listing the matches when several do, 422 for a prefix too
    short to name one (fewer than ``MIN_PREFIX`` characters).
    """
    if where:
        exact = session.scalar(select(model).where(model.id == given, *where))
    else:
        exact = session.get(model, given)
    if exact is not None:
        return exact
    prefix = given.lower()
    if len(prefix) > FULL_LENGTH or not _PREFIX.match(prefix):
        raise NotFound(f"no {noun} {given!r}")
    if len(prefix.replace("-", "")) < MIN_PREFIX:
        raise InvalidSpec(
            field,
            f"{given!r} is too short to name one {noun}: give at least {MIN_PREFIX} "
            "characters of its id (the 8 that lists print are enough)",
        )
    column: InstrumentedAttribute[str] = model.id
    stmt = select(model).where(column >= prefix, column.startswith(prefix), *where)
    upper = _successor(prefix)
    if upper is not None:
        stmt = stmt.where(column < upper)
    rows = list(session.scalars(stmt.order_by(column).limit(SHOWN + 1)))
    if not rows:
        raise NotFound(f"no {noun} {given!r}, nor one whose id starts with it")
    if len(rows) > 1:
        shown = [r.id for r in rows[:SHOWN]]
        more = " and more" if len(rows) > SHOWN else ""
        raise AmbiguousId(
            f"{given!r} starts the ids of several {noun}s ({', '.join(shown)}{more}): "
            "give more of the id",
            details={"matches": shown, "more": len(rows) > SHOWN},
        )
    return rows[0]
