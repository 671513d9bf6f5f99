"""Fine-tuning knobs against independent truth, on a GPU host: each case runs as a plain
script (bench/truth/plain.py, no vramlab code, a fresh process), then through vramlab's
worker (a fresh child, as a real experiment) and its predictor (fake tensors), all in
the same machine session. Prints a table and writes the figures as JSON:

    PYTHONPATH=. python -m bench.truth.run [--only NAME ...] [--out truth.json]

Columns: the plain step-2 peak, vramlab's measured step-2 peak and its predicted peak
(allocated bytes), their errors against the plain peak, and whether parameters,
gradients and optimizer state equal the plain script's to the byte.

Distributed cases (``ddp-*``, ``fsdp-*``, ``hsdp-*``) run bench/truth/plain_distributed.py
(N ranks under NCCL) and vramlab's distributed experiment, one row per rank; a host needs
as many GPUs as the case names (the others are skipped, saying so). ``--cpu`` runs the
distributed cases with tiny models on the CPU under gloo, a smoke test of both sides
(the CPU's plain script reports no peaks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.catalog import plan_spec
from vramlab.catalog.model_zoo import resolve

HERE = Path(__file__).resolve().parent
MiB = 2**20

LORA = {"alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
# name: vramlab's params (as a user submits them, device cuda)
CASES: dict[str, dict[str, Any]] = {
    "lora-r8-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 4,
        "seq_len": 512,
        "peft": {"r": 8, **LORA},
    },
    "lora-r64-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 4,
        "seq_len": 512,
        "peft": {"r": 64, **LORA},
    },
    "lora-r8-llama8b": {
        "model": "llama-8b",
        "precision": "bf16",
        "batch_size": 1,
        "seq_len": 512,
        "peft": {"r": 8, **LORA},
    },
    "lora-r64-llama8b": {
        "model": "llama-8b",
        "precision": "bf16",
        "batch_size": 1,
        "seq_len": 512,
        "peft": {"r": 64, **LORA},
    },
    "qlora-llama8b": {
        "model": "llama-8b",
        "precision": "bf16",
        "batch_size": 1,
        "seq_len": 512,
        "quantization": {"method": "nf4", "double_quant": True, "compute_dtype": "bf16"},
        "peft": {"r": 16, **LORA},
    },
    "adamw8bit-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 512,
        "optimizer": "adamw-8bit",
    },
    "paged-adamw8bit-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 512,
        "optimizer": "paged-adamw-8bit",
    },
    # torchao's low-bit AdamW (torchao.optim; its step torch.compile'd): not yet run on a GPU
    "torchao-adamw8bit-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 512,
        "optimizer": "torchao-adamw-8bit",
    },
    "torchao-adamw4bit-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 512,
        "optimizer": "torchao-adamw-4bit",
    },
    "torchao-adamwfp8-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 512,
        "optimizer": "torchao-adamw-fp8",
    },
    # Held out from the shapes the 4-bit update's rule was read from (Llama-1B in bf16):
    # GPT-2 small in float32, whose largest parameter is its 50,257-token embedding.
    "torchao-adamw4bit-gpt2": {
        "model": "gpt2",
        "batch_size": 4,
        "seq_len": 512,
        "optimizer": "torchao-adamw-4bit",
    },
    "torchao-adamw8bit-gpt2": {
        "model": "gpt2",
        "batch_size": 4,
        "seq_len": 512,
        "optimizer": "torchao-adamw-8bit",
    },
    "liger-llama1b": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 1024,
        "loss": "liger",
    },
    "dropout-gpt2": {"model": "gpt2", "batch_size": 8, "seq_len": 512},
    "t5-short-targets": {"model": "t5-base", "batch_size": 8, "seq_len": 512, "target_len": 64},
    "trainer-gpt2": {
        "model": "gpt2",
        "seq_len": 512,
        "trainer": {
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "bf16": True,
            "optim": "adamw_torch_fused",
            "max_grad_norm": 1.0,
        },
    },
}


# Several GPUs of one host: batch_size is per GPU.
DISTRIBUTED: dict[str, dict[str, Any]] = {
    "ddp-gpt2-2": {
        "model": "gpt2",
        "batch_size": 8,
        "seq_len": 512,
        "distributed": {"strategy": "ddp", "gpus": 2},
    },
    "ddp-gpt2-4": {
        "model": "gpt2",
        "batch_size": 8,
        "seq_len": 512,
        "distributed": {"strategy": "ddp", "gpus": 4},
    },
    "fsdp-llama8b-2": {
        "model": "llama-8b",
        "precision": "bf16",
        "batch_size": 1,
        "seq_len": 1024,
        "checkpointing": True,
        "distributed": {"strategy": "fsdp", "gpus": 2},
    },
    "fsdp-llama8b-4": {
        "model": "llama-8b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 1024,
        "checkpointing": True,
        "distributed": {"strategy": "fsdp", "gpus": 4},
    },
    "fsdp-llama1b-bf16mp-2": {
        "model": "llama-1b",
        "batch_size": 2,
        "seq_len": 1024,
        "distributed": {"strategy": "fsdp", "gpus": 2, "mixed_precision": "bf16"},
    },
    "hsdp-llama1b-4": {
        "model": "llama-1b",
        "precision": "bf16",
        "batch_size": 2,
        "seq_len": 1024,
        "distributed": {"strategy": "fsdp", "gpus": 4, "sharding": "hybrid"},
    },
}
CASES.update(DISTRIBUTED)
# --cpu: the same strategies on tiny models, gloo on the CPU (a smoke test of both sides).
CPU_MODELS = {"gpt2": "tiny-gpt2", "llama-8b": "tiny-llama", "llama-1b": "tiny-llama"}


def on_cpu(params: dict[str, Any]) -> dict[str, Any]:
    plan = dict(params["distributed"])
    if plan.get("sharding") == "hybrid":
        plan["gpus"] = 4
    else:
        plan["gpus"] = 2
    return {
        **params,
        "model": CPU_MODELS[params["model"]],
        "batch_size": 2,
        "seq_len": 32,
        "distributed": plan,
    }


def truth_case(params: dict[str, Any]) -> dict[str, Any]:
    """What the plain script needs: the config as plain data, nothing of vramlab's (the
    spec's knobs as the API writes them out: LoRA's defaults filled in)."""
    params, _ = plan_spec("model", (), params, "float32", "cuda:0")
    resolved = resolve(params["model"])
    if params.get("distributed") is not None:
        case_ = {
            "model_type": resolved.model_type,
            "kind": resolved.kind,
            "config": {**resolved.config, **(params.get("config") or {})},
            "precision": params["precision"],
            "batch_size": params["batch_size"],
            "seq_len": params.get("seq_len") or 128,
            "distributed": params["distributed"],
        }
        if params.get("checkpointing"):
            case_["checkpointing"] = True
        return case_
    case = {
        "model_type": resolved.model_type,
        "kind": resolved.kind,
        "config": {**resolved.config, **(params.get("config") or {})},
        "precision": params["precision"] if params["precision"] in ("bf16", "fp16") else "fp32",
        "batch_size": params.get("batch_size", 1),
        "seq_len": params.get("seq_len", 128),
    }
    for key in ("peft", "quantization", "optimizer", "target_len", "dropout", "trainer"):
        if params.get(key) is not None:
            case[key] = params[key]
    if params.get("loss") == "liger":
        case["liger"] = True
    if params.get("checkpointing"):
        case["checkpointing"] = True
    return case


def plain(params: dict[str, Any], cpu: bool = False) -> dict[str, Any]:
    script = "plain_distributed.py" if params.get("distributed") else "plain.py"
    env = dict(os.environ)
    if not params.get("distributed"):
        # One GPU, as vramlab's experiment has: on a host of several, Trainer would wrap
        # the model in DataParallel across all it sees (a 645 MiB higher step-2 peak on
        # the first of two H200s).
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    done = subprocess.run(
        [sys.executable, str(HERE / script), json.dumps(truth_case(params))]
        + (["--cpu"] if cpu else []),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def vramlab(params: dict[str, Any], cpu: bool = False) -> dict[str, Any]:
    """vramlab's worker (a fresh child) and predictor for the same spec."""
    from vramlab.runspec import RunSpec
    from workers.models.predict import predict
    from workers.runner import Runner

    device = "cpu" if cpu else "cuda:0"
    checked, plan = plan_spec("model", (), params, "float32", device)
    spec = {
        "op": "model",
        "shape": [],
        "params": checked,
        "dtype": "float32",
        "device": device,
        "warmup": 0,
        "repeat": 1,
        "timeout_s": 900.0,
        "allocator": {},
        "trace": "none",
        "prediction": plan.prediction(device),
    }
    runner = Runner()
    runner.start()
    try:
        outcome = runner.run(RunSpec.from_wire(spec))
    finally:
        runner.close()
    out: dict[str, Any] = {"predicted": predict(checked, "cpu" if cpu else "cuda")}
    if outcome.status != "succeeded" or outcome.result is None:
        out["error"] = str(outcome.error)[:300]
        return out
    out["measured"] = outcome.result["model"]
    return out


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def rank_rows(name: str, truth: dict[str, Any], ours: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per rank: the plain rank's step-2 peak against vramlab's measured rank and
    its prediction (rank 0's, for every rank), and whether each rank's parameter,
    gradient and optimizer-state shards are equal to the byte."""
    predicted = ours["predicted"].get("peak_allocated")
    measured = {r["rank"]: r for r in (ours.get("measured") or {}).get("ranks") or []}
    if "error" in truth or not measured:
        why = str(truth.get("error") or ours.get("error", "-"))[:60]
        return [(name, why, "-", "-", "-", "-", "NO")]
    rows = []
    for plain_rank in truth["ranks"]:
        r = plain_rank["rank"]
        m = measured.get(r, {})
        peak = plain_rank["peak_step2"] or None
        same = all(
            plain_rank[a] == m.get(b)
            for a, b in (
                ("parameters", "parameter_bytes"),
                ("gradients", "gradient_bytes"),
                ("optimizer_state", "optimizer_state_bytes"),
            )
        )
        rows.append(
            (
                f"{name} rank {r}",
                f"{peak / MiB:.1f}" if peak else "-",
                f"{m['peak_allocated'] / MiB:.1f}" if m else "-",
                f"{predicted / MiB:.1f}" if predicted else "-",
                error(m.get("peak_allocated"), peak),
                error(predicted, peak),
                "yes" if same else "NO",
            )
        )
    return rows


def error(value: int | None, truth: int | None) -> str:
    if value is None or not truth:
        return "-"
    return f"{100 * (value - truth) / truth:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--out", default="truth.json")
    parser.add_argument(
        "--cpu", action="store_true", help="the distributed cases, tiny, on the CPU (gloo)"
    )
    args = parser.parse_args()
    rows = []
    record = {}
    for name, params in CASES.items():
        if args.only and name not in args.only:
            continue
        if args.cpu and name not in DISTRIBUTED:
            continue
        if args.cpu:
            params = on_cpu(params)
        elif params.get("distributed") and _gpus() < params["distributed"]["gpus"]:
            print(f"{name}: skipped, needs {params['distributed']['gpus']} GPUs", file=sys.stderr)
            continue
        truth = plain(params, args.cpu)
        ours = vramlab(params, args.cpu)
        record[name] = {"params": params, "plain": truth, "vramlab": ours}
        if params.get("distributed"):
            rows += rank_rows(name, truth, ours)
            print(json.dumps({name: record[name]}), file=sys.stderr, flush=True)
            continue
        measured = (ours.get("measured") or {}).get("peak_allocated")
        predicted = ours["predicted"].get("peak_allocated")
        peak = truth.get("peak_step2")
        m = ours.get("measured") or {}
        same = all(
            truth.get(a) == m.get(b)
            for a, b in (
                ("parameters", "parameter_bytes"),
                ("gradients", "gradient_bytes"),
                ("optimizer_state", "optimizer_state_bytes"),
            )
        )
        rows.append(
            (
                name,
                f"{peak / MiB:.1f}" if peak else str(truth.get("error")),
                f"{measured / MiB:.1f}" if measured else str(ours.get("error", "-"))[:40],
                f"{predicted / MiB:.1f}" if predicted else "-",
                error(measured, peak),
                error(predicted, peak),
                "yes" if same and peak else "NO",
            )
        )
        print(json.dumps({name: record[name]}), file=sys.stderr, flush=True)
    header = (
        "case",
        "truth MiB",
        "measured MiB",
        "predicted MiB",
        "meas err",
        "pred err",
        "p/g/o equal",
    )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
