"""CPU seconds per warm prediction, traced fresh against answered from the family's traces.

    python bench/predict_families.py [--batches 12] [--seq-len 128]

A predictor child answers a family's other batch sizes (the spec but for its batch size)
from its traces at three (workers/models/families.py). This answers GPT-2 small (CUDA,
batch 1 to N, seq 128) as issue 31's benign submitter asks it, in one process after a
warm-up: each batch traced fresh (the family forgotten before each), then all of them in
a row as a child sees them. Printed: each answer's process CPU seconds (less sensitive to
the machine's load than the wall clock) side by side, the totals and their ratio, and
whether each answer is the fresh one.
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.models.predict import FAMILIES, WARM_UP, answer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    answer({"params": WARM_UP, "device": "cuda"})

    def ask(batch: int) -> tuple[float, dict[str, object]]:
        params = {"model": "gpt2", "batch_size": batch, "seq_len": args.seq_len}
        started = time.process_time()
        out = answer({"params": params, "device": "cuda"})
        took = time.process_time() - started
        out.pop("seconds", None)
        return took, out

    batches = range(1, args.batches + 1)
    fresh = {}
    for b in batches:
        FAMILIES.clear()
        fresh[b] = ask(b)
    FAMILIES.clear()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")
    print("| batch | fresh CPU s | in a row CPU s | ratio | same answer |")
    print("| --- | --- | --- | --- | --- |")
    total_fresh = total_row = 0.0
    for b in batches:
        took, out = ask(b)
        total_fresh += fresh[b][0]
        total_row += took
        same = out == fresh[b][1]
        print(f"| {b} | {fresh[b][0]:.3f} | {took:.3f} | {fresh[b][0] / took:.1f}x | {same} |")
    print(
        f"| all | {total_fresh:.2f} | {total_row:.2f} | {total_fresh / total_row:.1f}x | "
        f"({FAMILIES.reused} traces reused) |"
    )


if __name__ == "__main__":
    main()
