"""Categories recorded from inside the program (``vramlab record``'s tensor identities,
``vramlab_categories``) and what the import makes of them: the truth at the peak for
parameters, gradients and optimizer state, preferred to inference, said so on the page."""

import pickle
from typing import Any

import httpx
import pytest

from tests.snapshots.synthetic import MiB, dumps, training_snapshot
from tests.snapshots.test_import import imported, post

torch = pytest.importorskip("torch")

from tests.snapshots.cpu_recording import record  # noqa: E402

RECORDED = ("parameters", "gradients", "optimizer_state")
# optimizer, set_to_none, micro-batches a step, checkpointing
LOOPS = [
    ("adamw", True, 1, ""),
    ("adamw", False, 1, ""),
    ("adamw", True, 3, ""),
    ("sgd", True, 1, ""),
    ("adamw", True, 1, "reentrant"),
    ("adamw", True, 1, "non_reentrant"),
]


class Checkpointed(torch.nn.Module):
    """A Linear, then a TransformerEncoderLayer under activation checkpointing."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = torch.nn.Linear(64, 64)
        self.layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)

    def forward(self, x: Any) -> Any:
        h = self.inp(x.view(8, 8, 64))
        return torch.utils.checkpoint.checkpoint(self.layer, h, use_reentrant=self.reentrant)


def _loop(optimizer: str, set_to_none: bool, micro: int, checkpoint: str = "") -> tuple[Any, Any]:
    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model: Any
        if checkpoint:
            model = Checkpointed(checkpoint == "reentrant")
        else:
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 256),
                torch.nn.ReLU(),
                torch.nn.Linear(256, 256),
                torch.nn.BatchNorm1d(256),
            )
        params = model.parameters()
        if optimizer == "sgd":
            return model, torch.optim.SGD(params, lr=0.01, momentum=0.9)
        return model, torch.optim.AdamW(params)

    def train(model: Any, opt: Any, rec: Any) -> None:
        """The loop, saying its phase to the recording (``rec.phase``) as it goes."""
        for _ in range(3):
            for _ in range(micro):
                rec.phase = "outside"
                x = torch.randn(64, 64 if checkpoint else 256)
                rec.phase = "forward"  # from the model's call to the backward: the loss too
                loss = model(x).square().mean()
                rec.phase = "backward"
                loss.backward()
            rec.phase = "step"
            opt.step()
            rec.phase = "outside"
            opt.zero_grad(set_to_none=set_to_none)

    return build, train


@pytest.mark.parametrize(("optimizer", "set_to_none", "micro", "checkpoint"), LOOPS)
def test_recorded_categories_are_the_truth_at_the_peak(
    client: httpx.Client, optimizer: str, set_to_none: bool, micro: int, checkpoint: str
) -> None:
    snap, truth, marks = record(*_loop(optimizer, set_to_none, micro, checkpoint))
    assert marks.errors == 0 and truth["parameters"] > 0
    out = imported(client, pickle.dumps(snap), name="cpu loop")
    cats = {c["category"]: c for c in out["categories"]}
    assert {k: cats[k]["bytes"] for k in RECORDED} == {k: truth[k] for k in RECORDED}
    for name in RECORDED:
        assert cats[name]["inference"] is False and cats[name]["rule"].startswith("recorded")
        assert cats[name]["recorded_bytes"] == cats[name]["bytes"]
    assert out["categories_recorded"] == {
        "tensors": len(marks.entries),
        "matched_by_time": True,
        "truncated": False,
        "hook_errors": 0,
    }
    recorded = [b for b in out["alive_at_peak"] if b["recorded"]]
    assert recorded and all(b["reason"].startswith("recorded: ") for b in recorded)


@pytest.mark.parametrize(("optimizer", "set_to_none", "micro", "checkpoint"), LOOPS)
def test_recorded_phases_make_every_category_the_truth_at_the_peak(
    client: httpx.Client, optimizer: str, set_to_none: bool, micro: int, checkpoint: str
) -> None:
    """With the program's phases recorded, activations, temporaries and other are what
    the program itself says it was doing when each block alive at the peak was made (a
    forward recomputed in a backward for checkpointing: activations), not inference."""
    snap, truth, marks = record(*_loop(optimizer, set_to_none, micro, checkpoint), True)
    assert marks.errors == 0 and snap["vramlab_phases"]["errors"] == 0
    out = imported(client, pickle.dumps(snap), name="cpu loop, phases")
    cats = {c["category"]: c for c in out["categories"]}
    assert {c: cats[c]["bytes"] for c in truth} == truth
    assert cats["unknown"]["bytes"] == 0 and truth["activations"] > 0
    for name in (*RECORDED, "activations", "temporaries", "other"):
        assert cats[name]["inference"] is False and cats[name]["rule"].startswith("recorded")
    assert out["phases_recorded"]["used"] is True and out["phases_recorded"]["problem"] is None
    assert all(b["recorded"] for b in out["alive_at_peak"])


def test_phases_that_cannot_be_tied_to_the_trace_are_not_used(client: httpx.Client) -> None:
    """Allocation counts that go back (the program reset PyTorch's counters) or do not fit
    the trace: the categories are inferred as without phases, and the summary says why."""
    snap, _, _ = record(*_loop("adamw", True, 1, ""), True)
    plain = imported(client, pickle.dumps({k: v for k, v in snap.items() if k != "vramlab_phases"}))
    for change, problem in (
        (lambda p: p["marks"].append(["step_start", 0, 0]), "go back"),
        (lambda p: p.update(allocations_at_dump=1), "do not fit"),
        (lambda p: p.update(device=1), "device 1"),
    ):
        phases = pickle.loads(pickle.dumps(snap["vramlab_phases"]))
        change(phases)
        out = imported(client, pickle.dumps({**snap, "vramlab_phases": phases}))
        assert problem in out["phases_recorded"]["problem"]
        assert out["phases_recorded"]["used"] is False
        assert out["categories"] == plain["categories"]


@pytest.mark.parametrize(
    "phases",
    [
        "not a dict",
        {"marks": "no"},
        {"marks": [["forward_start", 1]]},
        {"marks": [["lunch", 1, 0]]},
        {"marks": [["forward_start", -1, 0]]},
        {"marks": [["forward_start", True, 0]]},
    ],
)
def test_malformed_phases_are_refused(client: httpx.Client, phases: Any) -> None:
    snap = training_snapshot(iterations=1, layers=2)
    snap["vramlab_phases"] = phases
    response = post(client, dumps(snap))
    assert response.status_code == 422, response.text
    assert "vramlab_phases" in response.text


def test_the_time_of_a_sighting_tells_blocks_at_one_address_apart(
    client: httpx.Client,
) -> None:
    """A gradient freed by zero_grad, and its address reused by the next forward's block,
    alive at the peak: the sighting of the gradient belongs to the first block only. Matched
    by address alone (a recording whose clock is not the trace's) it would not."""
    t, addr, size = 1_700_000_000_000_000, 0x7F0000000000, MiB

    def entry(action: str, at: int, a: int = addr) -> dict[str, Any]:
        return {"action": action, "addr": a, "size": size, "stream": 0, "time_us": at}

    trace = [
        entry("alloc", t),  # the gradient
        entry("free_requested", t + 10),
        entry("free_completed", t + 10),
        entry("alloc", t + 20),  # the next forward's block, at the same address
        entry("alloc", t + 30, addr + MiB),
    ]
    snap: dict[str, Any] = {"segments": [], "device_traces": [trace]}
    snap["vramlab_categories"] = {
        "clock": "unix_us",
        "tensors": [[addr, size, "gradients", t + 5, t + 5]],
    }
    timed = imported(client, dumps(snap), name="timed")
    snap["vramlab_categories"]["clock"] = "unknown"
    untimed = imported(client, dumps(snap), name="untimed")
    assert untimed["categories_recorded"]["matched_by_time"] is False

    def gradients(out: dict[str, Any]) -> int:
        return next(c["bytes"] for c in out["categories"] if c["category"] == "gradients")

    assert timed["peak"]["allocated"] == 2 * MiB
    assert gradients(timed) == 0
    assert gradients(untimed) == MiB


def _with_marks(rows: list[list[Any]]) -> dict[str, Any]:
    snap = training_snapshot(iterations=3, layers=4)
    snap["vramlab_categories"] = {"version": 1, "clock": "unix_us", "tensors": rows}
    return snap


def test_recorded_categories_win_over_inference_for_the_blocks_they_cover(
    client: httpx.Client,
) -> None:
    snap = training_snapshot(iterations=3, layers=4)
    entries = snap["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    params = [e for e in allocs if e["frames"][0]["name"] == "convert"]
    end = entries[-1]["time_us"]
    rows: list[list[Any]] = [
        [e["addr"], e["size"], "parameters", e["time_us"], end] for e in params
    ]
    # The first iteration's first activation, seen (say) as a gradient while it lived: the
    # recording wins over the rules for that block only.
    first_act = next(e for e in allocs if e["frames"][0]["name"] == "forward")
    rows.append(
        [first_act["addr"], first_act["size"], "gradients", first_act["time_us"] + 1] * 1
        + [first_act["time_us"] + 2]
    )
    out = imported(client, dumps(_with_marks(rows)), name="marked")
    cats = {c["category"]: c for c in out["categories"]}
    assert cats["parameters"]["bytes"] == 4 * MiB and not cats["parameters"]["inference"]
    # That activation was freed in the first backward: not alive at the peak, so it changes
    # nothing there; the optimizer state, which the program did not record, is "other" by
    # its rule's own words, never a confident optimizer state.
    assert cats["gradients"]["bytes"] == 0
    assert cats["optimizer_state"]["bytes"] == 0
    assert cats["other"]["bytes"] == 8 * MiB + 1 * MiB  # the state and the live gradient
    reasons = {r["reason"] for r in cats["other"]["reasons"]}
    assert any("no optimizer state of the program's lived here" in r for r in reasons)
    assert cats["activations"]["bytes"] == 8 * MiB and cats["activations"]["inference"]
    page = client.get(f"/ui/snapshots/{out['id']}").text
    assert "recorded by the program itself" in page and "<b>recorded</b>" in page


def test_a_sighting_outside_a_blocks_life_is_not_that_block(client: httpx.Client) -> None:
    snap = training_snapshot(iterations=3, layers=4)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    params = [e for e in allocs if e["frames"][0]["name"] == "convert"]
    before = params[0]["time_us"] - 10  # seen at that address before this block was made
    rows = [[params[0]["addr"], params[0]["size"], "gradients", before, before]]
    out = imported(client, dumps(_with_marks(rows)), name="early")
    cats = {c["category"]: c["bytes"] for c in out["categories"]}
    assert cats["gradients"] == 0
    assert cats["other"] == 4 * MiB + 8 * MiB + 1 * MiB  # no recorded parameter: other


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"tensors": "x"},
        {"tensors": [[1, 2, "parameters", 0]]},
        {"tensors": [[1, 2, "activations", 0, 0]]},
        {"tensors": [["1", 2, "gradients", 0, 0]]},
        {"tensors": [[1, 2, "gradients", "now", 0]]},
    ],
)
def test_malformed_recorded_categories_are_refused(client: httpx.Client, bad: Any) -> None:
    snap = training_snapshot(iterations=1, layers=1)
    snap["vramlab_categories"] = bad
    response = post(client, dumps(snap))
    assert response.status_code == 422, response.text
    assert "vramlab_categories" in response.json()["error"]["message"]


def _recorded(layers: int) -> dict[str, Any]:
    """A synthetic training snapshot whose program recorded its parameters and state."""
    snap = training_snapshot(iterations=3, layers=layers)
    entries = snap["device_traces"][0]
    end = entries[-1]["time_us"]
    kinds = {"convert": "parameters", "_init_group": "optimizer_state"}
    rows = [
        [e["addr"], e["size"], kinds[e["frames"][0]["name"]], e["time_us"] + 1, end]
        for e in entries
        if e["action"] == "alloc" and e["frames"][0]["name"] in kinds
    ]
    snap["vramlab_categories"] = {"clock": "unix_us", "tensors": rows}
    return snap


def test_compare_says_which_categories_were_recorded(client: httpx.Client) -> None:
    small = imported(client, dumps(_recorded(2)), name="small")["id"]
    big = imported(client, dumps(_recorded(4)), name="big")["id"]
    out = client.get("/v1/compare", params={"ids": f"{small},{big}"}).json()
    assert out["summary"][0].endswith(", 4.0 MiB of it optimizer state (recorded)")
    # Against a snapshot that recorded nothing, the same difference is an inference.
    plain = imported(client, dumps(training_snapshot(iterations=3, layers=2)), name="p")["id"]
    out = client.get("/v1/compare", params={"ids": f"{plain},{big}"}).json()
    assert out["summary"][0].endswith(", 4.0 MiB of it optimizer state (inferred)")


def test_phases_decide_a_kept_forward_block_but_not_a_workspace(client: httpx.Client) -> None:
    """A forward's output still held after a backward began is `unknown` to inference (an
    output still held, or a workspace); with the phases recorded it is an activation.
    cuBLAS's 32 MiB workspace, made in the same forward and kept, stays a workspace."""
    t, base = 1_700_000_000_000_000, 0x7F0000000000
    forward = [{"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward"}]
    backward = [{"filename": "torch/autograd/__init__.py", "line": 350, "name": "backward"}]
    step = [{"filename": "torch/optim/adam.py", "line": 230, "name": "step"}]

    def entry(action: str, addr: int, size: int, at: int, frames: Any) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t + at,
                "frames": frames}  # fmt: skip

    trace = [
        entry("alloc", base, 32 * MiB, 0, forward),
        entry("alloc", base + 32 * MiB, 2 * MiB, 1, forward),
        entry("alloc", base + 34 * MiB, 4 * MiB, 2, backward),
        entry("free_requested", base + 34 * MiB, 4 * MiB, 3, backward),
        entry("free_completed", base + 34 * MiB, 4 * MiB, 3, backward),
        entry("alloc", base + 38 * MiB, 4 * MiB, 4, step),  # the backward has returned
        entry("free_requested", base + 38 * MiB, 4 * MiB, 5, step),
        entry("free_completed", base + 38 * MiB, 4 * MiB, 5, step),
    ]
    snap: dict[str, Any] = {"segments": [], "device_traces": [trace]}
    inferred = {c["category"]: c for c in imported(client, dumps(snap))["categories"]}
    assert inferred["unknown"]["bytes"] == 2 * MiB  # what the phases settle
    snap["vramlab_phases"] = {
        "device": 0,
        "marks": [
            ["forward_start", 0, t],
            ["forward_end", 2, t],
            ["backward_start", 2, t],
            ["backward_end", 3, t],
            ["step_start", 3, t],
            ["step_end", 4, t],
        ],
        "allocations_at_dump": 4,
    }
    cats = {c["category"]: c for c in imported(client, dumps(snap))["categories"]}
    assert cats["activations"]["bytes"] == 2 * MiB and cats["unknown"]["bytes"] == 0
    assert cats["temporaries"]["bytes"] == 4 * MiB + 32 * MiB
    assert any("workspace" in r["reason"] for r in cats["temporaries"]["reasons"])
