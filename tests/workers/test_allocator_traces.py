"""The caching-allocator model against real allocators: each recorded memory snapshot
whose trace starts from an empty allocator is replayed through the model, which must ask
for, release and map the same segments in the same order, reach the same reserved peak,
and put every allocation at the address the real allocator did (given where the driver
placed each segment)."""

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from app.snapshots.safe_pickle import load
from workers.models.trace_replay import compare

DATA = Path(__file__).parents[1] / "snapshots" / "data"
GiB = 2**30
# bench/category_loops.py's OOM fixture capped its allocator at 768 MiB (a fraction).
FRACTION_LIMITS = {"fixtures/oom.recorded.pickle.gz": 768 * 2**20}
# Recorded by bench/record_allocator_traces.py, which writes what the replay needs
# (the memory fraction, the card's memory) beside the trace.
RECORDINGS = sorted((DATA / "allocator").glob("*.pickle.gz"))
TRACES = [
    # ring.pickle.gz is a ring buffer that starts mid-run: nothing to replay from.
    *(DATA / name for name in ("train_all.pickle.gz", "train_python.pickle.gz", "oom.pickle.gz")),
    *sorted((DATA / "recorded").glob("*.pickle.gz")),
    *sorted((DATA / "fixtures").glob("*.recorded.pickle.gz")),
    *RECORDINGS,
]


def snapshot(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        data = load(f)
    assert isinstance(data, dict)
    return data


def limits(path: Path, data: dict[str, Any]) -> tuple[int | None, int]:
    """The recording's memory fraction (bytes) and its card's memory."""
    recording = data.get("vramlab_recording") or {}
    environment = data.get("environment") or {}
    total = recording.get("device_total") or environment.get("gpu_total_memory")
    if total is None:  # the oldest fixtures name their card (an H100 80 GB) beside them
        names = {e["gpu"] for e in json.loads((DATA / "expected.json").read_text())}
        assert names == {"NVIDIA H100 80GB HBM3"}
        total = 80 * GiB
    fraction = recording.get("fraction_limit") or FRACTION_LIMITS.get(str(path.relative_to(DATA)))
    return fraction, int(total)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: str(p.relative_to(DATA)))
def test_replaying_a_recorded_trace_reserves_what_the_real_allocator_did(path: Path) -> None:
    data = snapshot(path)
    fraction, total = limits(path, data)
    replayed = compare(data, fraction_limit=fraction, device_limit=total)
    assert replayed.allocs > 0
    assert not replayed.unexpected_oom, replayed.notes
    assert replayed.segments_match, (
        replayed.first_divergence,
        replayed.recorded_segments[: (replayed.first_divergence or 0) + 3],
        replayed.model_segments[: (replayed.first_divergence or 0) + 3],
    )
    assert replayed.model_peak_reserved == replayed.recorded_peak_reserved
    assert replayed.misplaced == 0
    assert replayed.ooms_matched == replayed.ooms_expected
    stats = data.get("memory_stats")
    stats = stats[0] if isinstance(stats, list) else stats
    if isinstance(stats, dict) and "reserved_bytes.all.peak" in stats:
        assert replayed.model_peak_reserved == stats["reserved_bytes.all.peak"]
        assert replayed.model_peak_allocated == stats["allocated_bytes.all.peak"]


def test_the_h100_recordings_cover_the_settings_that_change_reserved() -> None:
    """At least five H100 recordings, among them expandable segments and a
    max_split_size (bench/record_allocator_traces.py on the GPU host)."""
    if not RECORDINGS:
        pytest.skip("no H100 recordings yet: run bench/record_allocator_traces.py")
    recordings = [snapshot(p)["vramlab_recording"] for p in RECORDINGS]
    h100 = [r for r in recordings if "H100" in r["gpu"]]
    assert len(h100) >= 5
    conf = " ".join(r.get("conf") or "" for r in h100)
    assert "expandable_segments:True" in conf and "max_split_size_mb" in conf
