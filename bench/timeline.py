"""The timeline of a long trace: building its bands in one pass against one plain replay
of the same events (the least any figure of the trace costs), side by side, and what the
page carries.

    python bench/timeline.py [--events 1000000]

Events are decoded from gzip NDJSON chunks of 50,000, as the API stores them.
"""

import argparse
import gzip
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.figures import bands, html
from app.figures.service import timeline_chart
from app.traces import replay
from tests.results.trace_data import many_events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    rows = many_events(args.events // 2)
    chunks = [
        gzip.compress(b"".join(json.dumps(e).encode() + b"\n" for e in rows[i : i + 50_000]))
        for i in range(0, len(rows), 50_000)
    ]
    n = len(rows)
    del rows

    def events() -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            for line in gzip.decompress(chunk).splitlines():
                yield json.loads(line)

    started = time.perf_counter()
    for _ in events():
        pass
    decode = time.perf_counter() - started
    started = time.perf_counter()
    replay.find_peak(events())
    plain = time.perf_counter() - started
    started = time.perf_counter()
    built = bands.build(events(), total=n)
    banded = time.perf_counter() - started
    started = time.perf_counter()
    page = html.page(timeline_chart(built, "bench"))
    drawn = time.perf_counter() - started
    print(f"{n:,} events in {len(chunks)} chunks")
    print(f"decode alone          {decode:6.2f} s")
    print(f"one replay (peak)     {plain:6.2f} s")
    print(f"bands.build           {banded:6.2f} s   ratio to one replay {banded / plain:.2f}")
    print(f"chart + HTML          {drawn:6.3f} s")
    print(
        f"page {len(page) / 1024:.0f} KiB: {len(built.allocs)} bands, "
        f"{len(built.points)} points, {built.grouped:,} allocations grouped"
    )


if __name__ == "__main__":
    main()
