"""The GPU catalog: the CUDA cards teams use, as data (cards.json), and loose names.

Each card has its total memory, the memory a PyTorch process can give its caching
allocator (``usable_bytes``: total less the CUDA context, what the driver keeps and
cuBLAS's handles; measured with ``python -m bench.usable_memory`` where it says so, else
its architecture's estimate), and the facts that change bytes: compute capability (bf16
and FlashAttention need sm80+) and cuBLAS's workspace per handle.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("cards.json")
# Words that name no particular card: "NVIDIA GeForce RTX 4090" is "rtx 4090".
_NOISE = ("nvidia", "geforce", "tesla", "gpu")


@dataclass(frozen=True)
class Card:
    name: str
    aliases: tuple[str, ...]
    architecture: str
    compute_capability: str
    total_bytes: int
    usable_bytes: int
    overhead_bytes: int
    usable_source: str  # "measured", "placeholder" or "estimate"
    source: str
    cublas_workspace_bytes: int
    marketing_bytes: int | None = None
    from_worker: bool = False

    @property
    def sm(self) -> int:
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)

    @property
    def bf16(self) -> bool:
        return self.sm >= 80

    @property
    def flash_attention(self) -> bool:
        return self.sm >= 80


def normalised(name: str) -> str:
    """Lower case, words only, vendor words dropped: ``NVIDIA H100 80GB HBM3`` is
    ``h100 80gb hbm3``."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    return " ".join(w for w in words if w and w not in _NOISE)


def _card(raw: dict[str, Any], arch: dict[str, Any]) -> Card:
    total = int(raw["total_bytes"])
    usable = raw.get("usable_bytes")
    overhead = total - int(usable) if usable is not None else int(arch["overhead_estimate_bytes"])
    source = raw["source"]
    if usable is None:
        source = f"{source}; usable: the {raw['architecture']} estimate ({arch['source']})"
    return Card(
        name=raw["name"],
        aliases=tuple(raw.get("aliases", ())),
        architecture=raw["architecture"],
        compute_capability=raw["compute_capability"],
        total_bytes=total,
        usable_bytes=total - overhead,
        overhead_bytes=overhead,
        usable_source=raw["usable_source"] if usable is None else "measured",
        source=source,
        cublas_workspace_bytes=int(arch["cublas_workspace_bytes"]),
        marketing_bytes=raw.get("marketing_bytes"),
    )


@cache
def cards() -> tuple[Card, ...]:
    data = json.loads(DATA.read_text())
    archs = data["architectures"]
    return tuple(_card(raw, archs[raw["architecture"]]) for raw in data["cards"])


def _keys(card: Card) -> list[str]:
    return [normalised(card.name), *(normalised(a) for a in card.aliases)]


def find(name: str, extra: tuple[Card, ...] = ()) -> Card | None:
    """The card a loose name means: an exact name or alias first (``4090``, ``h100``,
    ``H100 80GB``), then the only card whose name or aliases hold every word given,
    then the first catalog card among several (so ``a100 80`` finds the 80 GB one)."""
    wanted = normalised(name)
    if not wanted:
        return None
    pool = (*cards(), *extra)
    for card in pool:
        if wanted in _keys(card):
            return card
    words = wanted.split()
    matching = [
        c for c in pool if any(all(w in key.split() or w in key for w in words) for key in _keys(c))
    ]
    return matching[0] if matching else None


def from_worker(name: str, total: int) -> Card:
    """A live worker's GPU: its own total memory; the rest from the catalog card its name
    resolves to (or the Hopper estimate where none does)."""
    known = find(name)
    data = json.loads(DATA.read_text())
    arch_name = known.architecture if known is not None else "hopper"
    arch = data["architectures"][arch_name]
    overhead = known.overhead_bytes if known is not None else int(arch["overhead_estimate_bytes"])
    return Card(
        name=name,
        aliases=(),
        architecture=arch_name,
        compute_capability=known.compute_capability if known is not None else "9.0",
        total_bytes=total,
        usable_bytes=max(0, total - overhead),
        overhead_bytes=overhead,
        usable_source=known.usable_source if known is not None else "estimate",
        source="a live worker's GPU: total as its worker reports it; "
        + (
            f"overhead as the catalog's {known.name}"
            if known is not None
            else "an unknown card: overhead and architecture assumed as an H100's"
        ),
        cublas_workspace_bytes=int(arch["cublas_workspace_bytes"]),
        from_worker=True,
    )
