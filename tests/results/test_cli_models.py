"""The client commands on model experiments, as real processes against a live API (the
real predictor; the test plays the worker over the protocol): the prediction printed by
`submit --wait` before the run, by `show` and `ls`, and beside the measured figures in
`compare`; what a refused spec, a refused token, sizes with units and a closed pipe give."""

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import CPU_CAPS, MEMORY, claim, register, succeed
from vramlab.units import human_bytes

pytest.importorskip("transformers")
# The first prediction starts the predictor (torch and transformers); a machine shared by
# other work may take a while: these tests are about what is shown, not how fast.
PATIENT = {"model_predict_wait_s": 600.0, "model_predict_timeout_s": 120.0}

VRAMLAB = [sys.executable, "-m", "app.cli"]
TINY = {"op": "model", "shape": [], "device": "cpu"}


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url, **PATIENT)) as server:
            yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=300) as c:
        yield c


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
    return {**env, "VRAMLAB_API_URL": url, **extra}


def run(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VRAMLAB, *args], env=_env(url, **env), capture_output=True, text=True, timeout=300
    )


def _tiny(client: httpx.Client, batch: int) -> dict[str, Any]:
    params = {"model": "tiny-gpt2", "seq_len": 32, "batch_size": batch}
    made = client.post("/v1/experiments", json={**TINY, "params": params})
    assert made.status_code == 202, made.text
    out: dict[str, Any] = made.json()
    return out


def _finish(client: httpx.Client, worker: str, parameters: int) -> None:
    claimed = claim(client, worker, wait_s=1)
    assert claimed is not None
    categories = {"parameters": parameters, "activations": 3 * parameters}
    assert succeed(client, claimed, categories=categories).status_code == 200


def test_submit_wait_prints_the_prediction_before_the_run(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=300) as client:
        worker = register(client, CPU_CAPS)
        proc = subprocess.Popen(
            [
                *VRAMLAB,
                "submit",
                "--op",
                "model",
                "--param",
                "model=tiny-gpt2",
                "--param",
                "seq_len=32",
                "--device",
                "cpu",
                "--wait",
            ],
            env=_env(live.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        said: list[str] = []
        deadline = time.monotonic() + 300
        while not any(x.startswith("predicted for cpu") for x in said):
            assert time.monotonic() < deadline and proc.poll() is None, said
            try:
                said.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        # Printed while nothing has run it yet: the worker has not even claimed it.
        [exp] = client.get("/v1/experiments").json()["items"]
        assert exp["status"] == "queued"
        peak = exp["prediction"]["peak_allocated"]
        assert any(human_bytes(peak) in x for x in said), said
        _finish(client, worker, 1000)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    while not lines.empty():
        said.append(lines.get())
    assert any(x.startswith("parameters") for x in said), said  # the category table


def test_show_ls_and_compare_give_model_batch_prediction_and_categories(
    live: LiveServer, client: httpx.Client
) -> None:
    worker = register(client, CPU_CAPS)
    small, large = _tiny(client, 2), _tiny(client, 4)
    peak = small["prediction"]["peak_allocated"]

    shown = run(live.url, "show", small["id"][:8])
    assert shown.returncode == 0, shown.stderr
    assert "predicted for cpu: the step peaks at " + human_bytes(peak) in shown.stdout
    assert "parameters" in shown.stdout and "activations" in shown.stdout

    listed = run(live.url, "ls")
    assert listed.returncode == 0, listed.stderr
    row = next(x for x in listed.stdout.splitlines() if x.startswith(small["id"][:8]))
    assert "model tiny-gpt2" in row and "2 x 32" in row and human_bytes(peak) in row
    assert " 0 B " not in row

    _finish(client, worker, 1000)
    _finish(client, worker, 2000)
    compared = run(live.url, "compare", small["id"][:8], large["id"][:8])
    assert compared.returncode == 0, compared.stderr
    text = compared.stdout
    assert f"tiny-gpt2 train 2x32 fp32 cpu ({small['id'][:8]})" in text
    batch = next(x for x in text.splitlines() if x.startswith("batch_size"))
    assert batch.split()[1:] == ["2", "4"]
    params = next(x for x in text.splitlines() if x.startswith("parameters"))
    assert "1000 B (predicted" in params and "2.0 KiB (predicted" in params


def test_a_spec_over_the_cap_prints_its_prediction_and_the_plan(live: LiveServer) -> None:
    done = run(
        live.url,
        "submit",
        "--op",
        "model",
        "--param",
        "model=gpt2",
        "--param",
        "batch_size=16",
        "--param",
        "seq_len=1024",
        "--device",
        "cuda",
    )
    assert done.returncode == 1
    assert "predicted for cuda (H100-class)" in done.stderr
    assert "vramlab plan gpt2 --batch 16 --seq 1024" in done.stderr
    assert any(x.startswith("activations") for x in done.stderr.splitlines()), done.stderr
    assert "Traceback" not in done.stderr


def test_a_bytes_param_takes_units(live: LiveServer, client: httpx.Client) -> None:
    done = run(
        live.url,
        "submit",
        "--op",
        "model",
        "--param",
        "model=tiny-gpt2",
        "--param",
        "capacity_bytes=1GiB",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    exp = client.get(f"/v1/experiments/{done.stdout.strip()}").json()
    assert exp["spec"]["params"]["capacity_bytes"] == 2**30


def test_size_settings_take_units_and_a_bad_one_is_one_line(live: LiveServer) -> None:
    fine = run(live.url, "ls", VRAMLAB_MAX_EXPERIMENT_BYTES="200GiB")
    assert fine.returncode == 0, fine.stderr
    bad = run(live.url, "ls", VRAMLAB_MAX_EXPERIMENT_BYTES="lots")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.startswith("vramlab: VRAMLAB_MAX_EXPERIMENT_BYTES=lots:")
    assert "24GiB" in bad.stderr


def test_ls_into_a_closed_pipe_ends_quietly(live: LiveServer, client: httpx.Client) -> None:
    for _ in range(3):
        client.post("/v1/experiments", json={"op": "add", "shape": [4], "device": "cpu"})
    proc = subprocess.Popen(
        [*VRAMLAB, "ls"],
        env=_env(live.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader left before a line was written (`ls | head -0`)
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_401_names_the_token_flag_and_variable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url, auth="on")) as server:
            done = run(server.url, "ls")
            assert done.returncode == 1
            assert "401" in done.stderr
            assert "--token" in done.stderr and "VRAMLAB_TOKEN" in done.stderr
            refused = run(server.url, "ls", "--token", "wrong")
            assert "the token given was refused" in refused.stderr


def test_show_lists_a_distributed_runs_ranks(live: LiveServer, client: httpx.Client) -> None:
    made, model = report_ranks(client)
    shown = run(live.url, "show", made["id"][:8])
    assert shown.returncode == 0, shown.stderr
    assert "FSDP2 full sharding on 2 CPU ranks (gloo), bf16 mixed precision" in shown.stdout
    lines = shown.stdout.splitlines()
    header = next(x for x in lines if x.startswith("rank "))
    for word in ("peak allocated", "peak reserved", "parameters", "gradients", "optimizer"):
        assert word in header, header
    for r in model["ranks"]:
        row = next(x for x in lines if x.startswith(f"{r['rank']} ") and "cpu" in x)
        for key in RANK_FIGURES:
            assert f" {human_bytes(r[key])} " in f"{row} ", (key, row)


def test_show_names_the_ranks_past_the_emulated_card(
    live: LiveServer, client: httpx.Client
) -> None:
    made, _ = report_ranks(client, capacity=5_500_000)
    shown = run(live.url, "show", made["id"][:8])
    assert shown.returncode == 0, shown.stderr
    assert "over the emulated card" in shown.stdout
    line = next(x for x in shown.stdout.splitlines() if "over the emulated card" in x)
    assert "rank 1 " in line and "rank 0" not in line, line
    assert human_bytes(6_000_000) in line


# A rank's figures, each distinct (and from the other rank's), so that a row must show
# its own rank's bytes.
RANK_FIGURES = (
    "peak_allocated",
    "peak_reserved",
    "parameter_bytes",
    "gradient_bytes",
    "optimizer_state_bytes",
    "bucket_bytes",
)


def rank_figures(r: int, peak: int, device: str = "cpu") -> dict[str, Any]:
    return {
        "rank": r,
        "device": device,
        "peak_allocated": peak,
        "peak_reserved": peak + 2_000_000,
        "parameter_bytes": (200 + r) * 1024,
        "gradient_bytes": (300 + r) * 1024,
        "optimizer_state_bytes": (500 + r) * 1024,
        "bucket_bytes": (50 + r) * 1024,
        "categories": {"parameters": 200 * 1024, "gradients": 300 * 1024},
    }


def report_ranks(
    client: httpx.Client, capacity: int | None = None, device: str = "cpu"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A 2-rank FSDP2 run on the CPU, reported over the worker protocol (failed as the
    worker fails it where a rank passes ``capacity``: its figures kept)."""
    params: dict[str, Any] = {
        "model": "tiny-gpt2",
        "seq_len": 16,
        "batch_size": 2,
        "distributed": {"strategy": "fsdp", "gpus": 2, "mixed_precision": "bf16"},
    }
    if capacity is not None:
        params["capacity_bytes"] = capacity
    made = client.post("/v1/experiments", json={**TINY, "params": params})
    assert made.status_code == 202, made.text
    worker = register(client, CPU_CAPS)
    claimed = claim(client, worker, wait_s=1)
    assert claimed is not None
    ranks = [rank_figures(0, 5_000_000, device), rank_figures(1, 6_000_000, device)]
    model = {
        "model": "tiny-gpt2",
        "model_type": "gpt2",
        "task": "train",
        "parameter_count": 250,
        "reported_step": 2,
        "peak_allocated": 6_000_000,
        "peak_reserved": 8_000_000,
        "distributed": {
            "strategy": "fsdp",
            "gpus": 2,
            "sharding": "full",
            "offload_optimizer": False,
            "mixed_precision": "bf16",
        },
        "ranks": ranks,
    }
    if capacity is None:
        done = succeed(client, claimed, model=model, categories=ranks[1]["categories"])
    else:
        body = {
            "lease_token": claimed["lease_token"],
            "status": "failed",
            "result": {"memory": MEMORY, "model": model, "categories": ranks[1]["categories"]},
            "error": {
                "type": "oom",
                "message": "rank 1 of 2's step peaked at 5.7 MiB; the emulated card holds less",
                "details": {
                    "capacity_bytes": capacity,
                    "peak_allocated": 6_000_000,
                    "rank": 1,
                    "ranks_over": [1],
                    "rank_peaks": [5_000_000, 6_000_000],
                    "emulated": True,
                },
            },
        }
        done = client.post(f"/v1/worker/experiments/{claimed['id']}/result", json=body)
    assert done.status_code == 200, done.text
    out: dict[str, Any] = made.json()
    return out, model
