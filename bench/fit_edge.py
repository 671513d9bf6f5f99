"""The predicted edge against the real one: for six training steps, the largest batch
the predictor says fits (reserved, from the allocator model) beside the largest batch
that really runs, on the whole card and on an emulated 24 GiB card.

Prediction: workers/models/predict.py on fake tensors (no device), each batch's step
replayed through the caching-allocator model under the capacity; on the whole card the
capacity is what the allocator can reserve there (bench/usable_memory.py's
``usable_for_training_filled``, read from --usable or measured first). Measurement: a plain
PyTorch + transformers loop (three steps: zero_grad, forward, backward, AdamW step) in a
fresh CUDA process per trial, forked from a server that imported torch and transformers
and never touched CUDA; the emulated card is ``set_per_process_memory_fraction``. The
search starts at the predicted edge (fits, and one more does not: two trials), galloping
away only if it is wrong. On a CUDA host:

    python -m bench.fit_edge [--usable OUT/usable_memory.json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GiB = 2**30
EMULATED = 24 * GiB
STEPS = 3  # a fit trial's two steps and the category tally's third
CASES: dict[str, dict[str, Any]] = {
    "gpt2-fp32": {"model": "gpt2", "seq_len": 1024},
    "gpt2-bf16-autocast": {"model": "gpt2", "seq_len": 1024, "precision": "bf16-autocast"},
    "gpt2-checkpointing": {"model": "gpt2", "seq_len": 1024, "checkpointing": True},
    "bert-base": {"model": "bert-base", "seq_len": 512},
    "llama-1b-bf16": {"model": "llama-1b", "seq_len": 1024, "precision": "bf16"},
    "vit-base": {"model": "vit-base"},
}


# -- the measured side: plain PyTorch and transformers, one fresh CUDA process a trial ----


def plain_steps(params: dict[str, Any], capacity: int | None) -> dict[str, Any]:
    """Build the model as transformers does and run STEPS training steps; whether they
    fit, and the allocator's peaks."""
    import torch
    import transformers

    from vramlab.catalog.model_zoo import resolve  # the preset's config (plain data)

    device = torch.device("cuda", 0)
    torch.cuda.init()
    if capacity is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(capacity / total, device)
    resolved = resolve(params["model"])
    config = transformers.AutoConfig.for_model(resolved.model_type, **resolved.config)
    auto = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "image-classification": transformers.AutoModelForImageClassification,
    }[resolved.kind]
    precision = params.get("precision", "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    autocast = precision == "bf16-autocast"
    batch = int(params["batch_size"])
    started = time.perf_counter()
    fits = True
    try:
        kwargs: dict[str, Any] = {"dtype": dtype}
        if resolved.kind != "image-classification":
            kwargs["attn_implementation"] = "sdpa"
        with torch.device(device):
            model = auto.from_config(config, **kwargs)
        for module in model.modules():  # as the worker's step: dropout off
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        model.train()
        if params.get("checkpointing"):
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if resolved.kind == "image-classification":
            size = getattr(config, "image_size", 224)
            pixels = torch.zeros(batch, 3, size, size, dtype=dtype, device=device)
            inputs = {
                "pixel_values": pixels,
                "labels": torch.zeros(batch, dtype=torch.long, device=device),
            }
        else:
            seq = int(params["seq_len"])
            ids = (torch.arange(batch * seq, device=device) % config.vocab_size).reshape(batch, seq)
            inputs = {"input_ids": ids, "labels": ids.clone()}
        for _ in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**inputs).loss
            loss.backward()
            del loss
            optimizer.step()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        fits = False
    except RuntimeError as exc:  # cuBLAS's own allocation failing is the card being full
        if "CUBLAS_STATUS_ALLOC_FAILED" not in str(exc):
            raise
        fits = False
    return {
        "fits": fits,
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _child(request: dict[str, Any], conn: Any) -> None:
    try:
        conn.send(plain_steps(request["params"], request.get("capacity")))
    except BaseException as exc:  # reported, the search goes on
        conn.send({"error": f"{type(exc).__name__}: {exc}"[:2000]})
    finally:
        conn.close()


def serve() -> None:
    """Answer trial requests (JSON lines) each in a forked child: this process imports
    torch and transformers once and never starts CUDA, so each child starts it fresh."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from vramlab.catalog.model_zoo import resolve  # noqa: F401

    fork = multiprocessing.get_context("fork")
    for line in sys.stdin:
        request = json.loads(line)
        receive, send = fork.Pipe(duplex=False)
        child = fork.Process(target=_child, args=(request, send))
        child.start()
        send.close()
        deadline = time.monotonic() + 600
        answer: dict[str, Any] = {"error": "the trial ran past 600 s"}
        while time.monotonic() < deadline:
            if receive.poll(1):
                answer = receive.recv()
                break
            if not child.is_alive():
                if receive.poll(0):
                    answer = receive.recv()
                else:
                    answer = {"error": f"the trial's process exited ({child.exitcode})"}
                break
        child.join(30)
        if child.is_alive():
            child.kill()
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class Trials:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fit_edge", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, params: dict[str, Any], capacity: int | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"params": params, "capacity": capacity}) + "\n")
        self.proc.stdin.flush()
        while True:  # what a library printed is not the answer
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the trial server exited")
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


# -- the search ----------------------------------------------------------------------------


def edge(fits: Callable[[int], bool], start: int) -> int:
    """The largest batch that fits (0: not even one), starting at ``start``: one step up
    to confirm, galloping away where the start is wrong, then bisecting."""
    start = max(1, start)
    if fits(start):
        lo, step = start, 1
        while fits(lo + step):
            lo, step = lo + step, step * 2
        hi = lo + step
    else:
        hi, step = start, 1
        while True:
            candidate = hi - step
            if candidate < 1:
                lo = 0
                break
            if fits(candidate):
                lo = candidate
                break
            hi, step = candidate, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def usable_bytes(path: Path | None) -> int:
    """What the allocator can reserve on the whole card beside a training step's cuBLAS
    handles, segment after segment (bench/usable_memory.py)."""
    if path is not None and path.exists():
        return int(json.loads(path.read_text())["usable_for_training_filled"])
    done = subprocess.run(
        [sys.executable, "-m", "bench.usable_memory", "--probe", "cublas"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout.strip().splitlines()[-1])["usable_for_training_filled"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--usable", type=Path, help="bench/usable_memory.py's JSON")
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    from workers.models.predict import Traced, trace

    card = usable_bytes(args.usable)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = (args.out / "fit_edge.jsonl").open("a")  # each row as it comes: a crash keeps them
    trials = Trials()
    rows: list[dict[str, Any]] = []
    try:
        for name in args.case or list(CASES):
            base = CASES[name]
            traced: dict[int, Traced] = {}

            def at(
                batch: int, base: dict[str, Any] = base, traced: dict[int, Traced] = traced
            ) -> Traced:
                if batch not in traced:
                    traced[batch] = trace({**base, "batch_size": batch}, "cuda")
                return traced[batch]

            for label, capacity, emulated in (("card", card, False), ("24 GiB", EMULATED, True)):
                started = time.perf_counter()
                one, two = at(1).peak_reserved(), at(2).peak_reserved()
                guess = int((capacity - one) / max(two - one, 1)) + 1

                def predicted_fits(batch: int, capacity: int = capacity) -> bool:
                    return at(batch).peak_reserved(capacity) <= capacity

                predicted = edge(predicted_fits, guess)
                predict_s = time.perf_counter() - started
                measured_runs: dict[int, dict[str, Any]] = {}

                def measured_fits(
                    batch: int,
                    capacity: int = capacity,
                    emulated: bool = emulated,
                    runs: dict[int, dict[str, Any]] = measured_runs,
                    base: dict[str, Any] = base,
                ) -> bool:
                    runs[batch] = trials.run(
                        {**base, "batch_size": batch}, capacity if emulated else None
                    )
                    if "error" in runs[batch]:
                        raise RuntimeError(runs[batch]["error"])
                    return bool(runs[batch]["fits"])

                try:
                    measured = edge(measured_fits, predicted)
                except RuntimeError as exc:  # one case's failure does not end the others
                    row = {"case": name, "card": label, "error": str(exc)[:500]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    lines.write(json.dumps(row) + "\n")
                    lines.flush()
                    continue
                row = {
                    "case": name,
                    "card": label,
                    "capacity": capacity,
                    "predicted_max": predicted,
                    "measured_max": measured,
                    "trials": sorted(measured_runs),
                    "predict_s": round(predict_s, 1),
                }
                if measured >= 1:
                    row["predicted_reserved"] = at(measured).peak_reserved(capacity)
                    row["predicted_allocated"] = at(measured).peak_allocated
                    row["measured_reserved"] = measured_runs[measured]["peak_reserved"]
                    row["measured_allocated"] = measured_runs[measured]["peak_allocated"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                lines.write(json.dumps(row) + "\n")
                lines.flush()
    finally:
        trials.close()
        lines.close()
    (args.out / "fit_edge.json").write_text(json.dumps(rows, indent=1))
    print()
    print(f"whole card: the allocator may reserve {card / GiB:.2f} GiB")
    print(
        "| case | card | predicted max | measured max | trials | predicted reserved GiB "
        "| measured reserved GiB | error |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['card']} | error: {r['error'][:80]} |  |  |  |  |  |")
            continue
        if "measured_reserved" in r:
            p, m = r["predicted_reserved"], r["measured_reserved"]
            figures = f"{p / GiB:.2f} | {m / GiB:.2f} | {(p - m) / m:+.1%}"
        else:
            figures = " |  | "
        print(
            f"| {r['case']} | {r['card']} | {r['predicted_max']} | {r['measured_max']} | "
            f"{len(r['trials'])} | {figures} |"
        )


if __name__ == "__main__":
    main()
