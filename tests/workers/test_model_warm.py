"""Warm model children: a model's trial handed to a child that imported transformers
before it arrived measures what a trial in a cold child measures, byte for byte; each
warm child runs one trial and is replaced."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import CheckedRunner, build_spec
from workers.endings import Outcome
from workers.runner import Runner

pytest.importorskip("transformers")

TINY = {"model": "tiny-llama", "batch_size": 2, "seq_len": 16}


def _spec() -> dict[str, Any]:
    return build_spec("model", [], dict(TINY), warmup=0, repeat=1, timeout_s=300.0)


def _bytes_only(value: Any) -> Any:
    """The figures that count bytes and steps: clocks and the host's RSS (which the
    process around the trial moves) left out."""
    if isinstance(value, dict):
        return {
            k: _bytes_only(v)
            for k, v in value.items()
            if not (k.startswith("host_rss") or k in ("wall_s", "time_per_step_s"))
            and not k.endswith("_per_s")
        }
    if isinstance(value, list):
        return [_bytes_only(v) for v in value]
    return value


def _figures(outcome: Outcome) -> bytes:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    figures = {k: outcome.result[k] for k in ("memory", "model")}
    return json.dumps(_bytes_only(figures), sort_keys=True).encode()


def _model_child(runner: Runner) -> int | None:
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing threshold
    while not runner.spares("cpu+models"):
        assert time.monotonic() < deadline, "no warm model child was made"
        time.sleep(0.05)
    return runner.spares("cpu+models")[0].pid


def test_a_warm_trial_measures_what_a_cold_one_does(tmp_path: Path) -> None:
    cold = CheckedRunner(warm=False)
    try:
        cold_outcome = cold.run(_spec(), work_dir=tmp_path)
    finally:
        cold.close()
    warm = CheckedRunner()
    try:
        warm.capabilities()
        first = warm.run(_spec(), work_dir=tmp_path)  # a plain spare: no model child yet
        ready = _model_child(warm)  # made after the first trial, transformers imported
        second = warm.run(_spec(), work_dir=tmp_path)
        replacement = _model_child(warm)
        third = warm.run(_spec(), work_dir=tmp_path)
    finally:
        warm.close()
    assert cold_outcome.result is not None
    assert cold_outcome.result["environment"]["child_start"] == "forked"
    for outcome in (first, second, third):
        assert outcome.result is not None
        assert outcome.result["environment"]["child_start"] == "warm_spare"
        assert _figures(outcome) == _figures(cold_outcome)
    assert (second.pid, third.pid) == (ready, replacement)  # each ran in a model child
    assert len({first.pid, second.pid, third.pid}) == 3  # one trial a child
