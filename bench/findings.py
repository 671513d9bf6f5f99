"""Every preset and every catalog op, run on a live vramlab service with a CUDA worker:
measured against predicted bytes; writes docs/findings.md (one row per preset) and the
raw results as JSON.

    PYTHONPATH=$PWD python bench/findings.py --device cuda --out findings.json

One failing op never stops the others; the run gives up waiting after --budget-s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.service import running_service
from tests.op_cases import CASES

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
# What each article claims, and what the presets measured of it: a preset's `article`
# field points at its section here (docs/findings.md#article-000 and so on).
ARTICLES = {
    "000": (
        "Why does transferring a tensor to a GPU require additional RAM allocation?",
        "Claims: after a move to the GPU the host copy stays alive beside the device copy, "
        "and the transfer itself needs extra system RAM. Measured: the source tensor stays "
        "alive until it is dropped (`cpu_copy_stays_alive`); a copy from pageable memory "
        "touched about 2 MiB of host RSS (the driver's staging), not a second host copy "
        "(`transfer_pageable`); a pinned source holds its whole size in pinned host memory "
        "and copies several times faster (`transfer_pinned`); changing the device copy in "
        "place leaves the host copy alone (`gpu_copy_modified`).",
    ),
    "001": (
        "Why can't the tensor be moved to GPU memory?",
        "Claims: unsupported dtypes (bfloat16), fragmentation and row-major layouts stop a "
        "move. Measured: bfloat16 moves and is used on current GPUs "
        "(`bfloat16_moved_and_used`, `dtype_support_matrix`); 100 allocate/free cycles of "
        "one size leave nothing that stops a large request (`fragmentation_article_loop`), "
        "while freeing every other block makes reserved memory grow with free bytes held "
        "in split blocks (`fragmentation_holes`), less so with expandable segments "
        "(`fragmentation_expandable_segments`), and `empty_cache` hands the cached "
        "segments back first (`fragmentation_empty_cache`); a NumPy (row-major) tensor "
        "moves as any other (`numpy_tensor_moved`).",
    ),
    "002": (
        "Why does GPU memory increase when calling a tensor method with existing GPU tensors?",
        "Claims: ops create intermediate tensors, matmul many, and even in-place `add_` "
        "may allocate when autograd is on. Measured: `a + b` allocates exactly its output "
        "(`elementwise_add`); matmul's extra 32 MiB is cuBLAS's workspace, kept from the "
        "first call, not a temporary (`matmul_1000x2000_2000x500`); `add_` allocates "
        "nothing (`inplace_add_no_grad`), and on a leaf that requires grad autograd "
        "refuses it rather than allocating (`inplace_add_requires_grad`).",
    ),
    "003": (
        "Why is a tensor on CUDA attempting to use CPU storage?",
        "Claims: tensors default to the CPU, and mixing devices copies data silently. "
        "Measured: creating on the CPU then moving costs a host allocation and a copy "
        "that creating on the GPU avoids (`cpu_then_cuda_vs_on_gpu`); an op or a model "
        "with inputs on two devices fails with `device_mismatch`, it does not copy "
        "silently (`tensors_on_two_devices`, `model_left_on_cpu`), except a 0-dim CPU "
        "tensor, read as a scalar (`cpu_scalar_with_gpu_tensor`). Moved to the device, the "
        "model runs there and keeps what autograd saved beyond its output "
        "(`model_moved_to_gpu`); a non_blocking copy from pageable memory, the work on it "
        "and the copy back are measured step by step (`non_blocking_copy_then_compute`).",
    ),
}


def articles_markdown() -> list[str]:
    lines = ["## The articles", ""]
    for article_id, (title, text) in ARTICLES.items():
        lines += [f'<a id="article-{article_id}"></a>', "", f"### Article {article_id}", ""]
        lines += [f"*{title}*", "", text, ""]
    return lines


SCALE = 16  # small test case -> medium size: every dim of 8 or more, 16 times larger


def _scale(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return [v * SCALE if v >= 8 else v for v in value]
    return value


def op_specs(device: str, gpus: int) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for op, (shape, params, dtype) in CASES.items():
        spec = {
            "op": op,
            "shape": _scale(shape),
            "params": {k: _scale(v) for k, v in params.items()},
            "dtype": dtype,
            "device": device,
        }
        out.append((op, spec))
    if device.startswith("cuda"):
        big = [4096, 4096]
        out += [
            (
                "to pinned non_blocking",
                {
                    "op": "to",
                    "shape": big,
                    "device": device,
                    "params": {"pin_memory": True, "non_blocking": True},
                },
            ),
            (
                "to cuda->cpu",
                {"op": "to", "shape": big, "device": "cpu", "params": {"source_device": device}},
            ),
            (
                "matmul requires_grad",
                {
                    "op": "matmul",
                    "shape": [1024, 2048],
                    "device": device,
                    "params": {"other_shape": [2048, 512], "requires_grad": True},
                },
            ),
            (
                "conv2d cudnn_benchmark",
                {
                    "op": "conv2d",
                    "shape": [16, 64, 128, 128],
                    "device": device,
                    "params": {"out_channels": 64, "cudnn_benchmark": True},
                },
            ),
            (
                "transformer train bf16 autocast+ckpt",
                {
                    "op": "module_train_step",
                    "shape": [8, 512, 1024],
                    "device": device,
                    "params": {
                        "module": "transformer_block",
                        "width": 4096,
                        "heads": 16,
                        "autocast": "bfloat16",
                        "checkpoint": True,
                    },
                },
            ),
            (
                "mixed tensor_tensor",
                {
                    "op": "mixed_device",
                    "shape": [1024],
                    "device": device,
                    "params": {"case": "tensor_tensor"},
                },
            ),
            (
                "mixed module_on_cpu",
                {
                    "op": "mixed_device",
                    "shape": [1, 1000],
                    "device": device,
                    "params": {"case": "module_on_cpu"},
                },
            ),
            (
                "empty cudaMallocAsync",
                {
                    "op": "empty",
                    "shape": [2**26],
                    "device": device,
                    "allocator": {"backend": "cudaMallocAsync"},
                },
            ),
        ]
        if gpus >= 2:
            out.append(
                (
                    "to cuda:0->cuda:1",
                    {
                        "op": "to",
                        "shape": big,
                        "device": "cuda:1",
                        "params": {"source_device": "cuda:0"},
                    },
                )
            )
    return out


def submit(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[str | None, str]:
    try:
        response = client.post(path, json=body)
    except httpx.HTTPError as exc:
        return None, f"submit failed: {exc}"
    if response.status_code != 202:
        return None, f"refused {response.status_code}: {response.text[:300]}"
    return str(response.json()["id"]), ""


def wait_all(client: httpx.Client, ids: dict[str, str], deadline: float) -> dict[str, Any]:
    done: dict[str, Any] = {}
    while len(done) < len(ids) and time.monotonic() < deadline:
        for key, exp_id in ids.items():
            if key in done:
                continue
            try:
                exp = client.get(f"/v1/experiments/{exp_id}").json()
            except httpx.HTTPError:
                continue
            if exp.get("status") in ("succeeded", "failed", "cancelled"):
                done[key] = exp
        time.sleep(0.5)
    for key, exp_id in ids.items():
        if key not in done:
            done[key] = {"id": exp_id, "status": "unfinished", "result": None, "error": None}
    return done


def _mem(exp: dict[str, Any]) -> dict[str, Any]:
    return ((exp.get("result") or {}).get("memory")) or {}


def _mb(n: Any) -> str:
    return f"{n / MiB:.1f}" if isinstance(n, int) else "-"


def measured(exp: dict[str, Any]) -> str:
    if exp.get("status") not in ("succeeded", "failed"):
        return exp.get("status", "?")
    mem, res = _mem(exp), exp.get("result") or {}
    if not mem:
        return f"{exp['status']}: {(exp.get('error') or {}).get('type')}"
    parts = [
        f"alloc after {_mb(mem.get('allocated_after'))} MiB",
        f"peak {_mb(mem.get('allocated_peak'))} MiB",
        f"reserved {_mb(mem.get('reserved_after'))} MiB",
    ]
    rss0, rss1 = mem.get("host_rss_before"), mem.get("host_rss_after")
    if isinstance(rss0, int) and isinstance(rss1, int):
        parts.append(f"host RSS {(rss1 - rss0) / MiB:+.1f} MiB")
    if mem.get("pinned_host_after"):
        parts.append(f"pinned {_mb(mem['pinned_host_after'])} MiB")
    bw = (res.get("timing") or {}).get("bytes_per_s")
    if bw:
        parts.append(f"{bw / 1e9:.1f} GB/s")
    return ", ".join(parts)


def vs_prediction(exp: dict[str, Any]) -> str:
    mem, pred = _mem(exp), exp.get("prediction") or {}
    delta, want = mem.get("delta_allocated"), pred.get("delta_allocated")
    if not isinstance(delta, int) or not isinstance(want, int):
        return "-"
    if delta == want:
        return "= predicted"
    label = "" if pred.get("exact") else " (not exact)"
    return f"{delta - want:+,} B vs predicted{label}"


def answer(exp: dict[str, Any]) -> str:
    """The plain answer: the error where it failed, else the notes that carry the finding."""
    if exp.get("status") == "failed" and exp.get("error"):
        err = exp["error"]
        return f"Fails: {err['type']}: {err['message'].splitlines()[0][:200]}"
    steps = (exp.get("result") or {}).get("steps") or []
    summary = "; ".join(
        f"{s['name'][3:40]}: alloc {_mb(s.get('allocated_end'))}, reserved "
        f"{_mb(s.get('reserved_end'))} MiB"
        for s in steps[:6]
        if s.get("allocated_end") is not None
    )
    notes = (exp.get("result") or {}).get("notes") or []
    keep = [
        n
        for n in notes
        if not n.startswith(
            (
                "CPU timings",
                "On the CPU there is no",
                "Not predicted exactly",
                "Starting CUDA",
                "allocated_before is",
            )
        )
    ]
    text = " ".join(keep[:3])[:700]
    return f"Steps: {summary}. {text}" if summary else (text or "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_doc(
    path: Path,
    presets: list[dict[str, Any]],
    results: dict[str, Any],
    device: str,
    env: dict[str, Any],
) -> None:
    lines = [
        "# Findings",
        "",
        "Regenerate with `python bench/findings.py --device cuda --out findings.json` on a GPU "
        "host. Every figure below was measured by vramlab; predictions are the catalog's.",
        "",
        f"Device: {env.get('gpu_name') or device}; torch {env.get('torch')}, "
        f"CUDA {env.get('cuda')}, driver {env.get('driver')}.",
        "",
        *articles_markdown(),
        "## The presets",
        "",
        "| preset | article | question | measured | vs prediction | answer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in presets:
        exp = results.get(f"preset:{p['name']}") or {"status": "not run"}
        article = f"[{p['article_id']}](#article-{p['article_id']})"
        lines.append(
            f"| {p['name']} | {article} {p['example']} | {_cell(p['question'])} | "
            f"{_cell(measured(exp))} | {_cell(vs_prediction(exp))} | {_cell(answer(exp))} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="medium", choices=("small", "medium", "large"))
    parser.add_argument("--out", default="findings.json", help="raw results (JSON)")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "findings.md"))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--budget-s", type=float, default=330.0)
    args = parser.parse_args()
    started = time.monotonic()
    worker_device = "cuda" if args.device.startswith("cuda") else "cpu"
    with running_service(worker_device, port=args.port) as client:
        workers = client.get("/v1/workers").json()
        gpus = max((len(w["capabilities"].get("gpus") or []) for w in workers), default=0)
        presets = client.get("/v1/presets").json()
        ids: dict[str, str] = {}
        refused: dict[str, Any] = {}
        for p in presets:
            key = f"preset:{p['name']}"
            exp_id, why = submit(
                client, f"/v1/presets/{p['name']}/runs", {"device": args.device, "size": args.size}
            )
            if exp_id:
                ids[key] = exp_id
            else:
                refused[key] = {"status": "refused", "error": {"type": "refused", "message": why}}
        for name, spec in op_specs(args.device, gpus):
            exp_id, why = submit(client, "/v1/experiments", spec)
            if exp_id:
                ids[f"op:{name}"] = exp_id
            else:
                refused[f"op:{name}"] = {
                    "status": "refused",
                    "error": {"type": "refused", "message": why},
                }
        results = {**refused, **wait_all(client, ids, started + args.budget_s)}
    env: dict[str, Any] = {}
    for exp in results.values():
        env = ((exp.get("result") or {}).get("environment")) or env
        if env:
            break
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    doc = Path(args.doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    write_doc(doc, presets, results, args.device, env)
    print(f"{'case':<42} {'status':<28} {'delta vs predicted':<34} {'peak MiB':>9}")
    for key, exp in results.items():
        status = exp.get("status", "?")
        if status == "failed":
            status = f"failed:{(exp.get('error') or {}).get('type')}"
        peak = _mb(_mem(exp).get("allocated_peak"))
        print(f"{key[:42]:<42} {status[:28]:<28} {vs_prediction(exp)[:34]:<34} {peak:>9}")
    print(f"\nwrote {doc} and {args.out} in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
