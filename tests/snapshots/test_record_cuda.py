"""``vramlab record`` of a real training loop on a GPU: the bootstrap records, dumps at
exit, and vramlab's replay agrees with PyTorch's own counters."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cuda
def test_record_a_training_loop(server: LiveServer, client: httpx.Client) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "record",
            "--api",
            server.url,
            "--name",
            "mlp",
            "--",
            sys.executable,
            str(ROOT / "bench" / "record_example.py"),
            "--oom",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode != 0  # the program ends with an OOM, and record says so
    assert done.stdout.strip(), done.stderr[-3000:]
    snap_id = done.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    snap = client.get(f"/v1/snapshots/{snap_id}").json()
    assert "oom" in snap["tags"] and snap["oom_count"] == 1
    assert snap["ooms"][0]["requested"] >= 2**50
    # Recording began before the first allocation: the replay is PyTorch's own figure.
    assert snap["memory"]["allocated_peak"] == snap["counters"]["allocated_peak"]
    cats = {c["category"]: c["bytes"] for c in snap["categories"]}
    assert cats["parameters"] > 0 and cats["optimizer_state"] > 0
    assert snap["environment"]["gpu_name"]


@pytest.mark.cuda
def test_record_never_breaks_non_reentrant_checkpointing(
    server: LiveServer, client: httpx.Client
) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    program = ROOT / "tests" / "snapshots" / "programs" / "checkpointed_train.py"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "record",
            "--api",
            server.url,
            "--",
            sys.executable,
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    assert "non-reentrant activation checkpointing" in done.stderr
    snap_id = done.stdout.strip().splitlines()[-1].rsplit("/", 1)[1]
    snap = client.get(f"/v1/snapshots/{snap_id}").json()
    assert snap["environment"]["free_stacks"] is False
    assert "failed" not in snap["tags"]
