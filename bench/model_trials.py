"""Model trials through the real service, `vramlab serve` and `vramlab worker` with their
default flags: each trial submit to result (the first in a child that imports
transformers then; the next ones in warm model children, made while the one before ran),
and a fit search's time.

    python bench/model_trials.py [--device cuda|cpu] [--model gpt2] [--trials 5]
                                 [--batch 4] [--seq 256] [--capacity-gib 8]

Targets (issue 32, GPU host): a GPT-2 small trial <= 5 s submit to result; a fit search
with a good prediction <= 20 s.
"""

import argparse
import statistics
import time
from typing import Any

import httpx
from service import running_service

TARGET_TRIAL_S = 5.0
TARGET_FIT_S = 20.0


def trial(client: httpx.Client, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    response = client.post("/v1/experiments", json=spec)
    response.raise_for_status()
    exp_id = response.json()["id"]
    while True:
        exp: dict[str, Any] = client.get(f"/v1/experiments/{exp_id}").json()
        if exp["status"] not in ("queued", "running"):
            return time.perf_counter() - began, exp
        time.sleep(0.02)


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
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else "cpu"
    params = {"model": args.model, "batch_size": args.batch, "seq_len": args.seq}
    spec = {"op": "model", "shape": [], "device": device, "params": params}
    times: list[float] = []
    with running_service(args.device) as client:
        for i in range(args.trials):
            took, exp = trial(client, spec)
            start = ((exp.get("result") or {}).get("environment") or {}).get("child_start")
            print(f"  trial {i}: {took:6.2f} s  {exp['status']}  child: {start}")
            times.append(took)
        fit_body = {
            "spec": {**spec, "params": {"model": args.model, "seq_len": args.seq}},
            "vary": "batch_size",
            "capacity_bytes": int(args.capacity_gib * 2**30),
        }
        began = time.perf_counter()
        fit = client.post("/v1/fits", json=fit_body)
        fit.raise_for_status()
        fit_id = fit.json()["id"]
        while True:
            shown = client.get(f"/v1/fits/{fit_id}").json()
            if shown["status"] not in ("queued", "running", "searching"):
                break
            time.sleep(0.1)
        fit_s = time.perf_counter() - began
    warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
    print(f"\n{args.model} trials (batch {args.batch}, seq {args.seq}) on {device}")
    print(f"{'':<36} {'seconds':>8} {'target':>8}")
    print(f"{'first trial, submit to result':<36} {times[0]:8.2f}")
    print(f"{'later trials (warm), median':<36} {warm:8.2f} {TARGET_TRIAL_S:8g}")
    print(f"{'fit search of batch_size':<36} {fit_s:8.2f} {TARGET_FIT_S:8g}   {shown['status']}")


if __name__ == "__main__":
    main()
