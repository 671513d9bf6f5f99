"""The contract's models: what they accept and refuse (the worker's real results are
checked against them in tests/workers, through the runner fixture)."""

from typing import Any

import pytest
from pydantic import ValidationError

from vramlab.contract import MEMORY_KEYS, ErrorType, Outcome, Result, Status

MEMORY = dict.fromkeys(MEMORY_KEYS, 0)


def test_a_succeeded_outcome_needs_integer_v1_figures() -> None:
    Outcome.model_validate({"status": "succeeded", "result": {"memory": MEMORY}})
    for broken in ({**MEMORY, "delta_allocated": None}, {**MEMORY, "allocated_peak": 1.5}):
        with pytest.raises(ValidationError):
            Outcome.model_validate({"status": "succeeded", "result": {"memory": broken}})
    with pytest.raises(ValidationError, match="needs a result"):
        Outcome.model_validate({"status": "succeeded"})


def test_a_field_nobody_declared_is_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Result.model_validate({"memory": MEMORY, "surprise": 1})
    with pytest.raises(ValidationError, match="extra"):
        Result.model_validate({"memory": {**MEMORY, "surprise": 1}})


def test_a_failure_names_a_known_type_within_the_limits() -> None:
    ok: dict[str, Any] = {"status": "failed", "error": {"type": "oom", "message": "m"}}
    assert Outcome.model_validate(ok).error is not None
    with pytest.raises(ValidationError):
        Outcome.model_validate({**ok, "error": {"type": "bogus", "message": "m"}})
    with pytest.raises(ValidationError):
        Outcome.model_validate({**ok, "error": {"type": "oom", "message": "m" * 20_001}})
    with pytest.raises(ValidationError):
        Outcome.model_validate({"status": "queued"})
    assert {e.value for e in ErrorType} >= {"memory_limit", "report_refused"}


def test_the_wire_form_keeps_the_keys_as_sent() -> None:
    copy = {"op": "aten::_to_copy", "from": "cpu", "to": "cuda:0", "calls": 1, "bytes": 8}
    sent = {
        "status": "succeeded",
        "result": {"memory": MEMORY, "placement": {"host_device_copies": [copy]}},
    }
    outcome = Outcome.model_validate(sent)
    assert outcome.status is Status.SUCCEEDED
    assert outcome.wire() == sent
