"""What the allocator held at the end of a snapshot: reserved against allocated, the
largest free block, fragmentation, per segment."""

from typing import Any

TOP_SEGMENTS = 20


def _size(value: Any) -> int:
    return int(value) if type(value) is int else 0


def summarise_segments(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the segments and the largest ones.

    ``fragmentation`` is 1 - (largest free block / all free bytes): 0 when the free memory
    is one block (any request up to it fits), near 1 when it is scattered in small pieces.
    """
    rows: list[dict[str, Any]] = []
    reserved = allocated = free_total = largest_free = 0
    by_type: dict[str, int] = {}
    for s in segments:
        total = _size(s.get("total_size"))
        used = 0
        seg_free = seg_largest = n_blocks = 0
        for b in s.get("blocks") or ():
            if type(b) is not dict:
                continue
            n_blocks += 1
            size = _size(b.get("size"))
            if str(b.get("state", "")).startswith("active"):
                used += size
            else:
                seg_free += size
                seg_largest = max(seg_largest, size)
        if not s.get("blocks"):
            used = _size(s.get("allocated_size"))
            seg_free = max(0, total - used)
            seg_largest = seg_free
        reserved += total
        allocated += used
        free_total += seg_free
        largest_free = max(largest_free, seg_largest)
        kind = str(s.get("segment_type") or "unknown")
        by_type[kind] = by_type.get(kind, 0) + total
        rows.append(
            {
                "address": s.get("address") if type(s.get("address")) is int else None,
                "total_size": total,
                "allocated": used,
                "free": seg_free,
                "largest_free_block": seg_largest,
                "blocks": n_blocks,
                "segment_type": kind,
                "stream": s.get("stream") if type(s.get("stream")) is int else None,
                "is_expandable": bool(s.get("is_expandable")),
            }
        )
    rows.sort(key=lambda r: -r["total_size"])
    return {
        "count": len(segments),
        "reserved": reserved,
        "allocated": allocated,
        "free": free_total,
        "largest_free_block": largest_free,
        "fragmentation": round(1 - largest_free / free_total, 4) if free_total else 0.0,
        "reserved_by_type": by_type,
        "largest": rows[:TOP_SEGMENTS],
    }
