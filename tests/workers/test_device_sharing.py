"""Concurrency by device (``vramlab worker`` with no --concurrency): shared-isolation
experiments run together; any other waits for the device and runs alone."""

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import CheckedRunner, SpecFactory
from workers import runner as runner_module
from workers.endings import Outcome
from workers.runner import concurrency_for, spares_for


def _succeeded(outcome: Outcome) -> dict[str, Any]:
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    return outcome.result


def test_the_default_concurrency_follows_the_device() -> None:
    assert concurrency_for(["cpu", "cuda"]) == 4
    assert concurrency_for(["cpu"], cpus=2) == 2
    assert concurrency_for(["cpu"], cpus=16) == 2
    assert concurrency_for(["cpu"], cpus=1) == 1


def test_the_default_spares_follow_the_device() -> None:
    # Two on a GPU: one spare's CUDA context is not made again by the next claim.
    assert spares_for(["cpu", "cuda"]) == 2
    assert spares_for(["cpu"]) == 1
    assert spares_for(["cpu"], concurrency=3) == 3  # a concurrency given, where more


def test_a_concurrency_chosen_by_device_keeps_the_devices_spares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loops chosen by device run clean experiments alone, one spare taken at a time: the
    device's default spares, not one a loop (each a CUDA context on a GPU). A concurrency
    given still raises them."""
    monkeypatch.setitem(runner_module.DEFAULT_CONCURRENCY, "cpu", 2)
    chosen = CheckedRunner(concurrency=None)
    given = CheckedRunner(concurrency=2)
    try:
        for runner in (chosen, given):
            runner.start()
            runner.capabilities()
        assert chosen.concurrency == concurrency_for(["cpu"])
        assert chosen.spare_count == spares_for(["cpu"]) == 1
        assert given.spare_count == 2
    finally:
        chosen.close()
        given.close()


def test_shared_experiments_run_together_and_others_alone(
    make_spec: SpecFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CPU's default is two at a time where the host has two cores (forced here, as
    # a GPU's default of four would be).
    monkeypatch.setitem(runner_module.DEFAULT_CONCURRENCY, "cpu", 2)
    runner = CheckedRunner(concurrency=None)
    runner.start()
    try:
        runner.capabilities()
        assert runner.concurrency == concurrency_for(["cpu"])
        if runner.concurrency < 2:  # a one-core host runs one at a time anyway
            return
        release = threading.Event()
        outcomes: list[Outcome] = []
        long_spec = make_spec("sleep", [4], {"seconds": 60}, warmup=0, repeat=1)
        long_spec["isolation"] = "shared"

        def long_run() -> None:
            outcomes.append(runner.run(long_spec, should_cancel=release.is_set))

        sleeper = threading.Thread(target=long_run)
        sleeper.start()
        try:
            deadline = time.monotonic() + 120  # a bound on a hang, not a timing threshold
            tiny = make_spec("add", [8], trace="none", isolation="shared")
            while True:  # until the sleep runs: then a shared one runs beside it
                together = _succeeded(runner.run(tiny, work_dir=tmp_path))
                if together["environment"]["concurrent"] == 2 or time.monotonic() > deadline:
                    break
            assert together["environment"]["concurrent"] == 2
            clean: list[Outcome] = []
            alone = threading.Thread(
                target=lambda: clean.append(
                    runner.run(make_spec("add", [8], trace="none"), work_dir=tmp_path)
                )
            )
            alone.start()
            alone.join(3.0)  # generous: it would have finished by now had it not waited
            assert alone.is_alive() and not clean, "a clean experiment ran beside a shared one"
            release.set()
            alone.join(120)
            assert _succeeded(clean[0])["environment"]["concurrent"] == 1
        finally:
            release.set()
            sleeper.join(120)
    finally:
        runner.close()
    assert [o.status for o in outcomes] == ["cancelled"]
