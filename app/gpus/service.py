"""The GPU catalog as clients see it: the catalog's cards and live workers' own GPUs, and
a loose name resolved to one of them."""

from datetime import datetime

from app.core.db import Reader
from app.gpus.cards import Card, cards, find, from_worker, normalised
from app.gpus.schemas import GpuOut
from app.queue import live_workers


def worker_cards(session: Reader, now: datetime, live_seconds: float) -> tuple[Card, ...]:
    """Each distinct GPU (name and memory) of the live workers."""
    seen: dict[tuple[str, int], Card] = {}
    for caps in live_workers.capabilities(session, now, live_seconds):
        for gpu in caps.get("gpus") or []:
            name, total = str(gpu.get("name", "")), int(gpu.get("total_memory") or 0)
            if name and total > 0 and (name, total) not in seen:
                seen[(name, total)] = from_worker(name, total)
    return tuple(seen.values())


def listing(session: Reader, now: datetime, live_seconds: float) -> list[Card]:
    return [*cards(), *worker_cards(session, now, live_seconds)]


def resolve(name: str, live: tuple[Card, ...]) -> Card | None:
    """A loose name: a live worker's GPU named exactly as given first (its own total),
    then the catalog, then any live worker's GPU whose name holds it."""
    wanted = normalised(name)
    for card in live:
        if normalised(card.name) == wanted:
            return card
    found = find(name)
    if found is not None:
        return found
    return next((c for c in live if wanted and wanted in normalised(c.name)), None)


def to_out(card: Card) -> GpuOut:
    return GpuOut(
        name=card.name,
        aliases=list(card.aliases),
        architecture=card.architecture,
        compute_capability=card.compute_capability,
        total_bytes=card.total_bytes,
        usable_bytes=card.usable_bytes,
        overhead_bytes=card.overhead_bytes,
        usable_source=card.usable_source,  # type: ignore[arg-type]
        source=card.source,
        bf16=card.bf16,
        flash_attention=card.flash_attention,
        cublas_workspace_bytes=card.cublas_workspace_bytes,
        marketing_bytes=card.marketing_bytes,
        from_worker=card.from_worker,
    )
