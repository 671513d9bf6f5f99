"""What the summary says beyond the replay: blocks as the API shows them, the categories
of the blocks alive at the peak with their evidence, PyTorch's own counters, and plain
JSON of what the recorder saved beside the trace."""

import json
from bisect import bisect_left
from typing import Any

from app.snapshots import categories as cat
from app.snapshots import phases as ph
from app.snapshots.load import frames_json
from app.snapshots.recorded import REASONS, RECORDED, RULES, Recorded
from app.snapshots.walk import Walk
from vramlab.contract import Figure

TOP = 20
MAX_REASONS = 10


def block_out(
    seq: int,
    addr: Any,
    size: int,
    t_us: float,
    frames: Any,
    category: str,
    reason: str = "",
    recorded: bool = False,
) -> dict[str, Any]:
    return {
        "addr": addr,
        "size": size,
        "seq": seq,
        "t_us": t_us,
        "phase": None,
        "frames": [json.loads(f) for f in frames_json(frames)],
        "category": category,
        "reason": reason,
        "recorded": recorded,
    }


def categorise(
    walk: Walk, recorded: Recorded | None = None, phases: ph.Bound | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The categories of the blocks alive at the peak (``walk``: a finished
    ``app.snapshots.walk.Walk``), with the evidence, and the largest of those blocks.
    ``recorded``: what the program recorded of its parameters, gradients and optimizer
    state; where present, those three categories are exactly what it recorded.
    ``phases``: the program's recorded phases, which decide the rest of the blocks made
    in the trace (but library workspaces, which keep the evidence that names them)."""
    by_category: dict[str, list[int]] = {c: [0, 0] for c in cat.CATEGORIES}
    by_reason: dict[tuple[str, str], list[int]] = {}
    seen: dict[str, list[int]] = {c: [0, 0] for c in cat.CATEGORIES}  # recorded bytes, blocks
    blocks_out: list[tuple[int, int, Any, float, Any, str, str, bool]] = []
    at_end = walk.end()
    stacks = walk.stacks.frames
    for baddr, (size, bseq, where, sid, bt, _) in walk.alive.items():
        frames = stacks[sid]
        fate = walk.fates.get(bseq, at_end)
        pre = bseq < walk.offset
        found = None
        if recorded is not None:
            found = recorded.category(baddr, size, None if pre else bt, walk.freed_t.get(bseq))
        if found is not None:
            name, reason = found, REASONS[found]
            seen[name][0] += size
            seen[name][1] += 1
        else:
            name, reason = cat.decide(
                where,
                bseq,
                size,
                pre,
                fate,
                bseq in walk.after_workspace,
                bseq in walk.after_output,
                walk.oom_after(bseq) if walk.oom_clocks else None,
            )
            phase = None
            # Library workspaces keep their evidence; parameters, gradients and optimizer
            # state by inference give way only to what the program recorded of them.
            if (
                phases is not None
                and not pre
                and cat.workspace(
                    where, size, fate, bseq in walk.after_workspace, bseq in walk.after_output
                )
                is None
                and (recorded is not None or name not in RECORDED)
            ):
                phase = phases.at(bisect_left(walk.alloc_seqs, bseq))
            if phase is not None:
                name, reason = phase
                seen[name][0] += size
                seen[name][1] += 1
                found = name
            elif recorded is not None and name in RECORDED:
                reason = (
                    f"{reason}: but no {name.replace('_', ' ')} of the program's lived here "
                    "(vramlab record looked)"
                )
                name = cat.OTH
        by_category[name][0] += size
        by_category[name][1] += 1
        counts = by_reason.setdefault((name, reason), [0, 0])
        counts[0] += size
        counts[1] += 1
        blocks_out.append((size, bseq, baddr, bt, frames, name, reason, found is not None))
    blocks_out.sort(key=lambda b: (-b[0], b[1]))
    top_alive = [block_out(q, a, s, t, f, c, r, k) for s, q, a, t, f, c, r, k in blocks_out[:TOP]]
    rows = []
    for c in cat.CATEGORIES:
        exact = recorded is not None and c in RECORDED
        phased = phases is not None and c in ph.PHASED
        rule = RULES[c] if exact else ph.RULES[c] if phased else cat.RULES[c]
        if phased:
            exact = seen[c][0] == by_category[c][0]  # no block of it was inferred
        rows.append(
            {
                "category": c,
                "bytes": by_category[c][0],
                "blocks": by_category[c][1],
                "rule": rule,
                "inference": not exact,
                "recorded_bytes": seen[c][0],
                "reasons": reasons(by_reason, c),
            }
        )
    return rows, top_alive


def reasons(by_reason: dict[tuple[str, str], list[int]], category: str) -> list[dict[str, Any]]:
    """The evidence that put blocks in ``category``, most bytes first."""
    rows: list[dict[str, Any]] = [
        {"reason": reason, "bytes": n[0], "blocks": n[1]}
        for (c, reason), n in by_reason.items()
        if c == category
    ]
    rows.sort(key=lambda r: (-r["bytes"], r["reason"]))
    return rows[:MAX_REASONS]


def counters(stats: Any, index: int) -> dict[str, int] | None:
    """PyTorch's own counters, where the recorder saved ``torch.cuda.memory_stats()``."""
    if type(stats) is list:
        stats = stats[index] if index < len(stats) else None
    if type(stats) is not dict:
        return None
    names = {
        "allocated_bytes.all.peak": Figure.ALLOCATED_PEAK.value,
        "allocated_bytes.all.current": "allocated_current",
        "reserved_bytes.all.peak": Figure.RESERVED_PEAK.value,
        "reserved_bytes.all.current": "reserved_current",
        "num_ooms": "num_ooms",
        "num_alloc_retries": "num_alloc_retries",
    }
    return {ours: stats[theirs] for theirs, ours in names.items() if type(stats.get(theirs)) is int}


def plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def plain_dict(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        return {}
    text = json.dumps(value, default=plain)
    if len(text) > 64_000:
        return {"note": "too large to keep"}
    out: dict[str, Any] = json.loads(text)
    return out
