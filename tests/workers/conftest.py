"""Fixtures for the worker's tests: one Runner per module, and specs built by the catalog."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.catalog import plan_spec
from app.core.contract import Outcome as ApiOutcome
from vramlab.runspec import RunSpec
from workers.endings import Outcome
from workers.runner import Runner

SpecFactory = Callable[..., dict[str, Any]]


def build_spec(
    op: str,
    shape: list[int],
    params: dict[str, Any] | None = None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    **overrides: Any,
) -> dict[str, Any]:
    """A spec as the API hands it to a worker: params checked, prediction from the catalog."""
    checked, plan = plan_spec(op, tuple(shape), params or {}, dtype, device)
    spec: dict[str, Any] = {
        "op": op,
        "shape": shape,
        "params": checked,
        "dtype": dtype,
        "device": device,
        "warmup": 1,
        "repeat": 3,
        "timeout_s": 60.0,
        "allocator": {},
        "trace": "events",
        "prediction": plan.prediction(device),
    }
    spec.update(overrides)
    return spec


class CheckedRunner(Runner):
    """A Runner whose every outcome must validate against the contract the API enforces."""

    def run(self, spec: RunSpec | dict[str, Any], **kwargs: Any) -> Outcome:
        if not isinstance(spec, RunSpec):  # a spec as the claim sends it
            spec = RunSpec.from_wire(spec)
        outcome = super().run(spec, **kwargs)
        ApiOutcome.model_validate(
            {
                "status": outcome.status,
                "result": outcome.result,
                "error": outcome.error,
                "trace_events": outcome.trace_events,
            }
        )
        return outcome


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    # One runner (and forkserver) for a module: starting one costs a torch import.
    r = CheckedRunner()
    r.start()
    yield r
    r.close()


@pytest.fixture
def make_spec() -> SpecFactory:
    return build_spec
