"""How PyTorch's CUDA caching allocator rounds requests, for byte predictions."""

CUDA_BLOCK_ROUND = 512


def rounded_block_bytes(nbytes: int, device_type: str) -> int:
    """Bytes the allocator accounts for a tensor of ``nbytes`` on this device type.

    The CUDA caching allocator rounds every block up to a multiple of 512 bytes (and
    a zero-byte request takes no block). The CPU allocator's figures, as the profiler
    reports them, are the requested bytes.
    """
    if device_type != "cuda" or nbytes == 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK_ROUND) * CUDA_BLOCK_ROUND
