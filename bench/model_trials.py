"""Model trials through the real service, `vramlab serve` and `vramlab worker` with their
default flags: each trial submit to result (the first too runs in a warm model child, made
when the worker started), a fit search's time beside what its prediction said, and a
sweep of the model over batch size x sequence length.

    python bench/model_trials.py [--device cuda|cpu] [--model gpt2] [--trials 5]
                                 [--batch 4] [--seq 256] [--capacity-gib 8]
                                 [--sweep-batches 1,2,4,8,16] [--sweep-lens 128,256,512,1024]

Targets (issue 32, GPU host): a GPT-2 small trial <= 5 s submit to result; a fit search
with a good prediction <= 20 s (good: the predicted largest batch is the measured one, so
two trials settle it: it fits, one more does not); a 20-point GPT-2 batch x length sweep
<= 2 minutes. On the CPU (tiny-llama, a small grid) the same mechanism, no target:

    python bench/model_trials.py --device cpu --model tiny-llama --trials 2 --batch 2 \
        --seq 16 --capacity-gib 0.05 --sweep-batches 1,2 --sweep-lens 16,32
"""

import argparse
import statistics
import time
from datetime import datetime
from typing import Any

import httpx
from service import run_to_end, running_service

TARGET_TRIAL_S = 5.0
TARGET_FIT_S = 20.0
TARGET_SWEEP_S = 120.0
TARGET_SWEEP_POINTS = 20
FINISHED = ("succeeded", "failed", "cancelled", "lost")


def trial(client: httpx.Client, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    exp = run_to_end(client, spec, poll_s=0.02)
    return time.perf_counter() - began, exp


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def child_start(exp: dict[str, Any]) -> str | None:
    start: str | None = ((exp.get("result") or {}).get("environment") or {}).get("child_start")
    return start


def worker_s(exp: dict[str, Any]) -> float | None:
    """Claim to stored result, by the API's own timestamps."""
    if not exp.get("started_at") or not exp.get("finished_at"):
        return None
    return _at(exp["finished_at"]) - _at(exp["started_at"])


def fit_search(
    client: httpx.Client, spec: dict[str, Any], capacity: int
) -> tuple[float, dict[str, Any]]:
    body = {
        "spec": {**spec, "params": {k: v for k, v in spec["params"].items() if k != "batch_size"}},
        "vary": "batch_size",
        "capacity_bytes": capacity,
    }
    began = time.perf_counter()
    fit = client.post("/v1/fits", json=body)
    fit.raise_for_status()
    fit_id = fit.json()["id"]
    while True:
        shown: dict[str, Any] = client.get(f"/v1/fits/{fit_id}").json()
        if shown["status"] not in ("queued", "running", "searching"):
            return time.perf_counter() - began, shown
        time.sleep(0.1)


def show_fit(client: httpx.Client, fit: dict[str, Any]) -> bool:
    """Print the fit's answer beside its prediction, and each trial; whether the
    prediction was good (the measured largest value)."""
    good = True
    created = _at(fit["created_at"])
    for v in fit["variants"]:
        predicted, measured = v["predicted_max_fitting"], v["max_fitting"]
        good = good and predicted is not None and predicted == measured
        print(
            f"  variant {v['index']}: predicted largest {predicted}, measured {measured}, "
            f"first failing {v['first_failing']}, {len(v['trials'])} trials, "
            f"prediction error {v['prediction_error']}%"
        )
        for t in v["trials"]:
            exp = client.get(f"/v1/experiments/{t['experiment_id']}").json()
            queued = _at(exp["created_at"]) - created
            took = worker_s(exp)
            print(
                f"    batch {t['value']:>4}: {t['status']:<9} queued at +{queued:5.2f} s, "
                f"worker {took or 0:5.2f} s, child {child_start(exp)}"
            )
    return good


def sweep(
    client: httpx.Client, spec: dict[str, Any], batches: list[int], lens: list[int]
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """A grid of batch sizes x sequence lengths, submit to the last point finished."""
    base = {**spec, "params": {"model": spec["params"]["model"]}}
    body = {"spec": base, "grid": {"params.batch_size": batches, "params.seq_len": lens}}
    began = time.perf_counter()
    response = client.post("/v1/sweeps", json=body)
    response.raise_for_status()
    sweep_id = response.json()["id"]
    while True:
        progress: dict[str, Any] = client.get(f"/v1/sweeps/{sweep_id}/progress").json()
        if progress["done"]:
            break
        time.sleep(0.1)
    took = time.perf_counter() - began
    rows = client.get(f"/v1/sweeps/{sweep_id}", params={"limit": 1000}).json()["rows"]
    exps = [client.get(f"/v1/experiments/{r['experiment_id']}").json() for r in rows]
    return took, progress, exps


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--capacity-gib", type=float, default=8.0)
    parser.add_argument("--sweep-batches", default="1,2,4,8,16")
    parser.add_argument("--sweep-lens", default="128,256,512,1024")
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else "cpu"
    params = {"model": args.model, "batch_size": args.batch, "seq_len": args.seq}
    spec = {"op": "model", "shape": [], "device": device, "params": params}
    batches, lens = _ints(args.sweep_batches), _ints(args.sweep_lens)
    times: list[float] = []
    with running_service(args.device) as client:
        for i in range(args.trials):
            took, exp = trial(client, spec)
            print(
                f"  trial {i}: {took:6.2f} s  {exp['status']}  worker (claim to result) "
                f"{worker_s(exp) or 0:5.2f} s  child: {child_start(exp)}"
            )
            times.append(took)
        fit_s, fit = fit_search(client, spec, int(args.capacity_gib * 2**30))
        print(f"  fit search: {fit_s:.2f} s, {fit['status']}")
        good = show_fit(client, fit)
        sweep_s, progress, exps = sweep(client, spec, batches, lens)
    starts: dict[str | None, int] = {}
    for exp in exps:
        starts[child_start(exp)] = starts.get(child_start(exp), 0) + 1
    each = [w for w in map(worker_s, exps) if w is not None]
    print(
        f"  sweep: {sweep_s:.2f} s, {progress['progress']}, children {starts}, "
        f"worker per point median {statistics.median(each) if each else 0:.2f} s, "
        f"max {max(each, default=0):.2f} s"
    )
    warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
    points = len(batches) * len(lens)
    print(f"\n{args.model} trials (batch {args.batch}, seq {args.seq}) on {device}")
    print(f"{'':<44} {'seconds':>8} {'target':>8}")
    print(f"{'first trial, submit to result':<44} {times[0]:8.2f} {TARGET_TRIAL_S:8g}")
    print(f"{'later trials, median':<44} {warm:8.2f} {TARGET_TRIAL_S:8g}")
    verdict = "good prediction" if good else "prediction off: the target does not apply"
    print(f"{'fit search of batch_size':<44} {fit_s:8.2f} {TARGET_FIT_S:8g}   {verdict}")
    target = f"{TARGET_SWEEP_S:8g}" if points == TARGET_SWEEP_POINTS else f"{'':>8}"
    label = f"sweep batch {args.sweep_batches} x seq {args.sweep_lens}"
    print(f"{label[:44]:<44} {sweep_s:8.2f} {target}   {points} points")


if __name__ == "__main__":
    main()
