"""Model experiments end to end: `vramlab serve` predicts the spec before it queues, a CPU
`vramlab worker` runs a tiny transformers model's steps, and the result says what held
memory at the reported step's peak. Tiny configs keep this fast."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from html import unescape
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.procs import VRAMLAB, env_for, stop, wait_done, wait_ready
from vramlab.contract import CATEGORY_KEYS
from vramlab.units import human_bytes

pytestmark = [pytest.mark.slow]
pytest.importorskip("transformers")

CAP = 256 * 2**20  # the service's experiment cap in these tests


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("models")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_for(
        f"sqlite:///{tmp / 'models.db'}",
        VRAMLAB_CLAIM_WAIT_SECONDS="5",
        VRAMLAB_MAX_EXPERIMENT_BYTES=str(CAP),
    )
    api = subprocess.Popen(
        [*VRAMLAB, "serve", "--port", str(port)],
        env=env,
        stdout=(tmp / "api.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_ready(url, api)
        worker = subprocess.Popen(
            [*VRAMLAB, "worker", "--api", url, "--device", "cpu", "--name", "models"],
            env=env,
            stdout=(tmp / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        yield url
    finally:
        if worker is not None:
            stop(worker)
        stop(api)


def model(**params: Any) -> dict[str, Any]:
    return {"op": "model", "shape": [], "device": "cpu", "params": params}


def run(client: httpx.Client, **params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    accepted = client.post("/v1/experiments", json=model(**params))
    assert accepted.status_code == 202, accepted.text
    return accepted.json(), wait_done(client, accepted.json()["id"], seconds=240)


def test_a_training_step_is_predicted_measured_and_split_by_category(service: str) -> None:
    with httpx.Client(base_url=service, timeout=180) as client:
        accepted, done = run(client, model="tiny-gpt2", batch_size=4, seq_len=32)
    predicted = accepted["prediction"]
    assert predicted["peak_allocated"] > 0
    assert set(predicted["categories"]) >= {"parameters", "optimizer_state", "activations"}
    assert done["status"] == "succeeded", done.get("error")
    result = done["result"]
    figures = result["model"]
    assert figures["task"] == "train" and figures["reported_step"] == 2
    assert [s["step"] for s in figures["steps"]] == [1, 2]
    assert [p["name"] for p in figures["steps"][1]["phases"]] == [
        "forward",
        "backward",
        "optimizer",
    ]
    # Step 2 holds the optimizer's state that step 1 made.
    assert figures["peak_allocated"] >= figures["steps"][0]["peak_allocated"]
    cats = result["categories"]
    assert set(cats) <= set(CATEGORY_KEYS)
    assert sum(cats.values()) == figures["peak_allocated"]
    # Parameters and AdamW's two moments, by identity: state is twice the weights.
    assert cats["parameters"] == figures["parameter_bytes"] > 0
    assert figures["gradient_bytes"] == figures["parameter_bytes"]
    assert cats["optimizer_state"] >= 2 * figures["parameter_bytes"]
    # The prediction traced the same step on fake tensors: on the CPU, within 2%.
    assert (
        abs(predicted["peak_allocated"] - figures["peak_allocated"])
        <= 0.02 * figures["peak_allocated"]
    )
    assert figures["time_per_step_s"] > 0 and figures["tokens_per_s"] > 0
    assert any("Step 1 peaked" in note for note in result["notes"])


@pytest.mark.parametrize(
    ("params", "phases"),
    [
        ({"model": "tiny-llama", "task": "inference", "batch_size": 2, "seq_len": 16}, ["forward"]),
        (
            {
                "model": "tiny-t5",
                "task": "generate",
                "batch_size": 2,
                "seq_len": 16,
                "new_tokens": 4,
            },
            ["prefill", "decode"],
        ),
        (
            {
                "model": "tiny-bert",
                "batch_size": 4,
                "seq_len": 16,
                "checkpointing": True,
                "micro_batches": 2,
                "precision": "bf16-autocast",
                "optimizer": "sgd-momentum",
            },
            ["forward", "backward", "optimizer"],
        ),
        ({"model": "tiny-vit", "batch_size": 2, "optimizer": "adafactor"}, None),
    ],
)
def test_every_task_and_knob_runs_on_the_cpu(
    service: str, params: dict[str, Any], phases: list[str] | None
) -> None:
    with httpx.Client(base_url=service, timeout=180) as client:
        _, done = run(client, **params)
    assert done["status"] == "succeeded", done.get("error")
    figures = done["result"]["model"]
    if phases is not None:
        assert [p["name"] for p in figures["steps"][-1]["phases"]] == phases
    assert sum(done["result"]["categories"].values()) == figures["peak_allocated"]


def test_an_emulated_card_too_small_is_an_oom_with_its_figures(service: str) -> None:
    with httpx.Client(base_url=service, timeout=180) as client:
        _, done = run(client, model="tiny-gpt2", batch_size=4, seq_len=32, capacity_bytes=100_000)
    assert done["status"] == "failed"
    assert done["error"]["type"] == "oom"
    assert "capacity_bytes 100000" in done["error"]["message"]
    assert done["result"]["model"]["peak_allocated"] > 100_000


def test_a_ddp_runs_ranks_are_shown_by_the_cli_and_the_page(service: str) -> None:
    """Two gloo ranks of a real DDP step, on an emulated card below their peaks: `vramlab
    show` and the experiment's page list each rank's own figures and name the ranks over
    the card."""
    with httpx.Client(base_url=service, timeout=180) as client:
        _, done = run(
            client,
            model="tiny-gpt2",
            batch_size=2,
            seq_len=32,
            dropout=0.0,
            capacity_bytes=100_000,
            distributed={"strategy": "ddp", "gpus": 2},
        )
        page = unescape(client.get(f"/ui/experiments/{done['id']}").text)
    assert done["status"] == "failed", done["error"]
    ranks = done["result"]["model"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert done["error"]["details"]["ranks_over"] == [0, 1]
    shown = subprocess.run(
        [*VRAMLAB, "show", done["id"][:8]],
        env={**os.environ, "VRAMLAB_API_URL": service},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "DDP on 2 CPU ranks (gloo)" in out and "over the emulated card" in out
    assert "ranks 0, 1" in out
    table = page[page.index('id="ranks"') :].split("</table>", 1)[0]
    assert "DDP on 2 CPU ranks (gloo)" in page and "ranks 0, 1" in page
    keys = ("peak_allocated", "peak_reserved", "parameter_bytes", "gradient_bytes")
    keys += ("optimizer_state_bytes", "bucket_bytes")
    for r in ranks:
        line = next(x for x in out.splitlines() if x.startswith(f"{r['rank']} ") and "cpu" in x)
        row = table[table.index(f"<td>{r['rank']}</td><td>cpu</td>") :].split("</tr>", 1)[0]
        for key in keys:
            assert r[key], key  # DDP on the CPU: every figure is there
            assert f" {human_bytes(r[key])} " in f"{line} ", (key, line)
            assert f">{human_bytes(r[key])}<" in row, (key, row)


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"model": "no-such-model"}, "params.model", "gpt2"),
        ({"model": "meta-llama/No-Such-Checkpoint"}, "params.model", "does not fetch hub configs"),
        ({"model": "tiny-bert", "task": "generate"}, "params.task", "does not generate"),
        ({"model": "tiny-gpt2", "config": {"no_such_key": 1}}, "params.config", "no_such_key"),
        (
            {"model": "tiny-gpt2", "task": "inference", "checkpointing": True},
            "params.checkpointing",
            "",
        ),
        ({"model": "gpt2", "batch_size": 64, "seq_len": 1024}, "params", "the step peaks at"),
        ({"model": "tiny-gpt2", "capacity_bytes": 2 * CAP}, "params.capacity_bytes", "cap"),
    ],
)
def test_specs_that_cannot_run_are_refused_before_they_queue(
    service: str, params: dict[str, Any], field: str, words: str
) -> None:
    with httpx.Client(base_url=service, timeout=180) as client:
        response = client.post("/v1/experiments", json=model(**params))
    assert response.status_code == 422, response.text
    details = response.json()["error"]["details"]
    assert any(d["field"] == field and words in d["message"] for d in details), details
