"""``vramlab record`` of real training programs on a GPU: the program behaves as it does
without the recording (its output, its exit status), record says how it ended, the
snapshot is uploaded (partial where the program did not end well) and its parameters,
gradients and optimizer state are recorded, not inferred."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.helpers import needs_cuda

pytestmark = needs_cuda()

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "snapshots" / "programs" / "train_modes.py"
RECORDED = ("parameters", "gradients", "optimizer_state")


def _record(server: LiveServer, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "record", "--api", server.url, "--", *command],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def _alone(*command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_RECORD")}
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=180, cwd=ROOT, env=env
    )


def _snapshot(client: httpx.Client, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    url = done.stdout.strip().splitlines()[-1]
    assert "/ui/snapshots/" in url, done.stderr[-3000:]
    snap: dict[str, Any] = client.get(f"/v1/snapshots/{url.rsplit('/', 1)[1]}").json()
    return snap


def test_record_a_training_loop(server: LiveServer, client: httpx.Client) -> None:
    done = _record(server, sys.executable, str(ROOT / "bench" / "record_example.py"), "--oom")
    assert done.returncode != 0  # the program ends with an OOM, and record says so
    snap = _snapshot(client, done)
    assert "oom" in snap["tags"] and snap["oom_count"] == 1
    assert snap["ooms"][0]["requested"] >= 2**50
    # Recording began before the first allocation: the replay is PyTorch's own figure.
    assert snap["memory"]["allocated_peak"] == snap["counters"]["allocated_peak"]
    cats = {c["category"]: c["bytes"] for c in snap["categories"]}
    assert cats["parameters"] > 0 and cats["optimizer_state"] > 0
    assert snap["environment"]["gpu_name"]


def test_record_never_breaks_non_reentrant_checkpointing(
    server: LiveServer, client: httpx.Client
) -> None:
    program = ROOT / "tests" / "snapshots" / "programs" / "checkpointed_train.py"
    done = _record(server, sys.executable, str(program))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    assert "non-reentrant activation checkpointing" in done.stderr
    snap = _snapshot(client, done)
    assert snap["environment"]["free_stacks"] is False
    assert "failed" not in snap["tags"]


# mode: how the program ends (its status alone; record's), and whether it leaves a
# snapshot that is partial.
ENDS = {
    "plain": (0, 0),
    "ckpt_reentrant": (0, 0),
    "ckpt_non_reentrant": (0, 0),
    "autocast": (0, 0),
    "scaler": (0, 0),
    "compile": (0, 0),
    "oom": (1, 1),
    "exit3": (3, 3),
    "sigterm": (-15, 143),
}


@pytest.mark.parametrize("mode", list(ENDS))
def test_record_behaves_as_the_program_and_records_categories(
    server: LiveServer, client: httpx.Client, mode: str
) -> None:
    alone = _alone(sys.executable, str(PROGRAM), mode)
    if mode == "compile" and alone.returncode != 0:
        pytest.skip(f"torch.compile does not run here: {alone.stderr.strip()[-300:]}")
    code, status = ENDS[mode]
    assert alone.returncode == code, alone.stderr[-3000:]
    done = _record(server, sys.executable, str(PROGRAM), mode)
    assert done.returncode == status, done.stderr[-3000:]
    # The program's own output is the same; record adds its two lines after it.
    assert done.stdout.startswith(alone.stdout), (alone.stdout, done.stdout)
    assert "trained" in done.stdout
    if code != 0:
        said = f"signal {-code}" if code < 0 else f"exited with code {code}"
        assert said in done.stderr and "marked partial" in done.stderr
    snap = _snapshot(client, done)
    assert snap["program_exit"] == code and snap["partial"] is (code != 0)
    assert ("oom" in snap["tags"]) is (mode == "oom")
    assert snap["categories_recorded"]["tensors"] > 0
    cats = {c["category"]: c for c in snap["categories"]}
    for name in RECORDED:
        assert cats[name]["inference"] is False
        assert cats[name]["recorded_bytes"] == cats[name]["bytes"]
    # The parameters, exactly: the program printed its own.
    params = int(alone.stdout.split("params ", 1)[1].split()[0])
    state = int(alone.stdout.split("state ", 1)[1].split()[0])
    assert cats["parameters"]["bytes"] == params
    assert cats["gradients"]["bytes"] <= params
    # AdamW's two moments per parameter (its step counts are CPU tensors): the peak is in
    # the second step's backward, all of them made. (A GradScaler may skip the first steps
    # while its scale is too large: then fewer, or none.)
    assert cats["optimizer_state"]["bytes"] <= state
    if mode != "scaler":
        assert cats["optimizer_state"]["bytes"] == state == 2 * params
    page = client.get(f"/ui/snapshots/{snap['id']}").text
    assert "recorded by the program itself" in page
    # The replayed peak is PyTorch's counter to the byte (a large request that took a
    # whole free block counts as the block: app/snapshots/blocks.py).
    assert snap["memory"]["allocated_peak"] == snap["counters"]["allocated_peak"]
    # The program's phases recorded: nothing is left to inference but workspaces.
    assert snap["phases_recorded"]["used"] is True
    assert cats["unknown"]["bytes"] == 0
    for name in ("activations", "other"):
        assert cats[name]["inference"] is False, cats[name]["reasons"]
