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
from collections.abc import Callable, Mapping
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


# A failure's place, innermost last: ("key", name) for a dataclass's field, ("item", key)
# for a mapping's, ("index", i) for a list's. Written as the contract's path only when a
# check fails, so that data that fits pays nothing for it.
_Step = tuple[str, Any]
_Loader = Callable[[Any], Any]


class _Misfit(Exception):
    """A check failed: its message and its place, innermost step last."""

    def __init__(self, message: str, steps: tuple[_Step, ...] = ()) -> None:
        self.message = message
        self.steps = steps

    def within(self, step: _Step) -> _Misfit:
        return _Misfit(self.message, (step, *self.steps))


def _path(where: str, steps: tuple[_Step, ...]) -> str:
    for kind, name in steps:
        if kind == "key":
            where = f"{where}.{name}".lstrip(".")
        elif kind == "item":
            where = f"{where}.{name}"
        else:
            where = f"{where}[{name}]"
    return where


def _bounds(f: dataclasses.Field[Any]) -> Callable[[Any], None] | None:
    """The field's bounds from its ``metadata`` as a check, None where it has none."""
    meta = f.metadata
    ge, le, longest = meta.get("ge"), meta.get("le"), meta.get("max_length")
    if ge is None and le is None and longest is None:
        return None

    def check(value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if ge is not None and value < ge:
                raise _Misfit(f"must be >= {ge}")
            if le is not None and value > le:
                raise _Misfit(f"must be <= {le}")
        if isinstance(value, str) and longest is not None and len(value) > longest:
            raise _Misfit(f"is longer than {longest} characters")

    return check


def load(cls: type[T], data: Any, where: str = "") -> T:
    """``data`` (JSON-like) as an instance of the dataclass ``cls``; WireError if it does
    not fit."""
    try:
        value = _loader(typing.cast(Any, cls))(data)
    except _Misfit as exc:
        raise WireError(_path(where, exc.steps), exc.message) from None
    return typing.cast(T, value)


@functools.cache
def _loader(tp: Any) -> _Loader:
    """The check and conversion of one declared type, built once per type (a spec and an
    outcome are checked at every experiment: building the checks each time was most of
    their cost)."""
    if tp is Any or isinstance(tp, str | typing.ForwardRef):  # Any; JSON data's inner values
        return _same
    origin = get_origin(tp)
    if origin is typing.Literal:
        return _literal(get_args(tp))
    if origin in (Union, types.UnionType):
        return _union(get_args(tp))
    if origin in (list, tuple):
        args = get_args(tp)
        return _sequence(args[0] if args else Any, origin is tuple)
    if origin in (dict, Mapping) or tp is dict:
        args = get_args(tp)
        return _mapping(args[1] if args else Any)
    if dataclasses.is_dataclass(tp):
        return _dataclass(typing.cast(type, tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if tp is float:
        return _number
    if tp is int:
        return _integer
    if tp is str:
        return _string
    if tp is bool:
        return _boolean
    if tp is type(None):
        return _null
    raise TypeError(f"no wire form for {tp!r}")


def _same(data: Any) -> Any:
    return data


def _literal(allowed: tuple[Any, ...]) -> _Loader:
    def load(data: Any) -> Any:
        if data not in allowed:
            raise _Misfit(f"must be one of {', '.join(map(str, allowed))}")
        return data

    return load


def _union(options: tuple[Any, ...]) -> _Loader:
    nullable = type(None) in options
    others = [_loader(o) for o in options if o is not type(None)]

    def load(data: Any) -> Any:
        if data is None and nullable:
            return None
        errors = []
        for option in others:
            try:
                return option(data)
            except _Misfit as exc:
                errors.append(exc)
        raise errors[0] if errors else _Misfit("must not be null")

    return load


def _sequence(item: Any, as_tuple: bool) -> _Loader:
    one = _loader(item)

    def load(data: Any) -> Any:
        if not isinstance(data, list | tuple):
            raise _Misfit("must be a list")
        out = []
        for i, v in enumerate(data):
            try:
                out.append(one(v))
            except _Misfit as exc:
                raise exc.within(("index", i)) from None
        return tuple(out) if as_tuple else out

    return load


def _mapping(item: Any) -> _Loader:
    one = _loader(item)

    def load(data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise _Misfit("must be an object")
        out = {}
        for k, v in data.items():
            try:
                out[str(k)] = one(v)
            except _Misfit as exc:
                raise exc.within(("item", k)) from None
        return out

    return load


def _dataclass(cls: type) -> _Loader:
    declared = [f for f in dataclasses.fields(cls) if f.init]
    known = frozenset(alias(f) for f in declared)
    required = [
        alias(f)
        for f in declared
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    # (key, attribute, check, bounds) in declared order, made at the first load and not
    # here: a dataclass may hold itself, and its hints may name classes defined after it.
    fields: list[tuple[str, str, _Loader, Callable[[Any], None] | None]] | None = None

    def load(data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise _Misfit(f"must be an object ({cls.__name__})")
        if not known.issuperset(data):
            unknown = sorted(set(data) - known)
            raise _Misfit("is not a field of the contract", (("key", unknown[0]),))
        for key in required:
            if key not in data:
                raise _Misfit("is required", (("key", key),))
        nonlocal fields
        if fields is None:
            hints = _hints(cls)
            fields = [(alias(f), f.name, _loader(hints[f.name]), _bounds(f)) for f in declared]
        kwargs = {}
        for key, name, one, check in fields:
            if key not in data:
                continue
            try:
                value = one(data[key])
                if check is not None:
                    check(value)
            except _Misfit as exc:
                raise exc.within(("key", key)) from None
            kwargs[name] = value
        return cls(**kwargs)

    return load


def _enum(tp: type[enum.Enum]) -> _Loader:
    allowed = ", ".join(str(m.value) for m in tp)

    def load(data: Any) -> Any:
        try:
            return tp(data)
        except ValueError:
            raise _Misfit(f"must be one of {allowed}") from None

    return load


def _number(data: Any) -> Any:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise _Misfit("must be a number")
    return data


def _integer(data: Any) -> Any:
    # As pydantic reads an integer: 3, 3.0 or a numpy integer, never true or 3.5.
    if isinstance(data, float) and data.is_integer():
        return int(data)
    if isinstance(data, bool) or not hasattr(data, "__index__"):
        raise _Misfit("must be an integer")
    return int(data)


def _string(data: Any) -> Any:
    if not isinstance(data, str):
        raise _Misfit("must be a string")
    return data


def _boolean(data: Any) -> Any:
    if not isinstance(data, bool):
        raise _Misfit("must be a boolean")
    return data


def _null(data: Any) -> Any:
    if data is not None:
        raise _Misfit("must be null")
    return None


def dump(obj: Any) -> Any:
    """``obj`` (a dataclass of the contract, or data holding them) as JSON data: every
    field, keys as the contract spells them."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is dict:
        return {str(k): dump(v) for k, v in obj.items()}
    if kind is list:
        return [dump(v) for v in obj]
    keys = _dump_keys(typing.cast(Any, kind))
    if keys is not None:
        return {key: dump(getattr(obj, name)) for key, name in keys}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [dump(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): dump(v) for k, v in obj.items()}
    return obj


# Types dump returns as they are (a subclass, such as an enum of strings, is looked at).
_PLAIN = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _dump_keys(kind: type) -> tuple[tuple[str, str], ...] | None:
    """A dataclass's (key, attribute) pairs; None for any other type."""
    if not dataclasses.is_dataclass(kind):
        return None
    return tuple((alias(f), f.name) for f in dataclasses.fields(kind))
