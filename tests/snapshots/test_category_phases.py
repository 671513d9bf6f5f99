"""Categories where the phase a block was made in decides, as PyTorch's MemTracker labels a
tensor: a forward recomputed inside a backward (activation checkpointing), the Python
frames autograd's thread records as an ``autograd.Function``'s backward returns, and the
forward that ran out of memory. Synthetic ``stacks="python"`` snapshots, uploaded."""

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.snapshots.loops import (
    BACKWARD_RETURN,
    BATCH,
    LINEAR,
    LOSS,
    MAKE_GRADS,
    NONE,
    PROGRAM,
    RECOMPUTE,
    TO,
    WORKSPACE,
    Recording,
)
from tests.snapshots.synthetic import MiB, _frame, dumps
from tests.snapshots.test_import import imported

# Reentrant checkpointing: the Function's backward runs a backward of its own, whose
# allocations carry these frames (autograd's thread, from the Function's apply down).
APPLY = [_frame("torch/autograd/function.py", 307, "apply")]
CKPT_BACKWARD = [
    _frame("torch/autograd/graph.py", 829, "_engine_run_backward"),
    _frame("torch/autograd/__init__.py", 364, "backward"),
    _frame("torch/utils/checkpoint.py", 319, "backward"),
    *APPLY,
]
PARAM = MiB // 2


@pytest.fixture(scope="module")
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("phases")
    for url in fresh_database("sqlite", request, tmp):
        with LiveServer(make_settings(url)) as live, httpx.Client(base_url=live.url) as c:
            yield c


def upload(client: httpx.Client, r: Recording) -> dict[str, Any]:
    snapshot = {"segments": [], "device_traces": [r.entries], "allocator_settings": {}}
    return imported(client, dumps(snapshot))


def by_category(snap: dict[str, Any]) -> dict[str, int]:
    return {c["category"]: c["bytes"] for c in snap["categories"]}


def block(snap: dict[str, Any], size: int) -> tuple[str, str]:
    """The category and reason of the one block of ``size`` alive at the peak."""
    (found,) = [b for b in snap["alive_at_peak"] if b["size"] == size]
    return found["category"], found["reason"]


def forward_and_seed(r: Recording) -> tuple[int, int, int, int]:
    """Two parameters, a batch, a forward (its output saved), the loss and the backward's
    seed: the batch's, the output's, the loss's and the seed's addresses."""
    for _ in range(2):
        r.alloc(PARAM, TO)
    x = r.alloc(MiB // 4, BATCH)
    r.alloc(WORKSPACE, LINEAR, segment=True)  # the main thread's cuBLAS workspace
    out = r.alloc(2 * MiB, LINEAR)
    loss = r.alloc(512, LOSS)
    seed = r.alloc(4, MAKE_GRADS)
    return x, out, loss, seed


def backward_returns(r: Recording, x: int, loss: int, seed: int) -> None:
    for _ in range(2):
        r.alloc(PARAM, NONE)  # the parameters' gradients, kept
    r.free(seed, 4, BACKWARD_RETURN)
    r.free(loss, 512, PROGRAM)
    r.free(x, MiB // 4, PROGRAM)


def test_a_forward_recomputed_in_backward_is_activations(client: httpx.Client) -> None:
    # Non-reentrant checkpointing: autograd's thread recomputes the layer's forward (its
    # Python frames recorded) while the main thread waits in backward; MemTracker counts
    # what the recompute made as activations. Its cuBLASLt workspace (1 MiB, autograd's
    # thread's first cuBLASLt matmul, not right after that thread's cuBLAS workspace) is
    # kept for the process.
    r = Recording()
    x, out, loss, seed = forward_and_seed(r)
    r.alloc(WORKSPACE, NONE, segment=True)  # autograd's thread's cuBLAS workspace
    again = r.alloc(4 * MiB, RECOMPUTE)
    r.alloc(MiB, RECOMPUTE)  # cuBLASLt's, never freed
    tmp = r.alloc(3 * MiB, NONE)  # the peak: the recomputed output is alive
    r.free(tmp, 3 * MiB, NONE)
    r.free(again, 4 * MiB, NONE)
    r.free(out, 2 * MiB, NONE)
    backward_returns(r, x, loss, seed)
    snap = upload(client, r)
    assert block(snap, 4 * MiB) == (
        "activations",
        "made in a forward recomputed inside a backward (activation checkpointing)",
    )
    assert block(snap, MiB) == (
        "temporaries",
        "1 MiB made in a forward recomputed inside a backward, kept after that backward "
        "returned (cuBLASLt's workspace of autograd's thread)",
    )
    cats = by_category(snap)
    assert cats["activations"] == 4 * MiB + 2 * MiB  # the recompute and the saved output
    # Both cuBLAS workspaces, cuBLASLt's, the backward's temporary and its seed.
    assert cats["temporaries"] == 2 * WORKSPACE + MiB + 3 * MiB + 512
    assert cats["unknown"] == 0


def test_a_recomputed_block_kept_into_an_unfinished_backward_is_unknown(
    client: httpx.Client,
) -> None:
    # The trace ends inside the backward: the recompute's 1 MiB may still be in use.
    r = Recording()
    forward_and_seed(r)
    r.alloc(WORKSPACE, NONE, segment=True)
    r.alloc(4 * MiB, RECOMPUTE)
    r.alloc(MiB, RECOMPUTE)
    snap = upload(client, r)
    assert block(snap, MiB)[0] == block(snap, 4 * MiB)[0] == "unknown"


def test_what_a_functions_backward_frees_as_it_returns_is_still_backward(
    client: httpx.Client,
) -> None:
    # Reentrant checkpointing: the Function's backward returns (a free whose only frame is
    # torch/autograd/function.py's apply, on autograd's thread), then the engine frees,
    # with no frames, the input's gradient that its inner backward made; all before
    # Tensor.backward returned, so that gradient was a temporary, no parameter's.
    r = Recording()
    x, out, loss, seed = forward_and_seed(r)
    grad_in = r.alloc(3 * MiB, CKPT_BACKWARD)
    big = r.alloc(4 * MiB, CKPT_BACKWARD)  # the peak
    r.free(big, 4 * MiB, CKPT_BACKWARD)
    r.free(out, 2 * MiB, APPLY)
    r.free(grad_in, 3 * MiB, NONE)
    backward_returns(r, x, loss, seed)
    snap = upload(client, r)
    assert block(snap, 3 * MiB) == ("temporaries", "made in backward, freed before it returned")
    assert by_category(snap)["gradients"] == 0


OOM_REASON = (
    "made in the forward that ran out of memory (no backward came to tell saved from "
    "temporary: a forward's tensors, as PyTorch's MemTracker counts them)"
)


@pytest.mark.parametrize("unwound", [False, True])
def test_the_forward_that_ran_out_of_memory_holds_activations(
    client: httpx.Client, unwound: bool
) -> None:
    # A forward runs out of memory: what it made and still held at the peak is counted as
    # MemTracker counts a forward's tensors, whether the snapshot was taken at the error
    # (kept) or after the exception unwound (freed), and whether freed before the error.
    r = Recording()
    for _ in range(2):
        r.alloc(PARAM, TO)
    x = r.alloc(MiB // 4, BATCH)
    r.alloc(WORKSPACE, LINEAR, segment=True)
    h1 = r.alloc(8 * MiB, LINEAR)
    h2 = r.alloc(4 * MiB, LINEAR)  # the peak
    r.free(h1, 8 * MiB, LINEAR)  # consumed by the next layer
    h3 = r.alloc(2 * MiB, LINEAR)
    r._add("oom", 0, 64 * MiB, LINEAR)
    if unwound:
        for addr, size in ((h3, 2 * MiB), (h2, 4 * MiB), (x, MiB // 4)):
            r.free(addr, size, PROGRAM)
    snap = upload(client, r)
    assert block(snap, 8 * MiB) == block(snap, 4 * MiB) == ("activations", OOM_REASON)
    cats = by_category(snap)
    assert (cats["activations"], cats["temporaries"], cats["unknown"]) == (12 * MiB, WORKSPACE, 0)


def test_a_forward_before_a_finished_step_is_not_the_failing_forwards(
    client: httpx.Client,
) -> None:
    # The output of a forward whose backward ran, kept by the program into the next
    # forward that runs out of memory: not that forward's, so not an activation by it.
    r = Recording()
    x, out, loss, seed = forward_and_seed(r)
    held = r.alloc(3 * MiB, LINEAR)  # kept by the program
    r.free(out, 2 * MiB, NONE)
    backward_returns(r, x, loss, seed)
    r.alloc(MiB // 4, BATCH)
    r.alloc(4 * MiB, LINEAR)
    r._add("oom", 0, 64 * MiB, LINEAR)
    snap = upload(client, r)
    assert held and block(snap, 3 * MiB)[0] == "unknown"
    assert block(snap, 4 * MiB) == ("activations", OOM_REASON)
