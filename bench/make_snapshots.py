"""Make the small real snapshots that tests/snapshots/data holds, on a GPU host.

    python bench/make_snapshots.py --out tests/snapshots/data

Each case runs in a fresh process (an empty caching allocator), records PyTorch's
allocation history around ``bench/record_example.py``'s training loop, and writes
``<case>.pickle.gz`` (PyTorch's own snapshot, gzipped) and a line of ``expected.json``
with PyTorch's counters, which the tests compare with what vramlab replays.

- ``train_all``: stacks "all" (Python and C++ frames), context "all";
- ``train_python``: Python frames only;
- ``oom``: an allocation no GPU can satisfy, caught; the trace holds the OOM entry;
- ``ring``: ``max_entries=300``, so the oldest entries are dropped (blocks from before
  the trace's start).
"""

import argparse
import contextlib
import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

CASES = {
    "train_all": {"stacks": "all", "max_entries": None, "oom": False},
    "train_python": {"stacks": "python", "max_entries": None, "oom": False},
    "oom": {"stacks": "python", "max_entries": None, "oom": True},
    "ring": {"stacks": "python", "max_entries": 300, "oom": False},
}


def scrub(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Drop the host's paths from the frames (in place, so shared frames stay shared):
    ``.../site-packages/torch/...`` becomes ``site-packages/torch/...``, this repository's
    files become relative."""
    root = str(Path(__file__).resolve().parent.parent) + "/"
    seen: set[int] = set()

    def fix(frames: Any) -> None:
        for frame in frames or ():
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            name = frame.get("filename", "")
            if "site-packages/" in name:
                name = "site-packages/" + name.split("site-packages/", 1)[1]
            frame["filename"] = name.replace(root, "")

    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            fix(entry.get("frames"))
    for segment in snapshot.get("segments", []):
        fix(segment.get("frames"))
        for block in segment.get("blocks", []):
            fix(block.get("frames"))
    return snapshot


def one(case: str, out: Path) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import record_example

    opts = CASES[case]
    kwargs: dict[str, Any] = {"enabled": "all", "context": "all", "stacks": opts["stacks"]}
    if opts["max_entries"]:
        kwargs["max_entries"] = opts["max_entries"]
    torch.cuda.memory._record_memory_history(**kwargs)
    sys.argv = ["record_example.py", "--width", "256", "--batch", "64"]
    if opts["oom"]:
        sys.argv.append("--oom")
    with contextlib.suppress(torch.OutOfMemoryError):
        record_example.main()
    snapshot = torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    torch.cuda.memory._record_memory_history(enabled=None)
    data = pickle.dumps(scrub(snapshot), protocol=4)
    (out / f"{case}.pickle.gz").write_bytes(gzip.compress(data, mtime=0))
    return {
        "case": case,
        "pickle_bytes": len(data),
        "entries": len(snapshot["device_traces"][0]),
        "allocated_peak": stats["allocated_bytes.all.peak"],
        "allocated_current": stats["allocated_bytes.all.current"],
        "reserved_peak": stats["reserved_bytes.all.peak"],
        "num_ooms": stats["num_ooms"],
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", choices=sorted(CASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.case:
        print(json.dumps(one(args.case, args.out)))
        return 0
    rows = []
    for case in CASES:
        done = subprocess.run(
            [sys.executable, __file__, "--out", str(args.out), "--case", case],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    (args.out / "expected.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'case':<14} {'entries':>8} {'pickle':>10} {'peak alloc':>12} {'ooms':>4}")
    for r in rows:
        print(
            f"{r['case']:<14} {r['entries']:>8} {r['pickle_bytes']:>10} "
            f"{r['allocated_peak']:>12} {r['num_ooms']:>4}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
