"""The buffers CUDA kernels take for themselves, in predictions for CUDA
(workers/models/kernel_scratch.py): a reduction's global buffer and cuDNN attention's
backward, against what an H200 allocated (bench/kernel_scratch.py, torch 2.11), and the
ViT step whose prediction under bf16 autocast fell short because of them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workers.models.kernel_scratch import (
    cudnn_backward_bytes,
    reduction_bytes,
    reduction_of,
)

# (shape, reduced dims, dtype) -> the allocator's bytes inside the op on an H200 (the
# buffer and its semaphores, each a block of the caching allocator).
H200_REDUCTIONS = [
    ([12608, 3072], [0], torch.bfloat16, 138412544),  # ViT-B's MLP bias at batch 64
    ([12608, 3072], [0], torch.float32, 138412544),
    ([12608, 3072], [0], torch.float64, 276824576),
    ([8192, 2304], [0], torch.bfloat16, 139198976),  # GPT-2's fused QKV bias, 8 x 1024
    ([8192, 768], [0], torch.float32, 50332160),
    ([2048, 2048], [0], torch.bfloat16, 33554944),
    ([4096, 128], [0], torch.float32, 4194816),
    ([100000, 64], [0], torch.bfloat16, 12812800),
    ([16384, 4096], [0], torch.float32, 138412544),
    ([2, 1024, 2048], [0, 1], torch.bfloat16, 33554944),  # Llama's norm weight, 2 x 1024
    ([8, 1024, 768], [1], torch.float32, 50332160),
    ([8, 12, 1024, 64], [0, 2], torch.bfloat16, 50332160),
    ([1, 16384, 4096], [0, 1], torch.float32, 138412544),
    ([64, 197, 768], [0, 1], torch.bfloat16, 77595136),  # a 74 MiB segment, not split
    ([1000, 1000], [0], torch.float32, 0),  # too short to split over blocks
    ([300, 4096], [0], torch.bfloat16, 0),
    ([64, 50257], [0], torch.float32, 0),
    ([8, 1024, 768], [2], torch.float32, 0),  # the fastest dimension: within a block
    ([4096, 4096], [1], torch.bfloat16, 0),
    ([64, 768, 14, 14], [0, 2, 3], torch.float32, 0),
    ([7, 333, 1001], [0, 1], torch.bfloat16, 0),
]


def _blocks(nbytes: int) -> int:
    return -(-nbytes // 512) * 512 if nbytes else 0


@pytest.mark.parametrize(("shape", "dims", "dtype", "measured"), H200_REDUCTIONS)
def test_a_reductions_buffer_is_what_an_h200_allocated(
    shape: list[int], dims: list[int], dtype: torch.dtype, measured: int
) -> None:
    from workers.models.kernel_scratch import counted

    x = torch.empty(shape, dtype=dtype, device="meta")
    found = reduction_of(x, dims)
    assert found is not None
    buffer, semaphores = reduction_bytes(*found)
    assert _blocks(counted(buffer)) + _blocks(semaphores) == measured


# (batch, heads, kv heads, length, head size) -> cuDNN's backward on an H200, bf16, over
# the gradients it returns (within 1 MiB: the allocator's rounding of fresh segments).
H200_CUDNN = [
    ((64, 12, 12, 197, 64), 39337472),
    ((4, 8, 8, 1000, 80), 10860032),
    ((4, 8, 8, 77, 256), 2533376),
    ((2, 32, 8, 1024, 128), 67371520),  # grouped heads
    ((1, 32, 8, 8192, 128), 270532608),
]


@pytest.mark.parametrize(("shape", "measured"), H200_CUDNN)
def test_cudnn_attentions_backward_is_what_an_h200_allocated(
    shape: tuple[int, int, int, int, int], measured: int
) -> None:
    b, h, hk, s, d = shape
    query = torch.empty(b, h, s, d, dtype=torch.bfloat16, device="meta")
    key = torch.empty(b, hk, s, d, dtype=torch.bfloat16, device="meta")
    made = sum(_blocks(n) for n in cudnn_backward_bytes(query, key))
    assert abs(made - measured) <= 2**20, (made, measured)


pytest.importorskip("transformers")

from workers.models.predict import FAMILIES, answer, predict  # noqa: E402

# ViT-B/16 at batch 64 under bf16 autocast, measured by the worker's child on an H200
# (torch 2.11, 2026-11-28): step 2's peak allocated. The prediction without the kernels'
# own buffers was 6,123,483,136 (-1.66%): the peak falls inside the MLP bias's gradient,
# whose reduction holds a 74 MiB buffer.
VIT_AUTOCAST_H200 = 6226961408


def test_vits_bf16_autocast_step_is_predicted_within_one_percent_of_an_h200() -> None:
    spec = {"model": "vit-base", "batch_size": 64, "precision": "bf16-autocast"}
    predicted = predict(spec, "cuda")["peak_allocated"]
    assert abs(predicted - VIT_AUTOCAST_H200) <= 0.01 * VIT_AUTOCAST_H200, predicted


def _ask(params: dict[str, Any]) -> dict[str, Any]:
    out = answer({"params": params, "device": "cuda"})
    assert "error" not in out, out
    out.pop("seconds")
    return out


def test_a_family_reused_across_batch_sizes_works_the_buffers_out_again() -> None:
    """A reduction's buffer is not linear in the batch (its blocks per output round up
    unevenly, and stop growing at the GPU's size): a family's other batch sizes still
    answer as fresh traces do. A wide MLP in bf16, where the bias's buffer is at the peak."""
    base = {"model": "tiny-vit", "precision": "bf16", "config": {"intermediate_size": 4096}}
    sizes = (64, 72, 100, 88, 150)
    fresh = {}
    for b in sizes:
        FAMILIES.clear()
        fresh[b] = _ask({**base, "batch_size": b})
    FAMILIES.clear()
    for b in sizes[:3]:
        _ask({**base, "batch_size": b})
    assert FAMILIES.reused == 0
    for b in sizes[3:]:
        assert _ask({**base, "batch_size": b}) == fresh[b], b
    assert FAMILIES.reused == 2
