"""Record real CUDA caching-allocator traces, as fixtures for the allocator model.

Each case runs in a fresh interpreter, so that its trace starts from an empty allocator
and PYTORCH_CUDA_ALLOC_CONF is read as CUDA starts: the allocation history is recorded
from before the first CUDA allocation, then the worker's build and two training steps
run (workers/models/build.py and steps.py, as a model experiment runs them), under a
memory fraction where the case sets one. The snapshot, stripped of stack frames (none
are recorded), with the allocator's counters and what the replay needs beside it
(``vramlab_recording``), is written gzip'd to OUT/allocator/<case>.pickle.gz, a few
hundred KB at most: the fixtures tests/workers/test_allocator_traces.py replays.

Prints, per case: the reserved peak recorded, the model's replay of the trace (same
segments in the same order, same peak), and the reserved peak predicted from fake
tensors (workers/models/predict.py, no device) with the same settings. On a CUDA host:

    python -m bench.record_allocator_traces --out "$OUT"
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GiB = 2**30
MAX_ENTRIES = 1_000_000
GPT2 = {"model": "gpt2", "seq_len": 1024}
# name -> the model spec's params, its allocator settings (PYTORCH_CUDA_ALLOC_CONF), and
# an emulated card (a memory fraction, in bytes) where one is set.
CASES: dict[str, dict[str, Any]] = {
    "gpt2-fp32": {"params": {**GPT2, "batch_size": 4}},
    "gpt2-bf16-autocast": {"params": {**GPT2, "batch_size": 4, "precision": "bf16-autocast"}},
    "gpt2-checkpointing": {"params": {**GPT2, "batch_size": 8, "checkpointing": True}},
    "bert-base": {"params": {"model": "bert-base", "batch_size": 16, "seq_len": 512}},
    "vit-base": {"params": {"model": "vit-base", "batch_size": 32}},
    "llama-1b-bf16": {
        "params": {"model": "llama-1b", "batch_size": 2, "seq_len": 1024, "precision": "bf16"}
    },
    "gpt2-expandable": {
        "params": {**GPT2, "batch_size": 4},
        "allocator": {"expandable_segments": True},
    },
    "gpt2-max-split": {"params": {**GPT2, "batch_size": 4}, "allocator": {"max_split_size_mb": 64}},
    # A card too small for the cache the step would keep: released and retried.
    "gpt2-capped": {"params": {**GPT2, "batch_size": 8}, "capacity": 15 * GiB},
    "gpt2-expandable-capped": {
        "params": {**GPT2, "batch_size": 8},
        "allocator": {"expandable_segments": True},
        "capacity": 15 * GiB,
    },
    "gpt2-gc": {
        "params": {**GPT2, "batch_size": 8},
        "allocator": {"garbage_collection_threshold": 0.6},
        "capacity": 16 * GiB,
    },
    # One that cannot fit: its last segments released, then out of memory.
    "gpt2-oom": {"params": {**GPT2, "batch_size": 8}, "capacity": 12 * GiB},
}


def conf_of(allocator: dict[str, Any]) -> str:
    return ",".join(
        f"{k}:{('True' if v else 'False') if isinstance(v, bool) else v}"
        for k, v in allocator.items()
    )


def record(case: str, out: Path) -> None:
    """In a fresh interpreter whose PYTORCH_CUDA_ALLOC_CONF the parent set."""
    import torch

    from workers.models.build import build
    from workers.models.steps import run_step

    spec = CASES[case]
    device = torch.device("cuda", 0)
    torch.cuda.init()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction_limit = None
    if spec.get("capacity"):
        fraction = spec["capacity"] / total
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        fraction_limit = int(fraction * total)  # as the allocator computes its maximum
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, context=None)
    oom = False
    try:
        built = build(dict(spec["params"]), device)
        for _ in range(2):
            run_step(built)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        oom = True
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    for trace in snapshot["device_traces"]:
        for entry in trace:
            entry.pop("frames", None)
            if entry.get("compile_context") == "N/A":
                del entry["compile_context"]
            if entry.get("user_metadata") == "":
                del entry["user_metadata"]
    for segment in snapshot["segments"]:
        segment.pop("frames", None)
        for block in segment.get("blocks", []):
            block.pop("frames", None)
    # Plain data only (no OrderedDict, no TorchVersion): fixtures load with a loader that
    # resolves no classes (app/snapshots/safe_pickle.py).
    stats = {str(k): v for k, v in torch.cuda.memory_stats(device).items()}
    snapshot["memory_stats"] = [stats]
    name = str(torch.cuda.get_device_name(device))
    version = str(torch.__version__)
    snapshot["environment"] = {"torch": version, "gpu_name": name, "gpu_total_memory": total}
    snapshot["vramlab_recording"] = {
        "case": case,
        "gpu": name,
        "torch": version,
        "device_total": total,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "allocator": spec.get("allocator", {}),
        "params": spec["params"],
        "fraction_limit": fraction_limit,
        "oom": oom,
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "entries": len(snapshot["device_traces"][0]),
        "truncated": len(snapshot["device_traces"][0]) >= MAX_ENTRIES,
    }
    target = out / "allocator" / f"{case}.pickle.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(target, "wb", compresslevel=9) as f:
        pickle.dump(snapshot, f, protocol=4)


def check(path: Path) -> dict[str, Any]:
    """The recording against the model's replay of it and the fake-tensor prediction."""
    from app.snapshots.safe_pickle import load
    from workers.models.predict import predict
    from workers.models.trace_replay import compare

    with gzip.open(path) as f:
        data = load(f)
    rec = data["vramlab_recording"]
    replayed = compare(data, fraction_limit=rec["fraction_limit"], device_limit=rec["device_total"])
    params = dict(rec["params"])
    if rec["fraction_limit"]:
        params["capacity_bytes"] = rec["fraction_limit"]
    started = time.perf_counter()
    predicted = predict(params, "cuda", rec["allocator"])
    return {
        "case": rec["case"],
        "kb": path.stat().st_size // 1024,
        "entries": rec["entries"],
        "oom": rec["oom"],
        "recorded_reserved": rec["peak_reserved"],
        "replayed_reserved": replayed.model_peak_reserved,
        "segments_match": replayed.segments_match,
        "misplaced": replayed.misplaced,
        "predicted_reserved": predicted["peak_reserved"],
        "recorded_allocated": rec["peak_allocated"],
        "predicted_allocated": predicted["peak_allocated"],
        "predict_s": round(time.perf_counter() - started, 2),
        "notes": replayed.notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        record(args.child, args.out)
        return
    rows = []
    for case in args.case or list(CASES):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf_of(CASES[case].get("allocator", {}))}
        started = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.record_allocator_traces",
                "--child",
                case,
                "--out",
                str(args.out),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"{case}: failed\n{done.stderr[-3000:]}", flush=True)
            continue
        row = check(args.out / "allocator" / f"{case}.pickle.gz")
        row["record_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "allocator_traces.json").write_text(json.dumps(rows, indent=1))
    print()
    print(
        "| case | KB | entries | OOM | recorded reserved GiB | replayed | segments | "
        "predicted reserved GiB | error | predicted allocated error |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        error = (r["predicted_reserved"] - r["recorded_reserved"]) / r["recorded_reserved"]
        alloc_error = (r["predicted_allocated"] - r["recorded_allocated"]) / r["recorded_allocated"]
        print(
            f"| {r['case']} | {r['kb']} | {r['entries']} | {r['oom']} | "
            f"{r['recorded_reserved'] / GiB:.3f} | {r['replayed_reserved'] / GiB:.3f} | "
            f"{'same' if r['segments_match'] else 'DIFFER'} | "
            f"{r['predicted_reserved'] / GiB:.3f} | {error:+.2%} | {alloc_error:+.2%} |"
        )


if __name__ == "__main__":
    main()
