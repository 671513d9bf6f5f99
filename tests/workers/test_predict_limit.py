"""The predictor's CPU-time limit stops a trace even where Python drops its first raise."""

from __future__ import annotations

import time

import pytest

from workers.models.predict import OverLimit, cpu_limit


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class _Finalized:
    """An object whose finalizer takes CPU time: a signal's raise there is dropped."""

    def __del__(self) -> None:
        _burn(0.02)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_limit_holds_when_its_first_raise_lands_in_a_finalizer() -> None:
    start = time.monotonic()
    finalizers_until = time.process_time() + 0.2
    with pytest.raises(OverLimit), cpu_limit(0.001):
        # First the CPU time is spent in finalizers (where Python prints and drops an
        # exception), then in plain code, where the limit must still stop it.
        while time.process_time() < finalizers_until:
            _Finalized()
        while time.monotonic() - start < 10:
            _burn(0.001)
    assert time.monotonic() - start < 10
