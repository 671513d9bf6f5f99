"""The client commands (`vramlab submit|show|ls|trace|sweep|compare`) as real processes
against a live API; the test plays the worker over the protocol."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.results.trace_data import complete, events

VRAMLAB = [sys.executable, "-m", "app.cli"]


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    # The CLI is a client: one engine is enough here (the API tests cover both).
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url)) as server:
            yield server


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_")}
    return {**env, "VRAMLAB_API_URL": url}


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VRAMLAB, *args], env=_env(url), capture_output=True, text=True, timeout=60
    )


def _default_sigint() -> None:
    # As a terminal starts a command: a runner started in the background (a shell without
    # job control) ignores SIGINT, and its children would inherit that, so Ctrl-C
    # (SIGINT) would not reach the command under test.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*VRAMLAB, *args],
        env=_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _wait_queued(client: httpx.Client, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(client.get("/v1/experiments", params={"status": "queued"}).json()["items"]) < n:
        assert time.monotonic() < deadline, "the CLI queued nothing"
        time.sleep(0.05)


def test_submit_wait_json_show_ls_trace(live: LiveServer, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"op": "add", "shape": [64, 64], "device": "cuda"}))
    waiting = start(
        live.url, "submit", "--file", str(spec), "--dtype", "float16", "--wait", "--json"
    )
    with httpx.Client(base_url=live.url) as client:
        _wait_queued(client, 1)
        exp_id = complete(client, [events()], memory={"delta_allocated": 8192})
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    finished = json.loads(out)
    assert finished["id"] == exp_id and finished["status"] == "succeeded"
    assert finished["spec"]["dtype"] == "float16"
    assert finished["result"]["memory"]["delta_allocated"] == 8192
    assert "succeeded" in err  # the live status line

    shown = run(live.url, "show", exp_id)
    assert shown.returncode == 0 and "delta_allocated" in shown.stdout and "8.0 KiB" in shown.stdout
    listed = run(live.url, "ls")
    assert exp_id[:8] in listed.stdout and "succeeded" in listed.stdout
    assert json.loads(run(live.url, "ls", "--json").stdout)["items"][0]["id"] == exp_id

    viz = tmp_path / "t.pickle"
    got = run(live.url, "trace", exp_id, "--format", "memory_viz", "-o", str(viz))
    assert got.returncode == 0, got.stderr
    assert len(pickle.loads(viz.read_bytes())["device_traces"][0]) == 9
    as_json = tmp_path / "t.json"
    assert run(live.url, "trace", exp_id, "--format", "json", "-o", str(as_json)).returncode == 0
    assert [e["seq"] for e in json.loads(as_json.read_text())] == list(range(12))
    ndjson = run(live.url, "trace", exp_id)
    assert len(ndjson.stdout.splitlines()) == 12

    missing = run(live.url, "show", "nope")
    assert missing.returncode == 1 and "'nope' is not an experiment id" in missing.stderr
    unknown = run(live.url, "show", "ffffffff-ffff-4fff-bfff-ffffffffffff")
    assert unknown.returncode == 1 and "404" in unknown.stderr
    bad = run(live.url, "submit", "--op", "add", "--shape", "4x4", "--dtype", "float99")
    assert bad.returncode == 1 and "dtype" in bad.stderr


def test_sweep_wait_and_compare(live: LiveServer, tmp_path: Path) -> None:
    body = {
        "spec": {"op": "add", "shape": [8, 8], "device": "cuda"},
        "grid": {"shape": [[8, 8], [16, 16], [32, 32]]},
    }
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps(body))
    csv_file = tmp_path / "sweep.csv"
    waiting = start(
        live.url,
        "sweep",
        "--file",
        str(sweep_file),
        "--wait",
        "--poll",
        "0.1",
        "--csv",
        str(csv_file),
    )
    with httpx.Client(base_url=live.url) as client:
        _wait_queued(client, 3)
        ids = [
            complete(client, [events()], memory={"delta_allocated": 256 * (i + 1)})
            for i in range(3)
        ]
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "3/3" in err and "[######" in err  # the progress bar reached the end
    assert "16x16" in out and "succeeded" in out
    assert len(csv_file.read_text().splitlines()) == 4

    compared = run(live.url, "compare", ids[0], ids[2])
    assert compared.returncode == 0, compared.stderr
    assert "delta_allocated" in compared.stdout and "(+512 B)" in compared.stdout
    as_json = json.loads(run(live.url, "compare", ids[0], ids[2], "--json").stdout)
    assert as_json["differences"]["delta_allocated"] == [0, 512]


def test_isolation_reaches_the_spec_from_submit_run_and_sweep(
    live: LiveServer, tmp_path: Path
) -> None:
    base = ["--json", "--isolation", "shared"]
    submitted = run(live.url, "submit", "--op", "add", "--shape", "8x8", "--device", "cpu", *base)
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["spec"]["isolation"] == "shared"
    preset = run(
        live.url, "run", "cpu_copy_stays_alive", "--device", "cpu", "--size", "small", *base
    )
    assert preset.returncode == 0, preset.stderr
    assert json.loads(preset.stdout)["spec"]["isolation"] == "shared"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"op": "add", "shape": [8], "device": "cpu"}))
    swept = run(live.url, "sweep", "--spec", str(spec), "--grid", "shape=[8];[16]", *base)
    assert swept.returncode == 0, swept.stderr
    with httpx.Client(base_url=live.url) as client:
        for row in json.loads(swept.stdout)["rows"]:
            exp = client.get(f"/v1/experiments/{row['experiment_id']}").json()
            assert exp["spec"]["isolation"] == "shared"
    spec.write_text(json.dumps({"op": "add", "shape": [8], "allocator": {"max_split_size_mb": 64}}))
    refused = run(live.url, "submit", "--file", str(spec), "--isolation", "shared")
    assert refused.returncode == 1 and "isolation" in refused.stderr


def test_the_token_is_sent_as_a_bearer(live: LiveServer) -> None:
    # A token the API does not know is refused, which shows the CLI sent it.
    refused = run(live.url, "ls", "--token", "vl_not-a-token")
    assert refused.returncode == 1 and "401" in refused.stderr
