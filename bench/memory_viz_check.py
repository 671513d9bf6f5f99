"""Check the memory_viz export against PyTorch's own viewer code on a GPU host: runs a
CUDA add and matmul through a live vramlab service, downloads each experiment's trace as
``format=memory_viz`` and feeds it to ``torch.cuda._memory_viz``; prints a short table.

    python bench/memory_viz_check.py [--device cuda] [--out DIR]

Exits non-zero when an export does not load, has no allocations, or disagrees with the
measured peak. ``--out DIR`` keeps each pickle and its trace_plot HTML (open the pickle in
https://pytorch.org/memory_viz, or the HTML in a browser with internet access).
"""

import argparse
import pickle
import sys
from pathlib import Path
from typing import Any

from service import run_to_end, running_service
from torch.cuda import _memory_viz

SPECS: list[tuple[str, dict[str, Any]]] = [
    ("add 1000x1000 f32", {"op": "add", "shape": [1000, 1000], "dtype": "float32"}),
    (
        "matmul 1000x2000 @ 2000x500 f32",
        {"op": "matmul", "shape": [1000, 2000], "params": {"other_shape": [2000, 500]}},
    ),
]


def check(snapshot: dict[str, Any], device_index: int) -> dict[str, Any]:
    """What torch's viewer code makes of the snapshot, and a replay of its trace."""
    trace = snapshot["device_traces"][device_index]
    live: dict[int, int] = {}
    allocated = peak = 0
    for entry in trace:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            allocated += entry["size"]
            peak = max(peak, allocated)
        elif entry["action"] == "free_completed":
            allocated -= live.pop(entry["addr"], 0)
    html = _memory_viz.trace_plot(snapshot)
    segments_html = _memory_viz.segment_plot(snapshot)
    summary = _memory_viz.segsum(snapshot)  # asserts that segments add up
    printed = _memory_viz.trace(snapshot)  # reads every entry's keys
    return {
        "entries": len(trace),
        "allocs": sum(e["action"] == "alloc" for e in trace),
        "segments": len(snapshot["segments"]),
        "replayed_peak": peak,
        "html_bytes": len(html) + len(segments_html),
        "summary": summary,
        "printed": printed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="a folder to keep pickles and HTML in")
    args = parser.parse_args()
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    index = int(args.device.partition(":")[2] or 0)
    failures = 0
    print(
        f"{'case':<32} {'status':<10} {'entries':>7} {'allocs':>6} {'segs':>4} "
        f"{'replayed peak':>13} {'measured peak':>13} {'viewer':>7}"
    )
    with running_service(args.device) as client:
        for name, spec in SPECS:
            exp = run_to_end(client, {**spec, "device": args.device, "trace": "stacks"})
            measured = ((exp.get("result") or {}).get("memory") or {}).get("allocated_peak")
            if exp["status"] != "succeeded":
                print(f"{name:<32} {exp['status']:<10} {exp.get('error')}")
                failures += 1
                continue
            response = client.get(
                f"/v1/experiments/{exp['id']}/trace", params={"format": "memory_viz"}
            )
            response.raise_for_status()
            snapshot = pickle.loads(response.content)
            try:
                got = check(snapshot, index)
                ok = got["allocs"] > 0 and got["replayed_peak"] > 0
                # The allocator's peak counts the same blocks the history records.
                ok = ok and measured is not None and got["replayed_peak"] <= measured
            except Exception as exc:  # the point is to report what torch's code rejected
                print(f"{name:<32} viewer code failed: {exc!r}")
                failures += 1
                continue
            failures += not ok
            print(
                f"{name:<32} {exp['status']:<10} {got['entries']:>7} {got['allocs']:>6} "
                f"{got['segments']:>4} {got['replayed_peak']:>13} {measured!s:>13} "
                f"{'ok' if ok else 'FAIL':>7}"
            )
            if out:
                stem = name.split()[0]
                (out / f"{stem}.pickle").write_bytes(response.content)
                (out / f"{stem}.html").write_text(_memory_viz.trace_plot(snapshot))
                (out / f"{stem}.segsum.txt").write_text(got["summary"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
