"""The predictor's reserved bytes on CUDA: the build and steps 1 and 2, logged on fake
tensors in the order they allocate and free, replayed through the caching-allocator
model with the spec's settings and capacity. A deep model's log is traced at three
blocks and extended; it must equal the log of the model traced whole."""

from typing import Any

import pytest

pytest.importorskip("transformers")

from workers.models.alloc_log import deepen
from workers.models.caching_allocator import CachingAllocator, Settings, replay
from workers.models.predict import _phases, _trace, predict

MiB = 2**20
# GPT-2's real widths (its 154 MB embedding, 20 MiB-segment-sized layers) at two
# blocks: fake tensors cost nothing by their size, so this traces in a moment.
SHORT_GPT2 = {"model": "gpt2", "config": {"n_layer": 2}, "batch_size": 2, "seq_len": 128}


def canonical(events: list[tuple[int, int]]) -> list[tuple[str, int | None]]:
    """Allocations by size, frees by which allocation (its position), keys forgotten."""
    where: dict[int, int] = {}
    out: list[tuple[str, int | None]] = []
    for key, nbytes in events:
        if nbytes >= 0:
            where[key] = len(out)
            out.append(("alloc", nbytes))
        else:
            out.append(("free", where.get(key)))
    return out


@pytest.mark.parametrize(
    "params",
    [
        {"model": "gpt2", "config": {"n_layer": 6}, "batch_size": 2, "seq_len": 64},
        {
            "model": "tiny-llama",
            "config": {"num_hidden_layers": 6},
            "precision": "bf16-autocast",
            "checkpointing": True,
        },
        {"model": "tiny-bert", "config": {"num_hidden_layers": 7}, "task": "inference"},
    ],
    ids=["gpt2", "llama-autocast-checkpointing", "bert-inference"],
)
def test_a_deep_models_log_extended_from_three_blocks_equals_it_traced_whole(
    params: dict[str, Any],
) -> None:
    params = {**params, "optimizer_impl": "foreach"}
    _, extended = _phases(params, True, logged=True)
    _, whole = _trace(params, True, logged=True)
    assert extended is not None and whole is not None
    assert canonical(extended) == canonical([(e.key, e.nbytes) for e in whole.events])


def test_deepening_refuses_blocks_that_do_not_repeat() -> None:
    """T5's first block alone has the relative attention bias, and a log whose blocks
    were not told apart cannot be deepened: such models are traced whole instead."""
    from workers.models.alloc_log import Event, NotRegular

    params = {"model": "tiny-t5", "config": {"num_layers": 3}, "optimizer_impl": "foreach"}
    _, log = _trace(params, True, logged=True, blocks=3)
    assert log is not None
    with pytest.raises(NotRegular):
        deepen(log.events, 6)
    with pytest.raises(NotRegular):
        deepen([Event(1, 4096, "forward", None), Event(1, -1, "forward", None)], 6)


def test_predicted_reserved_is_the_step_replayed_through_the_allocator() -> None:
    predicted = predict(SHORT_GPT2, "cuda")
    _, log = _trace({**SHORT_GPT2, "optimizer_impl": "foreach"}, True, logged=True)
    assert log is not None
    replayed = replay([(e.key, e.nbytes, 0) for e in log.events])
    assert predicted["peak_reserved"] == replayed.peak_reserved
    # Fragmentation puts it above the allocated peak rounded to 2 MiB segments.
    assert predicted["peak_reserved"] > -(-predicted["peak_allocated"] // (2 * MiB)) * 2 * MiB
    # The replay's own allocated peak covers the step's (workspaces included).
    assert (
        abs(replayed.peak_allocated - predicted["peak_allocated"]) <= 0.01 * replayed.peak_allocated
    )


def test_allocator_settings_and_a_capacity_change_what_is_predicted_reserved() -> None:
    plain = predict(SHORT_GPT2, "cuda")
    expandable = predict(SHORT_GPT2, "cuda", {"expandable_segments": True})
    assert expandable["peak_allocated"] == plain["peak_allocated"]
    assert expandable["peak_reserved"] != plain["peak_reserved"]  # its own segments
    async_backend = predict(SHORT_GPT2, "cuda", {"backend": "cudaMallocAsync"})
    assert any("floor" in c for c in async_backend["caveats"])
    # Under a capacity the figure is what the capped allocator reserves: within it
    # exactly when the step fits.
    roomy = predict({**SHORT_GPT2, "capacity_bytes": plain["peak_reserved"]}, "cuda")
    assert roomy["peak_reserved"] == plain["peak_reserved"]
    tight = predict({**SHORT_GPT2, "capacity_bytes": plain["peak_allocated"] - 1}, "cuda")
    assert tight["peak_reserved"] > plain["peak_allocated"] - 1
    # Between the two, the allocator may fit by releasing its cache (as CUDA's does).
    _, log = _trace({**SHORT_GPT2, "optimizer_impl": "foreach"}, True, logged=True)
    assert log is not None
    events = [(e.key, e.nbytes, 0) for e in log.events]
    step = (plain["peak_reserved"] - plain["peak_allocated"]) // 3
    for capacity in range(plain["peak_allocated"] + step, plain["peak_reserved"], step):
        capped = replay(events, CachingAllocator(Settings(), fraction_limit=capacity))
        answer = predict({**SHORT_GPT2, "capacity_bytes": capacity}, "cuda")["peak_reserved"]
        assert (answer <= capacity) == (not capped.oom)
