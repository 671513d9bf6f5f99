"""What held memory at the peak, by category, as the API and the page say it, for
snapshots recorded with Python frames alone (PyTorch's ``stacks="python"``)."""

import gzip
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.snapshots.loops import WORKSPACE, Recording, adam_loop, oom_in_backward
from tests.snapshots.synthetic import MiB, _frame, dumps
from tests.snapshots.test_import import imported


@pytest.fixture(scope="module")
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("categories")
    for url in fresh_database("sqlite", request, tmp):
        with LiveServer(make_settings(url)) as live, httpx.Client(base_url=live.url) as c:
            yield c


def by_category(snap: dict[str, Any]) -> dict[str, int]:
    return {c["category"]: c["bytes"] for c in snap["categories"]}


def test_gradients_made_on_autograds_thread_are_gradients(client: httpx.Client) -> None:
    snapshot, truth = adam_loop()
    snap = imported(client, gzip.compress(dumps(snapshot)))
    assert snap["peak"]["allocated"] == sum(truth.values())
    # Both cuBLAS workspaces (the main thread's and autograd's) are temporaries.
    assert by_category(snap) == truth
    page = client.get(f"/ui/snapshots/{snap['id']}").text
    table = page[page.index('<table id="categories">') :]
    table = table[: table.index("</table>")]
    rows = {
        cells[0]: cells[1]
        for cells in (
            [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>.*?</td>", row, re.S)]
            for row in re.findall(r"<tr>.*?</tr>", table, re.S)
        )
        if cells
    }
    assert rows["gradients"] == "2.0 MiB"
    # A block made on autograd's thread has no frames: its row says what placed it.
    assert "<i>no frames recorded; freed inside Optimizer.zero_grad</i>" in page


def reasons(snap: dict[str, Any], category: str) -> dict[str, int]:
    (row,) = [c for c in snap["categories"] if c["category"] == category]
    return {r["reason"]: r["bytes"] for r in row["reasons"]}


def test_frees_with_their_allocations_stack_leave_the_time_order(client: httpx.Client) -> None:
    # context="alloc": no free says where it was called, so zero_grad is not seen; the
    # gradients are still the blocks made on autograd's thread that outlived the backward.
    snapshot, truth = adam_loop(context="alloc")
    snap = imported(client, dumps(snapshot))
    assert by_category(snap) == truth
    assert list(reasons(snap, "gradients")) == [
        "made with no frames between a backward call and its return (autograd's thread), "
        "alive after that backward returned"
    ]
    # Its temporaries were freed before that backward returned; none is alive at the peak.
    assert "freed before it returned" not in str(reasons(snap, "temporaries"))


def test_gradients_kept_by_zero_grad_without_set_to_none(client: httpx.Client) -> None:
    snapshot, truth = adam_loop(set_to_none=False, param=2 * MiB)
    snap = imported(client, dumps(snapshot))
    assert by_category(snap) == truth
    # A 1 MiB gradient made right after autograd's cuBLAS workspace, never freed, is also
    # what cuBLASLt's workspace looks like with no frames: unknown, not a guess.
    snapshot, truth = adam_loop(set_to_none=False, param=MiB)
    snap = imported(client, dumps(snapshot))
    assert by_category(snap) == {**truth, "gradients": MiB, "unknown": MiB}
    assert list(reasons(snap, "unknown")) == [
        "1 MiB made with no frames right after a cuBLAS workspace, never freed "
        "(cuBLASLt's workspace or a gradient)"
    ]


def test_gradient_accumulation(client: httpx.Client) -> None:
    # Made in the first micro-batch's backward, alive through the next ones and the step.
    snapshot, truth = adam_loop(accumulate=3, context="alloc")
    assert by_category(imported(client, dumps(snapshot))) == truth


def test_a_checkpointed_forward_recomputed_in_backward(client: httpx.Client) -> None:
    # Autograd's thread records the recomputed forward's Python frames: that is still
    # inside the backward, so the frameless gradients after it are still autograd's.
    snapshot, truth = adam_loop(checkpoint=True, context="alloc")
    assert by_category(imported(client, dumps(snapshot))) == truth


def test_optimizer_state_is_what_outlives_its_step(client: httpx.Client) -> None:
    snapshot, truth = adam_loop(steps=3)
    snap = imported(client, dumps(snapshot))
    assert by_category(snap) == truth
    assert reasons(snap, "optimizer_state") == {
        "made in an optimizer step, alive after that step ended": truth["optimizer_state"]
    }
    assert reasons(snap, "temporaries")["made in an optimizer step, freed within it"] == 2 * MiB
    # One workspace per cuBLAS handle: the main thread's and autograd's.
    workspace = reasons(snap, "temporaries")[
        "33554432 bytes (a cuBLAS workspace's size), made where matmuls run, never freed"
    ]
    assert workspace == 2 * WORKSPACE


def test_unknown_says_why_in_the_api_and_on_the_page(client: httpx.Client) -> None:
    snapshot, truth = oom_in_backward()
    snap = imported(client, dumps(snapshot))
    assert by_category(snap) == truth
    why = reasons(snap, "unknown")
    autograd = "made with no frames between a backward call and its return (autograd's thread)"
    assert why == {
        f"{autograd}; the trace ends before it returned (a gradient or a temporary)": 2 * MiB
        + MiB // 4,
        "no frames, made outside any backward call (another thread or C++ code)": MiB // 4,
        "made in backward; the trace ends before it returned (a gradient or a temporary)": 512,
        "made in a forward, alive when the trace ended inside a later backward "
        "(saved for it, or an output still held)": MiB // 4,
    }
    by_block = {b["reason"] for b in snap["alive_at_peak"] if b["category"] == "unknown"}
    assert by_block == set(why)
    page = client.get(f"/ui/snapshots/{snap['id']}").text
    table = page[page.index('<table id="categories">') :]
    table = table[: table.index("</table>")].replace("&#39;", "'")
    assert all(reason in table for reason in why)
    assert "the evidence does not decide" in table


def test_a_matmul_in_the_programs_own_code_keeps_a_workspace(client: httpx.Client) -> None:
    # `x @ w` outside any module: its output, then its handle's workspace, by one stack.
    r = Recording()
    r.alloc(MiB, [_frame("train.py", 10, "main")])
    r.alloc(MiB, [_frame("train.py", 11, "main")])
    matmul = [_frame("train.py", 12, "main")]
    r.alloc(MiB, matmul)
    r.alloc(WORKSPACE, matmul, segment=True)
    # A buffer of the same size made by its own line is the program's.
    r.alloc(WORKSPACE, [_frame("train.py", 13, "main")], segment=True)
    snapshot = {"segments": [], "device_traces": [r.entries], "allocator_settings": {}}
    snap = imported(client, dumps(snapshot))
    cats = by_category(snap)
    assert (cats["temporaries"], cats["other"]) == (WORKSPACE, 3 * MiB + WORKSPACE)
