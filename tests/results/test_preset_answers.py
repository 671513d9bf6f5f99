"""A preset's run read against its question: an expected refusal is the preset's answer,
said first in the status line of `vramlab ls`, `show` and the pages (the test plays the
worker over the protocol)."""

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import CPU_CAPS, CUDA_CAPS, MEMORY, claim, register
from tests.results.test_cli import VRAMLAB, _env, run


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url)) as server:
            yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as c:
        yield c


def _run_preset(
    client: httpx.Client, name: str, outcome: dict[str, Any], device: str = "cpu"
) -> dict[str, Any]:
    """Queue the preset, then finish it as a CPU worker would with ``outcome``."""
    queued = client.post(f"/v1/presets/{name}/runs", json={"device": device, "size": "small"})
    assert queued.status_code == 202, queued.text
    got = claim(client, register(client, CPU_CAPS))
    assert got is not None and got["id"] == queued.json()["id"]
    body = {"lease_token": got["lease_token"], **outcome}
    posted = client.post(f"/v1/worker/experiments/{got['id']}/result", json=body)
    assert posted.status_code == 200, posted.text
    done: dict[str, Any] = client.get(f"/v1/experiments/{got['id']}").json()
    return done


AUTOGRAD_REFUSAL = {
    "status": "failed",
    "error": {
        "type": "autograd_error",
        "message": "a leaf Variable that requires grad is being used in an in-place operation.",
    },
    "result": {"memory": MEMORY},
}


def test_an_expected_refusal_is_the_answer_first(live: LiveServer, client: httpx.Client) -> None:
    listing = {p["name"]: p for p in client.get("/v1/presets").json()}
    assert listing["inplace_add_requires_grad"]["expected_refusal"] == "autograd refuses this"
    assert listing["inplace_add_no_grad"]["expected_refusal"] is None

    done = _run_preset(client, "inplace_add_requires_grad", AUTOGRAD_REFUSAL)
    assert done["status"] == "failed"  # stored as it happened
    assert done["expected_refusal"] == "autograd refuses this"
    assert done["status_line"] == "answered: autograd refuses this (expected)"

    listed = run(live.url, "ls")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(done["id"][:8]))
    assert row.split("  ")[1].strip() == "answered: autograd refuses this (expected)"
    shown = run(live.url, "show", done["id"][:8])
    first = shown.stdout.splitlines()[0]
    assert first.startswith(f"{done['id']}  answered: autograd refuses this (expected)"), first
    assert "failed" not in first

    page = client.get(f"/ui/experiments/{done['id']}").text
    assert 'id="status" class="status-answered">answered: autograd refuses this (expected)<' in (
        page
    )
    assert 'id="answer"' in page and 'id="error"' not in page
    index = client.get("/ui/").text
    assert ">answered: autograd refuses this (expected)</td>" in index


def test_another_failure_stays_a_failure(live: LiveServer, client: httpx.Client) -> None:
    oom = {"status": "failed", "error": {"type": "oom", "message": "out of memory"}}
    done = _run_preset(client, "inplace_add_requires_grad", oom)
    assert done["expected_refusal"] is None and done["status_line"] == "failed (oom)"
    assert f"{done['id']}  failed (oom)" in run(live.url, "show", done["id"]).stdout
    page = client.get(f"/ui/experiments/{done['id']}").text
    assert 'id="error"' in page and 'id="answer"' not in page


def test_a_refusal_preset_that_succeeds_says_it_was_not_refused(client: httpx.Client) -> None:
    done = _run_preset(
        client, "inplace_add_requires_grad", {"status": "succeeded", "result": {"memory": MEMORY}}
    )
    assert done["status_line"] == "succeeded"
    assert any("expects PyTorch to refuse" in n for n in done["preset_notes"])


def test_a_gpu_question_run_without_a_gpu_says_so(live: LiveServer, client: httpx.Client) -> None:
    listing = {p["name"]: p for p in client.get("/v1/presets").json()}
    assert listing["transfer_pageable"]["gpu_question"] == "a host-to-GPU copy"
    assert listing["elementwise_add"]["gpu_question"] is None
    ok = {"status": "succeeded", "result": {"memory": MEMORY}}
    done = _run_preset(client, "transfer_pageable", ok)
    assert done["spec"]["device"] == "cpu"
    assert done["status_line"] == "succeeded (no GPU: question not answered)"
    [note] = done["preset_notes"]
    assert note.startswith("Ran without a GPU (on cpu): this preset asks about a host-to-GPU copy")
    assert "CPU-to-CPU copy" in note

    shown = run(live.url, "show", done["id"]).stdout.splitlines()
    assert shown[1] == f"note: {note}"  # said right under the status line
    assert "(no GPU: question not answered)" in run(live.url, "ls").stdout
    page = client.get(f"/ui/experiments/{done['id']}").text
    assert 'class="caveat preset-note">Ran without a GPU (on cpu)' in page
    presets = run(live.url, "presets")
    row = next(line for line in presets.stdout.splitlines() if line.startswith("transfer_pageable"))
    assert row.split()[1] == "cuda*" and "a question about the GPU" in presets.stderr

    # A question that is not about the GPU answers on the CPU without a note.
    plain = _run_preset(client, "elementwise_add", ok)
    assert plain["status_line"] == "succeeded" and plain["preset_notes"] == []


def test_a_gpu_question_that_ran_on_a_gpu_has_no_note(client: httpx.Client) -> None:
    queued = client.post("/v1/presets/transfer_pageable/runs", json={"device": "cuda"}).json()
    assert queued["status_line"] == "queued" and queued["preset_notes"] == []
    got = claim(client, register(client, CUDA_CAPS))
    assert got is not None and got["id"] == queued["id"]
    body = {"lease_token": got["lease_token"], "status": "succeeded", "result": {"memory": MEMORY}}
    assert client.post(f"/v1/worker/experiments/{got['id']}/result", json=body).status_code == 200
    done = client.get(f"/v1/experiments/{got['id']}").json()
    assert done["status_line"] == "succeeded" and done["preset_notes"] == []


def test_presets_wraps_questions_at_words(live: LiveServer, client: httpx.Client) -> None:
    questions = {p["name"]: p["question"] for p in client.get("/v1/presets").json()}
    env = {**_env(live.url), "COLUMNS": "80"}
    listed = subprocess.run(
        [*VRAMLAB, "presets"], env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    start = lines[0].index("question")
    shown: dict[str, list[str]] = {}
    for line in lines[2:]:
        assert len(line.rstrip()) <= 80, line
        name = line[:start].split()[0] if line[:start].strip() else None
        if name is not None:
            shown[name] = []
        shown[list(shown)[-1]].append(line[start:].strip())
    assert shown.keys() == questions.keys()
    for name, question in questions.items():
        assert " ".join(shown[name]) == question  # every word whole, none dropped
    assert any(len(parts) > 1 for parts in shown.values())
