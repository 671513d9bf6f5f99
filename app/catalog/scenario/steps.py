"""Each step kind that touches tensors (create, op, move, pin, delete): its fields
checked, and what it does to the ledger's named tensors."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from app.catalog.model import CatalogError, TensorSpec, check_shape
from app.catalog.rounding import rounded_block_bytes
from app.catalog.scenario.bounds import MAX_LIST
from app.catalog.scenario.ledger import Ledger, Many, Tensor, size
from app.catalog.scenario.vocabulary import (
    BINARY_FNS,
    CREATE_FNS,
    INPLACE_FNS,
    OP_FNS,
    TWO_ARGS,
)
from app.catalog.shapes import broadcast, matmul_shape, norm_dim
from vramlab.catalog.devices import canonical_device
from vramlab.catalog.dtypes import DTYPES, fill_problem

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def get(step: Mapping[str, Any], key: str, where: str, kind: type, default: Any = None) -> Any:
    value = step.get(key, default)
    if value is None:
        if default is None:
            raise CatalogError(f"{where}.{key}", "is required")
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise CatalogError(f"{where}.{key}", "must be an integer")
    if kind is bool and not isinstance(value, bool):
        raise CatalogError(f"{where}.{key}", "must be true or false")
    if kind is str and not isinstance(value, str):
        raise CatalogError(f"{where}.{key}", "must be a string")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise CatalogError(f"{where}.{key}", "must be a number")
    return value


def _name(step: Mapping[str, Any], key: str, where: str) -> str:
    name = get(step, key, where, str)
    if not _NAME.match(name):
        raise CatalogError(f"{where}.{key}", "must be an identifier of at most 32 characters")
    return str(name)


def _one(state: Ledger, step: Mapping[str, Any], key: str, where: str, name: str) -> Tensor:
    if name not in state.names:
        raise CatalogError(f"{where}.{key}", f"no tensor named {name!r} at this step")
    value = state.names[name]
    if isinstance(value, Many):
        raise CatalogError(f"{where}.{key}", f"{name!r} is a list; only delete takes a list")
    return value


def _device(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CatalogError(where, "must be a device string")
    try:
        return canonical_device(value)
    except ValueError as exc:
        raise CatalogError(where, str(exc)) from None


def _dtype(value: Any, where: str) -> str:
    if value not in DTYPES:
        raise CatalogError(where, f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
    return str(value)


def _create(state: Ledger, step: Mapping[str, Any], where: str) -> None:
    fn = get(step, "fn", where, str, "empty")
    if fn not in CREATE_FNS:
        raise CatalogError(f"{where}.fn", f"must be one of {', '.join(CREATE_FNS)}")
    shape = check_shape(step.get("shape"), f"{where}.shape")
    dtype = _dtype(step.get("dtype") or state.dtype, f"{where}.dtype")
    device = _device(step.get("device") or state.device, f"{where}.device")
    count = get(step, "count", where, int, 1)
    if not 1 <= count <= MAX_LIST:
        raise CatalogError(f"{where}.count", f"must be between 1 and {MAX_LIST}")
    if get(step, "pin_memory", where, bool, False) and device != "cpu":
        raise CatalogError(f"{where}.pin_memory", "only a tensor on the CPU can be pinned")
    value = get(step, "value", where, float, 0.0)
    if fn == "full" and (why := fill_problem(value, dtype)) is not None:
        raise CatalogError(f"{where}.value", why)
    name = _name(step, "name", where)
    # The worker frees what the name held before it makes the new tensors.
    state.drop(name, where)
    spec = TensorSpec("t", shape, dtype, device)
    if count == 1:
        state.bind(name, state.tensor(spec), where)
    else:
        block = rounded_block_bytes(spec.nbytes, "cuda" if device != "cpu" else "cpu")
        state.bind(name, Many(spec, block, count), where)


def _op(state: Ledger, step: Mapping[str, Any], where: str) -> None:
    fn = get(step, "fn", where, str)
    if fn not in OP_FNS:
        raise CatalogError(f"{where}.fn", f"must be one of {', '.join(OP_FNS)}")
    args = step.get("args")
    arity = 2 if fn in TWO_ARGS else 1
    if (
        not isinstance(args, list)
        or len(args) != arity
        or not all(isinstance(a, str) for a in args)
    ):
        raise CatalogError(f"{where}.args", f"{fn} takes {arity} tensor name(s)")
    ts = [_one(state, step, "args", where, a) for a in args]
    devices = {t.spec.device for t in ts}
    if len(devices) > 1:
        raise CatalogError(
            f"{where}.args",
            f"inputs on {' and '.join(sorted(devices))}: PyTorch refuses ops across devices "
            f"(the mixed_device op shows its error)",
        )
    a = ts[0]
    out_name = (
        _name(step, "name", where) if fn not in INPLACE_FNS else str(step.get("name") or args[0])
    )
    if fn in INPLACE_FNS:
        if broadcast(a.spec.shape, ts[1].spec.shape, f"{where}.args") != a.spec.shape:
            raise CatalogError(f"{where}.args", "the second operand must broadcast to the first")
        state.bind(out_name, a, where)
        return
    if fn in BINARY_FNS:
        f = broadcast if fn != "matmul" else matmul_shape
        shape = f(a.spec.shape, ts[1].spec.shape, f"{where}.args")
    elif fn == "sum":
        shape = ()
    elif fn == "transpose_contiguous":
        if len(a.spec.shape) < 2:
            raise CatalogError(f"{where}.args", "transpose needs at least 2 dims")
        shape = (*a.spec.shape[:-2], a.spec.shape[-1], a.spec.shape[-2])
    elif fn == "narrow":
        d = norm_dim(get(step, "dim", where, int, 0), len(a.spec.shape), f"{where}.dim")
        start, length = get(step, "start", where, int, 0), get(step, "length", where, int, 1)
        if start < 0 or length < 0 or start + length > a.spec.shape[d]:
            raise CatalogError(f"{where}.length", "start + length must lie within the dim")
        view_shape = tuple(length if i == d else n for i, n in enumerate(a.spec.shape))
        # A view: same storage as its base, which it keeps alive.
        view = Tensor(TensorSpec("t", view_shape, a.spec.dtype, a.spec.device), a.storage)
        state.bind(out_name, view, where)
        return
    else:
        shape = a.spec.shape
    dtype = a.spec.dtype
    if fn == "sum" and dtype in ("bool", "uint8", "int8", "int16", "int32"):
        dtype = "int64"
    state.bind(out_name, state.new(shape, dtype, a.spec.device), where)


def _move(state: Ledger, step: Mapping[str, Any], where: str) -> None:
    src = _one(state, step, "src", where, _name(step, "src", where))
    device = _device(step.get("device") or state.device, f"{where}.device")
    dtype = _dtype(step.get("dtype") or src.spec.dtype, f"{where}.dtype")
    get(step, "non_blocking", where, bool, False)
    same = device == src.spec.device and dtype == src.spec.dtype
    moved = src if same else state.new(src.spec.shape, dtype, device)
    state.bind(_name(step, "name", where), moved, where)


def _pin(state: Ledger, step: Mapping[str, Any], where: str) -> None:
    src = _one(state, step, "src", where, _name(step, "src", where))
    if src.spec.device != "cpu":
        raise CatalogError(f"{where}.src", "only a tensor on the CPU can be pinned")
    pinned = state.new(src.spec.shape, src.spec.dtype, "cpu")
    state.bind(_name(step, "name", where), pinned, where)


def _delete(state: Ledger, step: Mapping[str, Any], where: str) -> None:
    name = _name(step, "name", where)
    if name not in state.names:
        raise CatalogError(f"{where}.name", f"no tensor named {name!r} at this step")
    every = step.get("every")
    if every is None:
        state.drop(name, where)
        return
    every = get(step, "every", where, int)
    if every < 1:
        raise CatalogError(f"{where}.every", "must be >= 1")
    # Delete elements 0, every, 2*every, ...: the rest stay, leaving holes between them.
    value = state.names[name]
    left = size(value) - -(-size(value) // every)
    state.drop(name, where)  # what stays is part of what was there: no new peak
    if left == 1 and isinstance(value, Many):
        state.bind(name, state.tensor(value.spec), where)  # one alike tensor: a single
    else:
        spec = value.spec
        block = value.block if isinstance(value, Many) else value.storage.block
        state.bind(name, Many(spec, block, left), where)


HANDLERS: dict[str, Callable[[Ledger, Mapping[str, Any], str], None]] = {
    "create": _create,
    "op": _op,
    "move": _move,
    "pin": _pin,
    "delete": _delete,
}
