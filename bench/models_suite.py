"""The model suite: predicted against measured step peaks, and against plain PyTorch.

For each case, the prediction (workers/models/predict.py, fake tensors, no device), the
measurement (the worker's child running the spec on cuda:0, in a fresh process), and
for the training cases of ``REFERENCE`` the same step in plain PyTorch in a fresh
process (bench/model_reference.py). Prints one table: predicted, measured, error, what a
weightsx4 (training) or weightsx1 (inference) estimate would have said, and the checks
against plain PyTorch. Run on a CUDA host from the checkout:

    python -m bench.models_suite            # the whole suite
    python -m bench.models_suite measure '{...params}'   # one case (used internally)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

GiB = 2**30
SUITE: list[dict[str, Any]] = [
    {"model": "gpt2", "task": "train", "batch_size": 8, "seq_len": 1024},
    {"model": "gpt2", "task": "train", "batch_size": 8, "seq_len": 1024, "checkpointing": True},
    {
        "model": "gpt2",
        "task": "train",
        "batch_size": 8,
        "seq_len": 1024,
        "precision": "bf16-autocast",
    },
    {
        "model": "gpt2",
        "task": "train",
        "batch_size": 8,
        "seq_len": 1024,
        "precision": "fp16-autocast",
    },
    {
        "model": "gpt2",
        "task": "train",
        "batch_size": 8,
        "seq_len": 1024,
        "micro_batches": 2,
        "optimizer": "sgd-momentum",
    },
    {
        "model": "gpt2-medium",
        "task": "train",
        "batch_size": 4,
        "seq_len": 1024,
        "precision": "bf16",
    },
    {"model": "bert-base", "task": "train", "batch_size": 32, "seq_len": 512},
    {"model": "t5-base", "task": "train", "batch_size": 8, "seq_len": 512},
    {
        "model": "llama-1b",
        "task": "train",
        "batch_size": 2,
        "seq_len": 1024,
        "precision": "bf16",
        "checkpointing": True,
    },
    {"model": "vit-base", "task": "train", "batch_size": 64},
    {"model": "vit-base", "task": "train", "batch_size": 64, "precision": "bf16-autocast"},
    {"model": "resnet-50", "task": "train", "batch_size": 64},
    {"model": "gpt2", "task": "inference", "batch_size": 16, "seq_len": 1024},
    {
        "model": "llama-1b",
        "task": "generate",
        "batch_size": 8,
        "seq_len": 512,
        "new_tokens": 64,
        "precision": "bf16",
    },
    {
        "model": "llama-8b",
        "task": "inference",
        "batch_size": 1,
        "seq_len": 2048,
        "precision": "bf16",
    },
    {
        "model": "mistral-7b",
        "task": "generate",
        "batch_size": 4,
        "seq_len": 1024,
        "new_tokens": 32,
        "precision": "bf16",
    },
    {
        "model": "bert-base",
        "task": "train",
        "batch_size": 32,
        "seq_len": 512,
        "optimizer": "adam",
        "optimizer_impl": "fused",
    },
]
REFERENCE = {0, 7}  # cases also run in plain PyTorch (default AdamW, no knobs)


def measure(params: dict[str, Any]) -> dict[str, Any]:
    from vramlab.runspec import RunSpec
    from workers.experiment import run_experiment

    spec = {
        "op": "model",
        "shape": [],
        "dtype": "float32",
        "device": "cuda:0",
        "params": {"steps": 2, **params},
        "trace": "events",
    }
    started = time.perf_counter()
    out = run_experiment(RunSpec.from_wire(spec), None, time.time_ns())
    result = out["result"] or {}
    return {
        "status": out["status"],
        "error": (out.get("error") or {}).get("message"),
        "model": result.get("model"),
        "categories": result.get("categories"),
        "wall_s": time.perf_counter() - started,
    }


def _child(module: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout)[-800:]}
    return dict(json.loads(lines[-1]))


def main() -> None:
    from workers.models.predict import predict

    rows = []
    for i, params in enumerate(SUITE):
        started = time.perf_counter()
        pred = predict(params, "cuda")
        pred_s = time.perf_counter() - started
        got = _child("bench.models_suite", "measure", json.dumps(params))
        model = got.get("model") or {}
        measured = model.get("peak_allocated")
        ref = _child("bench.model_reference", json.dumps(params)) if i in REFERENCE else {}
        weights = model.get("parameter_bytes") or 0
        naive = weights * (4 if params["task"] == "train" else 1)
        rows.append((i, params, pred, pred_s, got, ref, naive))
        err = (pred["peak_allocated"] - measured) / measured * 100 if measured else float("nan")
        print(
            json.dumps(
                {
                    "case": i,
                    "params": params,
                    "predicted": pred["peak_allocated"],
                    "pred_phase": pred["phase"],
                    "pred_cats": pred["categories"],
                    "measured": measured,
                    "reserved": model.get("peak_reserved"),
                    "cats": got.get("categories"),
                    "error_pct": round(err, 2),
                    "naive": naive,
                    "ref": ref,
                    "status": got.get("status"),
                    "err": (got.get("error") or "")[:300],
                    "predict_s": round(pred_s, 2),
                    "measure_s": round(got.get("wall_s") or 0, 1),
                    "totals": [
                        model.get("parameter_bytes"),
                        model.get("gradient_bytes"),
                        model.get("optimizer_state_bytes"),
                    ],
                }
            ),
            flush=True,
        )
    print()
    print("| case | predicted GiB | measured GiB | error | weightsx4 (x1) GiB | vs plain PyTorch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for _i, params, pred, _, got, ref, naive in rows:
        model = got.get("model") or {}
        measured = model.get("peak_allocated")
        name = " ".join(f"{k}={v}" for k, v in params.items() if k != "task") + f" {params['task']}"
        if not measured:
            print(f"| {name} | {pred['peak_allocated'] / GiB:.2f} | {got.get('error', '?')[:60]} |")
            continue
        err = (pred["peak_allocated"] - measured) / measured * 100
        check = ""
        if ref and "peak_step2" in ref:
            peak_diff = (measured - ref["peak_step2"]) / ref["peak_step2"] * 100
            exact = (
                model.get("parameter_bytes") == ref["parameters"]
                and model.get("gradient_bytes") == ref["gradients"]
                and model.get("optimizer_state_bytes") == ref["optimizer_state"]
            )
            check = f"params/grads/state {'equal' if exact else 'DIFFER'}; peak {peak_diff:+.2f}%"
        print(
            f"| {name} | {pred['peak_allocated'] / GiB:.2f} | {measured / GiB:.2f} | "
            f"{err:+.1f}% | {naive / GiB:.2f} | {check} |"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "measure":
        print(json.dumps(measure(json.loads(sys.argv[2])), default=str))
    else:
        main()
