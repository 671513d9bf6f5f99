"""The GPU host's truth scripts (bench/truth/), smoke-tested on the CPU with tiny shapes:
the plain script (no vramlab code) runs each kind of case and names the same bytes of
parameters, gradients and optimizer state as vramlab's worker."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bench.truth.run import CASES, truth_case

pytest.importorskip("peft")


def plain(params: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "bench/truth/plain.py", json.dumps(truth_case(params))],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_every_gpu_case_is_a_spec_vramlab_accepts() -> None:
    from app.catalog import plan_spec

    for params in CASES.values():
        plan_spec("model", (), params, "float32", "cuda:0")


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"model": "tiny-llama", "batch_size": 2, "seq_len": 16, "peft": {"r": 4}},
        {"model": "tiny-t5", "batch_size": 2, "seq_len": 16, "target_len": 4},
        {
            "model": "tiny-gpt2",
            "seq_len": 16,
            "trainer": {"per_device_train_batch_size": 2, "optim": "adamw_torch"},
        },
    ],
    ids=["lora", "t5-targets", "trainer"],
)
def test_the_plain_script_counts_what_the_worker_counts(params: dict[str, Any]) -> None:
    from tests.workers.conftest import build_spec
    from vramlab.runspec import RunSpec
    from workers.runner import Runner

    truth = plain(params)
    runner = Runner()
    runner.start()
    try:
        spec = build_spec("model", [], params, warmup=0, repeat=1, timeout_s=120.0)
        outcome = runner.run(RunSpec.from_wire(spec))
    finally:
        runner.close()
    assert outcome.status == "succeeded", outcome.error
    assert outcome.result is not None
    figures = outcome.result["model"]
    assert truth["trainable_parameters"] == figures["trainable_parameter_count"]
    assert truth["gradients"] == figures["gradient_bytes"]
    assert truth["optimizer_state"] == figures["optimizer_state_bytes"]


@pytest.mark.slow
def test_the_plain_distributed_script_counts_what_each_rank_counts() -> None:
    """bench/truth/plain_distributed.py on the CPU (gloo, 2 ranks) against vramlab's
    distributed experiment: each rank's shards to the byte."""
    from bench.truth.run import DISTRIBUTED, on_cpu, vramlab
    from bench.truth.run import plain as plain_run

    params = on_cpu(DISTRIBUTED["fsdp-llama8b-2"])
    truth = plain_run(params, cpu=True)
    ours = vramlab(params, cpu=True)
    assert "error" not in truth and "error" not in ours, (truth, ours)
    ranks = ours["measured"]["ranks"]
    assert [r["rank"] for r in truth["ranks"]] == [r["rank"] for r in ranks] == [0, 1]
    for plain_rank, rank in zip(truth["ranks"], ranks, strict=True):
        assert plain_rank["parameters"] == rank["parameter_bytes"]
        assert plain_rank["gradients"] == rank["gradient_bytes"]
        assert plain_rank["optimizer_state"] == rank["optimizer_state_bytes"]
