"""Device strings as a spec names them: ``cpu``, ``cuda`` or ``cuda:N``."""

import re

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
MAX_CUDA_INDEX = 15
_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(device: str) -> tuple[str, int]:
    """Split a device string into its type and index; raise ValueError when malformed.

    ``cuda`` means ``cuda:0``; ``cpu`` has index 0 and takes no other.
    """
    match = _DEVICE.match(device)
    if match is None:
        raise ValueError(f"unknown device {device!r}; allowed: 'cpu', 'cuda', 'cuda:N'")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index not in (None, "0"):
            raise ValueError("device 'cpu' takes no index")
        return "cpu", 0
    n = int(index) if index is not None else 0
    if n > MAX_CUDA_INDEX:
        raise ValueError(f"cuda index {n} is out of range 0..{MAX_CUDA_INDEX}")
    return "cuda", n


def canonical_device(device: str) -> str:
    kind, index = parse_device(device)
    return "cpu" if kind == "cpu" else f"cuda:{index}"
