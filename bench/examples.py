"""The README's examples and the classic questions' first cases, run through a live
vramlab service; prints measured against predicted bytes, and writes the results.

    python bench/examples.py [--device cuda] [--out results.json]
"""

import argparse
import json
from typing import Any

from service import run_to_end, running_service

MiB = 2**20


def cases(device: str) -> list[tuple[str, dict[str, Any]]]:
    add = {"op": "add", "shape": [1000, 1000], "dtype": "float32", "device": device}
    matmul = {
        "op": "matmul",
        "shape": [1000, 2000],
        "params": {"other_shape": [2000, 500]},
        "dtype": "float32",
        "device": device,
    }
    out = [("add 1000x1000 f32", add), ("matmul 1000x2000 @ 2000x500 f32", matmul)]
    if device.startswith("cuda"):
        big = [4096, 4096]
        out += [
            ("to cpu->cuda pageable 64 MiB", {"op": "to", "shape": big, "device": device}),
            (
                "to cpu->cuda pinned 64 MiB",
                {"op": "to", "shape": big, "device": device, "params": {"pin_memory": True}},
            ),
            (
                "to cuda->cpu 64 MiB",
                {"op": "to", "shape": big, "device": "cpu", "params": {"source_device": device}},
            ),
            ("bfloat16 matmul", {**matmul, "dtype": "bfloat16"}),
            ("int32 matmul", {**matmul, "dtype": "int32"}),
            (
                "empty 1 GiB, expandable segments",
                {
                    "op": "empty",
                    "shape": [2**28],
                    "device": device,
                    "allocator": {"expandable_segments": True},
                },
            ),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    with running_service(args.device) as client:
        for name, spec in cases(args.device):
            exp = run_to_end(client, spec)
            results.append({"case": name, **exp})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(
        f"{'case':<34} {'status':<24} {'delta':>12} {'predicted':>12} "
        f"{'peak MiB':>9} {'reserved MiB':>12} {'ms':>8}"
    )
    for r in results:
        res = r.get("result") or {}
        mem = res.get("memory") or {}
        status = (
            r["status"]
            if r["status"] == "succeeded"
            else f"{r['status']}:{(r.get('error') or {}).get('type')}"
        )
        timing = res.get("timing") or {}
        print(
            f"{r['case']:<34} {status:<24} {mem.get('delta_allocated', ''):>12} "
            f"{r['prediction']['delta_allocated']:>12} {mem.get('allocated_peak', 0) / MiB:>9.1f} "
            f"{mem.get('reserved_after', 0) / MiB:>12.1f} {1000 * timing.get('median_s', 0):>8.3f}"
        )
    for r in results:
        for note in (r.get("result") or {}).get("notes", []):
            print(f"- [{r['case']}] {note}")


if __name__ == "__main__":
    main()
