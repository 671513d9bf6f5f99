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


def test_a_limit_that_lands_in_a_librarys_try_is_still_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers' model init binds a name inside its ``try`` and reads it in ``finally``:
    the limit's raise before the binding surfaces as an UnboundLocalError. The spec is
    refused for time, not as a config no model can be built with."""
    pytest.importorskip("transformers")
    from workers.models import predict

    def fragile_build(*args: object, **kwargs: object) -> None:
        try:
            _burn(5.0)
            bound = True
        finally:
            assert bound  # unbound when the limit lands first

    monkeypatch.setattr(predict, "build", fragile_build)
    params = {"model": "gpt2", "batch_size": 1, "seq_len": 8, "config": {"n_layer": 1}}
    out = predict.answer({"params": params, "device": "cpu", "limit_s": 0.05})
    assert predict.PASSED_LIMIT in out["error"]["message"], out
    assert "cannot be built" not in out["error"]["message"]
