"""The contract's dataclasses to and from JSON data, with the standard library alone.

``load(cls, data)`` checks data against a dataclass of the contract (every key known,
every required field present, each value of its declared type, bounds from a field's
``metadata``) and builds it; ``dump(obj)`` is the inverse, keys as the contract spells
them (a field's ``alias``). The server validates with pydantic models built from the same
dataclasses (one copy of each shape); a worker or a client checks with this.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

# JSON data: what a mapping of the contract holds where its keys are not fixed.
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]  # noqa: UP007


class WireError(ValueError):
    """Data that does not fit the contract; ``field`` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or 'data'}: {message}")
        self.field = field
        self.message = message


def alias(f: dataclasses.Field[Any]) -> str:
    """The field's key on the wire."""
    return str(f.metadata.get("alias", f.name))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types (a class's never change: resolved once, as
    resolving them is most of the time a spec takes to load)."""
    return get_type_hints(cls, include_extras=False)


def _check_bounds(f: dataclasses.Field[Any], value: Any, where: str) -> None:
    meta = f.metadata
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "ge" in meta and value < meta["ge"]:
            raise WireError(where, f"must be >= {meta['ge']}")
        if "le" in meta and value > meta["le"]:
            raise WireError(where, f"must be <= {meta['le']}")
    if isinstance(value, str) and "max_length" in meta and len(value) > meta["max_length"]:
        raise WireError(where, f"is longer than {meta['max_length']} characters")


def load(cls: type[T], data: Any, where: str = "") -> T:
    """``data`` (JSON-like) as an instance of the dataclass ``cls``; WireError if it does
    not fit."""
    value = _value(cls, data, where)
    return typing.cast(T, value)


def _dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise WireError(where, f"must be an object ({cls.__name__})")
    hints = _hints(cls)
    fields = {alias(f): f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise WireError(f"{where}.{unknown[0]}".lstrip("."), "is not a field of the contract")
    kwargs = {}
    for key, f in fields.items():
        here = f"{where}.{key}".lstrip(".")
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(here, "is required")
            continue
        value = _value(hints[f.name], data[key], here)
        _check_bounds(f, value, here)
        kwargs[f.name] = value
    return cls(**kwargs)


def _value(tp: Any, data: Any, where: str) -> Any:
    if tp is Any or isinstance(tp, str | typing.ForwardRef):  # Any; JSON data's inner values
        return data
    origin = get_origin(tp)
    if origin is typing.Literal:
        if data not in get_args(tp):
            raise WireError(where, f"must be one of {', '.join(map(str, get_args(tp)))}")
        return data
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _value(option, data, where)
            except WireError as exc:
                errors.append(exc)
        raise errors[0] if errors else WireError(where, "must not be null")
    if origin in (list, tuple):
        if not isinstance(data, list | tuple):
            raise WireError(where, "must be a list")
        args = get_args(tp)
        item = args[0] if args else Any
        out = [_value(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return out if origin is list else tuple(out)
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(data, Mapping):
            raise WireError(where, "must be an object")
        args = get_args(tp)
        item = args[1] if args else Any
        return {str(k): _value(item, v, f"{where}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        return _dataclass(typing.cast(type, tp), data, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            raise WireError(where, f"must be one of {allowed}") from None
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise WireError(where, "must be a number")
        return data
    if tp is int:
        # As pydantic reads an integer: 3, 3.0 or a numpy integer, never true or 3.5.
        if isinstance(data, float) and data.is_integer():
            return int(data)
        if isinstance(data, bool) or not hasattr(data, "__index__"):
            raise WireError(where, "must be an integer")
        return int(data)
    if tp in (str, bool):
        if not isinstance(data, tp):
            raise WireError(where, f"must be a {'string' if tp is str else 'boolean'}")
        return data
    if tp is type(None):
        if data is not None:
            raise WireError(where, "must be null")
        return None
    raise TypeError(f"{where}: no wire form for {tp!r}")


def dump(obj: Any) -> Any:
    """``obj`` (a dataclass of the contract, or data holding them) as JSON data: every
    field, keys as the contract spells them."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {alias(f): dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [dump(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): dump(v) for k, v in obj.items()}
    return obj
