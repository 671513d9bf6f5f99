"""The words of a scenario: its step kinds, their fields, the functions a step may name,
and how a step reads as a title."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CREATE_FNS = ("empty", "zeros", "ones", "randn", "full")
BINARY_FNS = ("add", "mul", "matmul")
UNARY_FNS = ("relu", "exp", "sigmoid", "sum", "clone", "transpose_contiguous")
INPLACE_FNS = ("add_", "mul_")
VIEW_FNS = ("narrow",)
OP_FNS = (*BINARY_FNS, *UNARY_FNS, *INPLACE_FNS, *VIEW_FNS)
TWO_ARGS = frozenset((*BINARY_FNS, *INPLACE_FNS))
STEP_KINDS = ("create", "op", "move", "pin", "delete", "empty_cache", "synchronize", "repeat")
FIELDS: dict[str, set[str]] = {
    "create": {"name", "fn", "shape", "dtype", "device", "count", "value", "pin_memory"},
    "op": {"name", "fn", "args", "dim", "start", "length"},
    "move": {"name", "src", "device", "dtype", "non_blocking"},
    "pin": {"name", "src"},
    "delete": {"name", "every"},
    "empty_cache": set(),
    "synchronize": set(),
    "repeat": {"times", "steps"},
}
ALLOWED = {kind: fields | {"do", "label"} for kind, fields in FIELDS.items()}


def step_title(step: Mapping[str, Any]) -> str:
    """A short description of a step, used as its name when it has no label."""
    kind = step.get("do")
    if kind == "create":
        count = f"[{step.get('count')}]" if step.get("count", 1) != 1 else ""
        return f"create {step.get('name')}{count} = {step.get('fn', 'empty')}{step.get('shape')}"
    if kind == "op":
        return (
            f"{step.get('name') or step['args'][0]} = {step.get('fn')}({', '.join(step['args'])})"
        )
    if kind == "move":
        return f"{step.get('name')} = {step.get('src')}.to({step.get('device', '')})"
    if kind == "pin":
        return f"{step.get('name')} = {step.get('src')}.pin_memory()"
    if kind == "delete":
        every = f"[::{step['every']}]" if step.get("every") else ""
        return f"del {step.get('name')}{every}"
    if kind == "repeat":
        return f"repeat x{step.get('times')} ({len(step.get('steps') or [])} steps)"
    return str(kind)
