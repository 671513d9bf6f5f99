"""The model predictor's protocol (``python -m workers.models.predict``, JSON lines) on
specs whose cost must be bounded before they are traced, and configs no model has."""

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.catalog import plan_spec
from vramlab.runspec import ModelParams

pytest.importorskip("transformers")

# A guard against a hang, not a timing figure: an unbounded trace takes minutes.
HANG_S = 120


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.models.predict"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        assert json.loads(self.lines.get(timeout=HANG_S)) == {"ready": True}
        self.next = 0

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def ask(self, params: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
        checked, _ = plan_spec("model", (), params, "float32", device)
        self.next += 1
        assert self.proc.stdin is not None
        request = {"id": self.next, "params": checked, "device": device}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.lines.get(timeout=HANG_S))
        assert answer["id"] == self.next
        return answer


@pytest.fixture(scope="module")
def child() -> Iterator[Child]:
    c = Child()
    yield c
    c.proc.kill()
    c.proc.wait()


@pytest.mark.parametrize("model", ["bart", "marian"])
def test_encoder_decoders_with_their_default_configs_are_predicted(
    child: Child, model: str
) -> None:
    """Their ``num_hidden_layers`` is an alias of ``encoder_layers``: the shallow trace
    overrides the attribute itself, not the alias (which configs do not take)."""
    answer = child.ask({"model": model, "batch_size": 1, "seq_len": 32})
    assert "error" not in answer, answer
    assert answer["peak_allocated"] > 0


def test_a_gpt2_a_million_blocks_deep_is_extended_not_traced(child: Child) -> None:
    """GPT-2's config answers to two depth names (``n_layer``, ``num_hidden_layers``)
    that are one attribute: it is traced shallow and extended."""
    shallow = child.ask({"model": "gpt2", "batch_size": 1, "seq_len": 32})
    deep = child.ask(
        {"model": "gpt2", "batch_size": 1, "seq_len": 32, "config": {"n_layer": 1_000_000}}
    )
    assert "error" not in deep, deep
    assert deep["peak_allocated"] > 10_000 * shallow["peak_allocated"]
    assert deep["peak_reserved"] >= deep["peak_allocated"]
    assert any("rounded up" in c for c in deep["caveats"])


def test_a_deep_stack_past_the_replay_has_its_reserved_extended(child: Child) -> None:
    answer = child.ask(
        {"model": "gpt2", "batch_size": 1, "seq_len": 32, "config": {"n_layer": 200}}
    )
    assert "error" not in answer, answer
    assert any("extended in a straight line" in c for c in answer["caveats"])
    assert answer["peak_reserved"] >= answer["peak_allocated"]


def test_stacks_of_different_depths_are_extended(child: Child) -> None:
    """T5 with a decoder far deeper than its encoder: each stack extended on its line."""
    answer = child.ask(
        {"model": "t5", "batch_size": 1, "seq_len": 32, "config": {"num_decoder_layers": 100_000}}
    )
    assert "error" not in answer, answer
    base = child.ask({"model": "t5", "batch_size": 1, "seq_len": 32})
    assert answer["peak_allocated"] > 1000 * base["peak_allocated"]


def test_extending_different_stacks_matches_tracing_them_whole() -> None:
    """The straight lines of an encoder-decoder, checked against a whole trace of it."""
    from workers.models import predict
    from workers.models.steps import START

    checked, _ = plan_spec(
        "model",
        (),
        {
            "model": "t5",
            "batch_size": 2,
            "seq_len": 16,
            "config": {"num_layers": 4, "num_decoder_layers": 7},
        },
        "float32",
        "cuda",
    )
    params = ModelParams.from_wire(checked)
    whole, _ = predict._trace(params, cuda=True)
    extended = predict._extend_stacks(params, True, {"num_layers": 4, "num_decoder_layers": 7})
    peaks = [name for name in whole if not name.endswith(START)]
    assert {k: extended[k] for k in peaks} == {k: whole[k] for k in peaks}
    # A phase's start is a window (until 1/64 of what was live has ended), not one op:
    # its line is close, not exact.
    for name in whole.keys() - peaks:
        total = sum(whole[name].values())
        assert abs(sum(extended[name].values()) - total) <= 0.01 * total


def test_a_deep_stack_whose_peak_moves_past_two_blocks_is_extended_as_traced_whole() -> None:
    """T5-base with its dropout and short targets: at two blocks its backward peaks at
    another moment than at three or more, so the line through two and three ran 14% over
    a whole trace (H100: predicted 38% over the measured step at twelve blocks)."""
    from workers.models import predict

    params = ModelParams.of(
        {
            "model": "t5-base",
            "batch_size": 8,
            "seq_len": 512,
            "target_len": 64,
            "config": {"num_layers": 6, "num_decoder_layers": 6},
        }
    )
    whole, _ = predict._trace(params, cuda=True)
    extended, _ = predict._phases(params, cuda=True)

    def peak(phases: dict[str, dict[str, int]]) -> dict[str, int]:
        return max(phases.values(), key=lambda categories: sum(categories.values()))

    # The backward's own peak moves (a later moment at two and three blocks); its start,
    # extended on its own line, is the peak at six, as in the whole trace.
    assert peak(extended) == peak(whole)
    assert extended["forward"] == whole["forward"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"n_head": 0}, "params.config"),
        ({"n_layer": -1}, "params.config.n_layer"),
        ({"n_embd": 2**45}, "params.config.n_embd"),
        ({"n_positions": 2**30, "n_embd": 2**14}, "params.config"),
    ],
)
def test_configs_no_model_can_have_are_refused_not_unpredictable(
    child: Child, config: dict[str, Any], field: str
) -> None:
    answer = child.ask({"model": "gpt2", "batch_size": 1, "seq_len": 32, "config": config})
    error = answer.get("error")
    assert error is not None, answer
    assert not error.get("unpredictable"), error
    assert error["field"] == field


def test_a_model_too_costly_to_trace_is_refused_saying_why(child: Child) -> None:
    """Depths given as a list are not extended: past the bound, refused."""
    answer = child.ask(
        {"model": "resnet", "batch_size": 1, "config": {"depths": [3, 4, 6, 3000]}},
        device="cuda",
    )
    error = answer.get("error")
    assert error is not None and not error.get("unpredictable"), answer
    assert "too costly to predict" in error["message"]
