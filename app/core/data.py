"""Free-form JSON from clients and workers (op params, scenario steps, worker extras and
progress), checked as data before anything stores or runs it; and every request body
(``RequestBody``), checked whole the same way before its fields are.

Python's JSON parser takes what JSON does not allow (``NaN``, ``-Infinity``) and what no
database stores (lone UTF-16 surrogates; NUL in PostgreSQL), and integers of any size.
Whatever passes here every engine stores, every worker reads, and every response
serialises. Rows already stored are read back without the check (``STORED`` context), so
a row from before a rule was added still renders.
"""

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, StringConstraints, ValidationInfo, model_validator

# JSON numbers that the database, PyTorch and every client read exactly.
MAX_INT = 2**63 - 1
MAX_DEPTH = 32
# Plain text: no NUL (PostgreSQL refuses it) and no other C0 control but tab and newlines.
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
# Messages (tracebacks included): anything but NUL.
NO_NUL = r"^[^\x00]*$"
STORED = {"stored": True}

Text = Annotated[str, StringConstraints(pattern=TEXT_PATTERN)]


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text may not contain NUL (\\u0000)"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode: a lone surrogate (\\ud800-\\udfff) was sent"
    return None


def problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain, storable JSON data, or None if it is."""
    if depth > MAX_DEPTH:
        return f"nests more than {MAX_DEPTH} levels deep"
    # The exact types first (what JSON parsing gives): a worker's outcome holds hundreds
    # of values, and this runs on each of them.
    kind = type(value)
    if kind is str:
        return _text_problem(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                return "object keys must be strings"
            if (why := _text_problem(key) or problem(item, depth + 1)) is not None:
                return why
        return None
    if kind is list or kind is tuple:
        for item in value:
            if (why := problem(item, depth + 1)) is not None:
                return why
        return None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -MAX_INT - 1 <= value <= MAX_INT else "integers must fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite (no NaN or Infinity)"
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, list | tuple):
        return problem(list(value), depth)
    if isinstance(value, dict):
        return problem(dict(value), depth)
    return f"{type(value).__name__} is not JSON data"


def _check(value: Any, info: ValidationInfo) -> Any:
    if isinstance(info.context, dict) and info.context.get("stored"):
        return value
    why = problem(value)
    if why is not None:
        raise ValueError(why)
    return value


# Annotated[<type>, AS_DATA] checks a value of any JSON type.
AS_DATA = AfterValidator(_check)
DataDict = Annotated[dict[str, Any], AS_DATA]


def locate(value: Any, depth: int = 0) -> str:
    """Where in ``value`` lies the first thing that ``problem`` refuses, as a field path
    (``results[0].lease_token``); empty for ``value`` itself. Only on the error path."""
    if depth <= MAX_DEPTH and isinstance(value, dict | list | tuple):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and _text_problem(key) is not None:
                return ""  # the key itself: the object is at fault
            if problem(item, depth + 1) is not None:
                inner = locate(item, depth + 1)
                step = f"[{key}]" if isinstance(key, int) else str(key)
                sep = "" if not inner or inner.startswith("[") else "."
                return f"{step}{sep}{inner}"
    return ""


class RequestBody(BaseModel):
    """A JSON request body, checked whole as data before its fields are: every string in
    it, however deep and whatever its field (a lease token, a worker id, a name, a tag, a
    key), without NUL or a lone surrogate; every number finite and within 64 bits. No
    field of any body, present or to come, can then bring the database text that it
    cannot store (PostgreSQL refuses NUL) as a 500: each body model derives from this
    class (``tests/api/test_storable_text.py`` sends every string of every body)."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(info.context, dict) and info.context.get("stored"):
            return value
        if (why := problem(value)) is not None:
            where = locate(value)
            raise ValueError(f"{where}: {why}" if where else why)
        return value
