"""The scenario op's catalog entry: its one parameter; its bytes are planned from its
steps (app/catalog/scenario/), never from a shape."""

from collections.abc import Mapping
from typing import Any

from app.catalog.model import CatalogError, OpEntry, Param, TensorPlan


def _no_plan(
    shape: tuple[int, ...], params: Mapping[str, Any], dtype: str, device: str
) -> TensorPlan:
    raise CatalogError("steps", "a scenario is planned from its steps")


SCENARIO = OpEntry(
    name="scenario",
    summary="a list of named-tensor steps (create, op, move, pin, delete, empty_cache, "
    "synchronize, repeat); each step gets its own figures and a mark in the trace",
    plan_fn=_no_plan,
    params=(
        Param(
            "on_error",
            "choice",
            "stop at a failing step (the experiment fails) or record "
            "the error in the step and go on",
            default="stop",
            choices=("stop", "continue"),
        ),
    ),
    tags=("scenario",),
)
