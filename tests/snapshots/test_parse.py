"""The parser alone, on the data the tests build: the timeline is reduced and keeps the
peak, whatever the trace's length."""

from pathlib import Path

from app.snapshots import parse, replay
from tests.snapshots.synthetic import training_snapshot


def test_the_timeline_is_reduced_and_keeps_the_peak(tmp_path: Path) -> None:
    snap = training_snapshot(iterations=500, layers=8)
    entries = len(snap["device_traces"][0])
    assert entries > 10 * replay.TIMELINE_POINTS
    summary = parse.convert(snap, tmp_path, 50_000, None)
    points = summary["timeline"]
    assert len(points["t_us"]) <= replay.TIMELINE_POINTS + 1
    assert max(points["allocated"]) == summary["memory"]["allocated_peak"]
    assert points["t_us"] == sorted(points["t_us"])
    assert sum(c["n_events"] for c in summary["chunks"]) == entries
