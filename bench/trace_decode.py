"""Decoding stored trace lines, side by side: the standard library's json, orjson (when
installed; not a vramlab dependency) and msgspec decoding only the fields the memory_viz
export reads (what ``app.traces.viz_records`` does), on bench/trace_export.py's
synthetic trace.

    python bench/trace_decode.py [--events 1000000] [--repeat 3]

Prints each decoder's CPU seconds (the best of the repeats) for the whole trace, in
blocks of about 1 MiB of whole lines as the export reads them, and its time over
msgspec's.
"""

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from trace_export import synthetic

from app.traces import viz_records


def blocks(n_events: int, size: int = 2**20) -> list[bytes]:
    out: list[bytes] = []
    lines: list[bytes] = []
    length = 0
    for event in synthetic(n_events):
        lines.append(json.dumps(event, separators=(",", ":")).encode() + b"\n")
        length += len(lines[-1])
        if length >= size:
            out.append(b"".join(lines))
            lines, length = [], 0
    if lines:
        out.append(b"".join(lines))
    return out


def as_array(block: bytes) -> bytes:
    return b"[" + block[:-1].replace(b"\n", b",") + b"]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = blocks(args.events)
    decoders: dict[str, Callable[[bytes], Any]] = {
        "json (all fields, dicts)": lambda b: json.loads(as_array(b)),
    }
    try:
        import orjson

        decoders["orjson (all fields, dicts)"] = lambda b: orjson.loads(as_array(b))
    except ImportError:
        print("orjson is not installed: skipped")
    decoders["msgspec (7 fields, structs)"] = viz_records.DECODER.decode_lines
    best = dict.fromkeys(decoders, float("inf"))
    for _ in range(args.repeat):
        for name, decode in decoders.items():
            started = time.process_time()
            for block in data:
                decode(block)
            best[name] = min(best[name], time.process_time() - started)
    ours = best["msgspec (7 fields, structs)"]
    print(f"{args.events:,} events, {sum(map(len, data)) / 1e6:.1f} MB of NDJSON")
    for name, seconds in best.items():
        print(f"{name:<28} {seconds:6.2f} s CPU  {seconds / ours:5.2f}x msgspec's")


if __name__ == "__main__":
    main()
