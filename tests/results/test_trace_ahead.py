"""The read-ahead under the memory_viz export: pieces in order, the reader's stop closes
the source in its thread, and the source's error reaches the reader."""

import threading
from collections.abc import Generator

import pytest

from app.traces import service as traces


def _source(n: int, log: list[str], fail_at: int | None = None) -> Generator[bytes, None, None]:
    try:
        for i in range(n):
            if i == fail_at:
                raise ValueError("stored chunk unreadable")
            yield b"%d\n" % i
    finally:
        log.append("closed")


def test_pieces_come_in_order() -> None:
    log: list[str] = []
    assert list(traces.ahead(_source(50, log), depth=2)) == [b"%d\n" % i for i in range(50)]
    assert log == ["closed"]


def test_a_reader_that_stops_early_closes_the_source_and_its_thread() -> None:
    log: list[str] = []
    before = threading.active_count()
    reader = traces.ahead(_source(1000, log), depth=2)
    assert next(reader) == b"0\n"
    reader.close()
    assert log == ["closed"]
    assert threading.active_count() == before


def test_the_sources_error_reaches_the_reader() -> None:
    log: list[str] = []
    reader = traces.ahead(_source(10, log, fail_at=3))
    assert [next(reader) for _ in range(3)] == [b"0\n", b"1\n", b"2\n"]
    with pytest.raises(ValueError, match="unreadable"):
        next(reader)
    assert log == ["closed"]
