"""Real snapshots made on a GPU host by bench/make_snapshots.py (tests/snapshots/data):
what vramlab replays agrees with PyTorch's own counters, and PyTorch's viewer code reads
the memory_viz export back."""

import json
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.snapshots.test_import import imported

DATA = Path(__file__).resolve().parent / "data"


def expected() -> dict[str, dict[str, Any]]:
    path = DATA / "expected.json"
    if not path.exists():
        return {}
    return {row["case"]: row for row in json.loads(path.read_text())}


CASES = expected()
needs_data = pytest.mark.skipif(not CASES, reason="run bench/make_snapshots.py on a GPU host")


def _import(client: httpx.Client, case: str) -> dict[str, Any]:
    return imported(client, (DATA / f"{case}.pickle.gz").read_bytes(), name=case)


@needs_data
@pytest.mark.parametrize("case", ["train_all", "train_python", "oom"])
def test_replayed_peak_is_pytorchs(client: httpx.Client, case: str) -> None:
    want = CASES[case]
    snap = _import(client, case)
    assert snap["entries"] == want["entries"]
    assert snap["pre_trace"]["blocks"] == 0
    assert snap["memory"]["allocated_peak"] == want["allocated_peak"]
    assert snap["memory"]["allocated_after"] == want["allocated_current"]
    assert snap["segments"]["allocated"] == want["allocated_current"]
    assert snap["oom_count"] == want["num_ooms"]


@needs_data
def test_a_ring_buffer_that_dropped_entries(client: httpx.Client) -> None:
    want = CASES["ring"]
    snap = _import(client, "ring")
    assert snap["entries"] == 300
    # What the dropped entries had allocated is counted from the start.
    assert snap["pre_trace"]["blocks"] > 0
    assert snap["memory"]["allocated_after"] == want["allocated_current"]
    assert snap["memory"]["allocated_peak"] <= want["allocated_peak"]


def _blocks(*sizes: int) -> int:
    return sum((n + 511) // 512 * 512 for n in sizes)


# Three Linear layers 256-256-256-10 in float32: weights and biases, as the allocator's
# blocks (rounded up to 512 bytes).
PARAMS = _blocks(*[4 * 256 * 256, 4 * 256] * 2, 4 * 256 * 10, 4 * 10)
WORKSPACE = 32 * 2**20  # cuBLAS's, one for the forward's handle, one for autograd's thread
LT_WORKSPACE = 2**20  # cuBLASLt's, the main thread's
BATCH = _blocks(4 * 64 * 256, 8 * 64, 4)  # the inputs, the targets, the loss


@needs_data
def test_categories_of_a_training_loop(client: httpx.Client) -> None:
    snap = _import(client, "train_all")
    cats = {c["category"]: (c["bytes"], c["blocks"]) for c in snap["categories"]}
    # The peak is in the first optimizer step: Adam's two moments are being made.
    assert cats["parameters"] == (PARAMS, 6)
    assert cats["gradients"] == (PARAMS, 6)
    assert cats["optimizer_state"] == (2 * PARAMS, 12)
    # The multi-tensor step's intermediates and the workspaces (seen in C++ frames): cuBLAS's
    # of both threads' handles and the main thread's cuBLASLt one.
    assert cats["temporaries"][0] == 2 * WORKSPACE + LT_WORKSPACE + PARAMS
    assert cats["other"] == (BATCH, 3) and cats["unknown"] == (0, 0)
    assert sum(b for b, _ in cats.values()) == snap["peak"]["allocated"]
    # The page names where blocks came from, past the recorder's and allocator's frames.
    page = client.get(f"/ui/snapshots/{snap['id']}").text
    assert "site-packages/torch/optim/adam.py" in page and "torch::unwind" not in page


@needs_data
def test_python_frames_alone_say_what_cpp_frames_say(client: httpx.Client) -> None:
    # Autograd's thread records no Python frames: its gradients are known by their frees
    # (inside zero_grad) and its cuBLAS workspace by its size, made between backward's call
    # and its return, so the same run recorded both ways reads the same.
    python = _import(client, "train_python")
    cats = {c["category"]: (c["bytes"], c["blocks"]) for c in python["categories"]}
    full = _import(client, "train_all")
    assert cats == {c["category"]: (c["bytes"], c["blocks"]) for c in full["categories"]}
    assert cats["gradients"] == (PARAMS, 6)
    reasons = {r["reason"] for c in python["categories"] for r in c["reasons"]}
    assert "freed inside Optimizer.zero_grad" in reasons


@needs_data
def test_memory_viz_export_reads_in_pytorchs_viewer(client: httpx.Client) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    sid = _import(client, "train_all")["id"]
    back = pickle.loads(
        client.get(f"/v1/snapshots/{sid}/trace", params={"format": "memory_viz"}).content
    )
    import gzip

    original = pickle.loads(gzip.decompress((DATA / "train_all.pickle.gz").read_bytes()))
    keys = ("action", "addr", "size", "stream", "frames")
    got = [{k: e[k] for k in keys} for e in back["device_traces"][0]]
    assert got == [{k: e.get(k) for k in keys} for e in original["device_traces"][0]]
    assert memory_viz.segsum(back) == memory_viz.segsum(original)
    assert "<html>" in memory_viz.trace_plot(back).lower()
