"""A fit search end to end on a GPU host: the API and a CUDA worker started as a user
starts them, then `POST /v1/fits` for GPT-2 small at sequence 1024 on an emulated 24 GiB
card with three variants, timed from submit to answer. Prints each variant's answer and
its trials, and the wall time beside the 3-minute goal:

    python -m bench.fit_gpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

GiB = 2**30
GOAL_S = 180.0
FIT = {
    "spec": {
        "op": "model",
        "shape": [],
        "device": "cuda",
        "params": {"model": "gpt2", "seq_len": 1024, "batch_size": 1},
    },
    "vary": "batch_size",
    "capacity_bytes": 24 * GiB,
    "variants": [{}, {"checkpointing": True}, {"precision": "bf16-autocast"}],
}


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    env = {
        **os.environ,
        "VRAMLAB_DATABASE_URL": f"sqlite:///{tmp / 'fit.db'}",
        "VRAMLAB_CLAIM_WAIT_SECONDS": "2",
        # The service's cap must leave room for the emulated card.
        "VRAMLAB_MAX_EXPERIMENT_BYTES": str(80 * GiB),
    }
    cli = [sys.executable, "-m", "app.cli"]
    api = subprocess.Popen(
        [*cli, "serve", "--port", "8799"],
        env=env,
        stdout=(tmp / "api.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        url = "http://127.0.0.1:8799"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        worker = subprocess.Popen(
            [*cli, "worker", "--api", url, "--device", "cuda"],
            env=env,
            stdout=(tmp / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        with httpx.Client(base_url=url, timeout=120) as client:
            for _ in range(600):  # the worker is live once it has registered
                if client.get("/v1/workers").json():
                    break
                time.sleep(0.2)
            started = time.perf_counter()
            accepted = client.post("/v1/fits", json=FIT)
            if accepted.status_code != 202:
                raise SystemExit(f"{accepted.status_code}: {accepted.text[:2000]}")
            fit_id = accepted.json()["id"]
            fit = accepted.json()
            while fit["status"] not in ("succeeded", "failed", "cancelled"):
                time.sleep(1)
                fit = client.get(f"/v1/fits/{fit_id}").json()
                if time.perf_counter() - started > 600:
                    break
            elapsed = time.perf_counter() - started
        print(json.dumps(fit, indent=1, default=str)[-6000:])
        print()
        print(
            "| variant | predicted max | max fitting | first failing | trials | prediction error |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for v in fit["variants"]:
            err = v.get("prediction_error")
            print(
                f"| {json.dumps(v['overrides'])} | {v['predicted_max_fitting']} | "
                f"{v['max_fitting']} | {v['first_failing']} | {len(v['trials'])} | "
                f"{'' if err is None else f'{err:+.1f}%'} |"
            )
        print(
            f"\nstatus {fit['status']}: {elapsed:.0f} s from submit to answer "
            f"({elapsed / GOAL_S:.2f}x the 3-minute goal)"
        )
    finally:
        for proc in (worker, api):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        print((tmp / "worker.log").read_text()[-1500:] if (tmp / "worker.log").exists() else "")


if __name__ == "__main__":
    main()
