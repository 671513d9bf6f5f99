"""The contract's models: what they accept and refuse (the worker's real results are
checked against them in tests/workers, through the runner fixture)."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.core import contract as api_contract
from app.core.contract import Outcome, Result
from vramlab import contract, wire
from vramlab.contract import MEMORY_KEYS, ErrorType, Status

MEMORY = dict.fromkeys(MEMORY_KEYS, 0)
ROOT = Path(__file__).resolve().parents[1]


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


def test_the_client_contract_imports_without_pydantic() -> None:
    """The client's contract, its run spec and its wire checks need the standard library
    alone: they import in a process where pydantic cannot."""
    code = (
        "import sys; sys.modules['pydantic'] = None\n"
        "import vramlab.contract, vramlab.runspec, vramlab.wire\n"
        "print(len(vramlab.contract.CONTRACT_TYPES))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(contract.CONTRACT_TYPES) > 20


def test_the_worker_checks_an_outcome_as_the_api_does() -> None:
    """vramlab.wire (the worker's check) and the API's models agree on what they refuse."""
    good = {"status": "succeeded", "result": {"memory": MEMORY}}
    assert isinstance(wire.load(contract.Outcome, good), contract.Outcome)
    bad = [
        {"status": "succeeded"},
        {"status": "succeeded", "result": {"memory": {**MEMORY, "allocated_peak": 1.5}}},
        {"status": "succeeded", "result": {"memory": MEMORY, "surprise": 1}},
        {"status": "failed", "error": {"type": "bogus", "message": "m"}},
        {"status": "failed", "error": {"type": "oom", "message": "m" * 20_001}},
        {"status": "succeeded", "result": {"memory": MEMORY}, "trace_events": -1},
    ]
    for data in bad:
        with pytest.raises(ValueError):
            wire.load(contract.Outcome, data)
        with pytest.raises(ValidationError):
            Outcome.model_validate(data)


def test_each_contract_class_has_one_api_model_of_its_fields() -> None:
    for cls in contract.CONTRACT_TYPES:
        model = getattr(api_contract, cls.__name__)
        assert list(model.model_fields) == [f.name for f in dataclasses.fields(cls)]
        assert model.__doc__ == cls.__doc__
