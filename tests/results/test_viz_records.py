"""Which blocks of stored lines the memory_viz export writes as records, and which it
leaves to the general path (that both give the same snapshot is test_exports')."""

import json
from typing import Any

import pytest

from app.traces import viz_records
from tests.results.trace_data import events, many_events


def _plain() -> list[dict[str, Any]]:
    """The small CUDA trace without its frames."""
    return [{k: v for k, v in e.items() if k != "frames"} for e in events()]


def _block(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in rows)


def test_plain_cuda_and_cpu_traces_take_the_records_path() -> None:
    for rows in (_plain(), many_events(50)):
        columns = viz_records.decode(_block(rows))
        assert columns is not None and len(columns.code) == len(rows)


@pytest.mark.parametrize(
    "change",
    [
        {"frames": [{"filename": "x.py", "line": 1, "name": "f"}]},
        {"pre_trace": True},
        {"size": 4096.0},
        {"stream": "0"},
        {"action": "mystery"},
        {"action": "free", "addr": None},
        {"addr": 2**64},
        {"t_us": 2.0**60},
    ],
)
def test_other_blocks_go_the_general_way(change: dict[str, Any]) -> None:
    rows = _plain()
    assert viz_records.decode(_block(rows)) is not None
    rows[5] = {**rows[5], **change}
    assert viz_records.decode(_block(rows)) is None
