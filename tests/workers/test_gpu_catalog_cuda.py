"""On a GPU host: the GPU catalog's card for this GPU says what PyTorch sees here."""

import pytest

from app.gpus.cards import find
from tests.helpers import cuda_available

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU"),
]


def test_the_catalog_card_of_this_gpu_has_its_total_and_a_usable_size_the_allocator_reaches() -> (
    None
):
    import torch

    name = torch.cuda.get_device_name(0)
    card = find(name)
    if card is None:
        pytest.skip(f"{name} is not in the GPU catalog")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.empty(1, device="cuda")  # the context up
    free, _ = torch.cuda.mem_get_info(0)
    reserved = torch.cuda.memory_reserved(0)
    assert abs(card.total_bytes - total) <= 0.01 * total, (name, card.total_bytes, total)
    # What the allocator may reserve cannot pass what is free once the context is up.
    assert card.usable_bytes <= free + reserved + 64 * 2**20, (card.usable_bytes, free, reserved)
    assert card.usable_bytes >= 0.97 * (free + reserved), (card.usable_bytes, free, reserved)
