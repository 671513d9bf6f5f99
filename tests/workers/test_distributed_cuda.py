"""Distributed model experiments on the GPUs of one host (NCCL), through the worker's
runner: each rank on its own GPU, its shards, the prediction per rank, and out of memory
on a rank as the answer.

Run on a host with 2 or more GPUs: ``pytest -m cuda tests/workers/test_distributed_cuda.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import needs_cuda
from tests.workers.conftest import build_spec
from workers.runner import Runner

pytestmark = [*needs_cuda(), pytest.mark.slow]
pytest.importorskip("transformers")

SMALL_GPT2 = {"model": "gpt2", "config": {"n_layer": 4}, "batch_size": 4, "seq_len": 256}


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _outcome(runner: Runner, **params: Any) -> Any:
    spec = build_spec("model", [], params, device="cuda:0", warmup=0, repeat=1, timeout_s=600.0)
    return runner.run(spec)


@pytest.mark.parametrize(
    "plan",
    [
        {"strategy": "ddp", "gpus": 2},
        {"strategy": "fsdp", "gpus": 2},
        {"strategy": "fsdp", "gpus": 2, "sharding": "grad-op", "mixed_precision": "bf16"},
    ],
)
def test_each_rank_runs_on_its_gpu_and_is_predicted(runner: Runner, plan: dict[str, Any]) -> None:
    if _gpus() < plan["gpus"]:
        pytest.skip(f"needs {plan['gpus']} GPUs")
    from workers.models.predict import predict

    outcome = _outcome(runner, **SMALL_GPT2, distributed=plan)
    assert outcome.status == "succeeded", outcome.error
    model = outcome.result["model"]
    ranks = model["ranks"]
    assert [r["device"] for r in ranks] == [f"cuda:{r}" for r in range(plan["gpus"])]
    prediction = predict({**SMALL_GPT2, "distributed": plan}, "cuda")
    predicted = prediction["peak_allocated"]
    for rank in ranks:
        assert sum(rank["categories"].values()) == rank["peak_allocated"]
        seen = {k: rank.get(k) for k in ("peak_allocated", "phase", "categories", "bucket_bytes")}
        said = {k: prediction.get(k) for k in ("peak_allocated", "phase", "categories")}
        measured = rank["peak_allocated"]
        # DDP's step 2 held a second set of buckets in two runs of three before it waited
        # for NCCL's watchdog to let go of step 1's all-reduces (2.44 GB against 2.18
        # predicted, docs/models.md).
        close = abs(predicted - measured) <= 0.03 * measured
        assert close, f"measured {seen}; predicted {said}"
    if plan["strategy"] == "fsdp":
        total = sum(r["parameter_bytes"] for r in ranks)
        assert all(r["parameter_bytes"] < 0.6 * total for r in ranks)


def test_fsdp_on_four_gpus_with_hybrid_sharding(runner: Runner) -> None:
    if _gpus() < 4:
        pytest.skip("needs 4 GPUs")
    plan = {"strategy": "fsdp", "gpus": 4, "sharding": "hybrid"}
    outcome = _outcome(runner, **SMALL_GPT2, distributed=plan)
    assert outcome.status == "succeeded", outcome.error
    assert len(outcome.result["model"]["ranks"]) == 4


def test_out_of_memory_on_a_rank_fails_the_experiment_naming_it(runner: Runner) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    huge = {**SMALL_GPT2, "batch_size": 4096, "seq_len": 1024}
    outcome = _outcome(runner, **huge, distributed={"strategy": "ddp", "gpus": 2})
    assert outcome.status == "failed"
    assert outcome.error["type"] == "oom", outcome.error
    assert "rank " in outcome.error["message"]


def test_an_emulated_card_caps_every_ranks_allocator(runner: Runner) -> None:
    """capacity_bytes is each rank's card under NCCL too: each rank's caching allocator is
    capped at it, so a card under the step's peak fails the run on a rank it names, and a
    card above every rank's peak runs it with each rank's reserved bytes inside it."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    ddp = {"strategy": "ddp", "gpus": 2}
    free = _outcome(runner, **SMALL_GPT2, distributed=ddp)
    assert free.status == "succeeded", free.error
    peak = max(r["peak_allocated"] for r in free.result["model"]["ranks"])
    small = peak // 2
    tight = _outcome(runner, **SMALL_GPT2, distributed=ddp, capacity_bytes=small)
    assert tight.status == "failed" and tight.error is not None
    assert tight.error["type"] == "oom", tight.error
    details = tight.error["details"]
    assert details["capacity_bytes"] == small
    assert details["mechanism"] == "cuda_memory_fraction"
    assert details["rank"] in (0, 1)
    assert f"on rank {details['rank']} of 2" in tight.error["message"]
    roomy = 2 * peak
    fits = _outcome(runner, **SMALL_GPT2, distributed=ddp, capacity_bytes=roomy)
    assert fits.status == "succeeded", fits.error
    for rank in fits.result["model"]["ranks"]:
        assert rank["peak_reserved"] <= roomy, rank
