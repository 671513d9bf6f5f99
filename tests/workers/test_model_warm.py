"""Warm model children: a model's trial handed to a child that imported transformers
before it arrived measures what a trial in a cold child measures, byte for byte; each
warm child runs one trial and is replaced, and the first is ready when the worker starts
(``capabilities``), so the first trial is warm too."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cuda_available
from tests.workers.conftest import CheckedRunner, build_spec
from workers.endings import Outcome
from workers.runner import Runner

pytest.importorskip("transformers")

TINY = {"model": "tiny-llama", "batch_size": 2, "seq_len": 16}


DEVICES = [
    "cpu",
    pytest.param(
        "cuda:0",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not cuda_available(), reason="needs a GPU")],
    ),
]


def _spec(device: str = "cpu") -> dict[str, Any]:
    return build_spec("model", [], dict(TINY), device=device, warmup=0, repeat=1, timeout_s=300.0)


def _bytes_only(value: Any) -> Any:
    """The figures that count bytes and steps: clocks, the host's RSS (which the process
    around the trial moves) and the GPU's used memory (every process's, the spares'
    contexts included) left out."""
    if isinstance(value, dict):
        return {
            k: _bytes_only(v)
            for k, v in value.items()
            if not k.startswith(("host_rss", "device_used"))
            and k not in ("wall_s", "time_per_step_s")
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


def _model_child(runner: Runner, device: str) -> int | None:
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing threshold
    while not runner.spares(f"{device}+models"):
        assert time.monotonic() < deadline, "no warm model child was made"
        time.sleep(0.05)
    return runner.spares(f"{device}+models")[0].pid


@pytest.mark.parametrize("device", DEVICES)
def test_a_warm_trial_measures_what_a_cold_one_does(device: str, tmp_path: Path) -> None:
    cold = CheckedRunner(warm=False)
    try:
        cold_outcome = cold.run(_spec(device), work_dir=tmp_path)
    finally:
        cold.close()
    warm = CheckedRunner()
    try:
        warm.capabilities()  # as a worker starts, before it registers
        # The first model child is warm already: the first trial needs no other.
        ready = [p.pid for p in warm.spares(f"{device}+models")]
        assert len(ready) == 1
        first = warm.run(_spec(device), work_dir=tmp_path)
        # Made while the trial ran (a GPU) or after it (the CPU), transformers imported.
        replacement = _model_child(warm, device)
        second = warm.run(_spec(device), work_dir=tmp_path)
    finally:
        warm.close()
    assert cold_outcome.result is not None
    assert cold_outcome.result["environment"]["child_start"] == "forked"
    for outcome in (first, second):
        assert outcome.result is not None
        assert outcome.result["environment"]["child_start"] == "warm_model"
        assert _figures(outcome) == _figures(cold_outcome)
    assert [first.pid, second.pid] == [*ready, replacement]  # each ran in a model child
    assert first.pid != second.pid  # one trial a child


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a GPU")
def test_a_model_on_a_gpu_never_runs_in_an_ops_spare(tmp_path: Path) -> None:
    """An op's spare and the shared processes made from them have one hardware queue: a
    model's trial, shared isolation asked or not, runs in a warm model child (the driver's
    default queues) and says isolation clean."""
    from workers.device import ONE_QUEUE_NOTE

    warm = CheckedRunner()
    try:
        warm.capabilities()
        shared = {**_spec("cuda:0"), "isolation": "shared"}
        outcomes = [warm.run(_spec("cuda:0"), work_dir=tmp_path)]
        _model_child(warm, "cuda:0")  # the next trial's warm child
        outcomes.append(warm.run(shared, work_dir=tmp_path))
    finally:
        warm.close()
    for outcome in outcomes:
        assert outcome.status == "succeeded", outcome.error
        assert outcome.result is not None
        environment = outcome.result["environment"]
        assert environment["child_start"] == "warm_model"
        assert environment["isolation"] == "clean"
        assert ONE_QUEUE_NOTE not in outcome.result["notes"]


def test_a_runner_without_spares_makes_no_model_child() -> None:
    runner = CheckedRunner(warm=False)
    try:
        runner.capabilities()
        assert runner.spares("cpu+models") == []
    finally:
        runner.close()
