"""Free-form JSON from clients and workers (op params, scenario steps, worker extras and
progress), checked as data before anything stores or runs it.

Python's JSON parser takes what JSON does not allow (``NaN``, ``-Infinity``) and what no
database stores (lone UTF-16 surrogates; NUL in PostgreSQL), and integers of any size.
Whatever passes here every engine stores, every worker reads, and every response
serialises. Rows already stored are read back without the check (``STORED`` context), so
a row from before a rule was added still renders.
"""

import math
from typing import Annotated, Any

from pydantic import AfterValidator, StringConstraints, ValidationInfo

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
