"""How long a model prediction takes on this machine (no GPU), per preset, warm.

The predictor runs in a warm child beside the API (app/experiments/predictor.py); this
times ``workers.models.predict.predict`` the same way, after one warm-up call, and
prints each preset's seconds beside the 2 s goal for an 8B-shaped model:

    python -m bench.predict_speed
"""

from __future__ import annotations

import statistics
import time

CASES = [
    {"model": "gpt2", "task": "train", "batch_size": 8, "seq_len": 1024},
    {"model": "llama-1b", "task": "train", "batch_size": 2, "seq_len": 1024, "precision": "bf16"},
    {"model": "llama-8b", "task": "train", "batch_size": 1, "seq_len": 2048, "precision": "bf16"},
    {
        "model": "llama-8b",
        "task": "train",
        "batch_size": 4,
        "seq_len": 4096,
        "precision": "bf16-autocast",
        "checkpointing": True,
    },
    {
        "model": "llama-8b",
        "task": "generate",
        "batch_size": 4,
        "seq_len": 1024,
        "new_tokens": 256,
        "precision": "bf16",
    },
    {
        "model": "mistral-7b",
        "task": "inference",
        "batch_size": 8,
        "seq_len": 2048,
        "precision": "bf16",
    },
]
GOAL_S = 2.0


def main() -> None:
    from workers.models.predict import predict

    predict(CASES[0], "cuda")  # imports and first-use costs, as the warm child has paid them
    print("| case | seconds (median of 3) | vs the 2 s goal |")
    print("| --- | --- | --- |")
    for case in CASES:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            predict(case, "cuda")
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        name = " ".join(f"{k}={v}" for k, v in case.items())
        print(f"| {name} | {median:.2f} | {median / GOAL_S:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
