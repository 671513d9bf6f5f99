"""A user without a GPU never dead-ends: specs and presets that name no device run where a
live worker can run them, waiting says why and gives up, and cancel works from the CLI
and the page. Pages answer people in HTML; ids may be shortened to a unique prefix."""

import collections
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import CPU_CAPS, CUDA_CAPS, claim, register
from tests.results.test_cli import run, start

README_SPEC = {"op": "add", "shape": [1000, 1000], "dtype": "float32"}


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url)) as server:
            yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as c:
        yield c


def test_a_spec_without_a_device_runs_where_a_live_worker_can(client: httpx.Client) -> None:
    cpu = register(client, CPU_CAPS)
    exp = client.post("/v1/experiments", json=README_SPEC).json()
    assert exp["spec"]["device"] == "cpu" and exp["queue"]["runnable"] is True
    claimed = claim(client, cpu)
    assert claimed is not None and claimed["spec"]["device"] == "cpu"

    register(client, CUDA_CAPS, name="gpu")
    on_gpu = client.post("/v1/experiments", json=README_SPEC).json()
    assert on_gpu["spec"]["device"] == "cuda:0"
    # A device named in the spec is kept, whatever the workers offer.
    assert (
        client.post("/v1/experiments", json={**README_SPEC, "device": "cpu"}).json()["spec"][
            "device"
        ]
        == "cpu"
    )


def test_a_sweep_without_a_device_takes_the_live_workers_device(client: httpx.Client) -> None:
    register(client, CPU_CAPS)
    body = {"spec": {"op": "add", "shape": [8]}, "grid": {"shape": [[8], [16]]}}
    sweep = client.post("/v1/sweeps", json=body)
    assert sweep.status_code == 202, sweep.text
    devices = {e["spec"]["device"] for e in client.get("/v1/experiments").json()["items"]}
    assert devices == {"cpu"}


def test_a_preset_that_needs_cuda_says_so_before_it_queues(client: httpx.Client) -> None:
    register(client, CPU_CAPS)
    listing = client.get("/v1/presets").json()
    needs = next(p["name"] for p in listing if p["needs_cuda"])
    anywhere = next(p["name"] for p in listing if not p["needs_cuda"])
    refused = client.post(f"/v1/presets/{needs}/runs", json={})
    assert refused.status_code == 409 and "needs a CUDA GPU" in refused.json()["error"]["message"]
    assert client.get("/v1/experiments").json()["items"] == []
    # Asked for explicitly, it queues and says why it waits.
    queued = client.post(f"/v1/presets/{needs}/runs", json={"device": "cuda"}).json()
    assert queued["queue"]["runnable"] is False and "cuda" in queued["queue"]["reason"]
    ran = client.post(f"/v1/presets/{anywhere}/runs", json={"size": "small"})
    assert ran.status_code == 202 and ran.json()["spec"]["device"] == "cpu"


def test_a_422_names_every_bad_field_at_once(client: httpx.Client) -> None:
    spec = {**README_SPEC, "dtype": "float99", "device": "tpu", "repeat": 10**6}
    bad = client.post("/v1/experiments", json=spec)
    assert bad.status_code == 422
    fields = {d["field"] for d in bad.json()["error"]["details"]}
    assert {"dtype", "device", "repeat"} <= fields


def test_wait_gives_up_with_the_reason_and_cancel_takes_a_prefix(live: LiveServer) -> None:
    # Only a CPU worker is live; the experiment asks for CUDA: nothing can run it.
    with httpx.Client(base_url=live.url) as client:
        register(client, CPU_CAPS)
    waiting = run(
        live.url, "submit", "--op", "add", "--shape", "8x8", "--device", "cuda",
        "--wait", "--give-up", "0.5", "--poll", "0.1",
    )  # fmt: skip
    assert waiting.returncode == 1
    assert "gave up" in waiting.stderr and "needs a cuda worker" in waiting.stderr
    assert "HTTP Request" not in waiting.stderr  # no httpx log line per request
    with httpx.Client(base_url=live.url) as client:
        (exp,) = client.get("/v1/experiments").json()["items"]
    cancelled = run(live.url, "cancel", exp["id"][:8])
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"{exp['id']} cancelled" in cancelled.stdout
    again = run(live.url, "cancel", exp["id"][:8])
    assert again.returncode == 1 and "already cancelled" in again.stderr


def test_prefixes_resolve_and_an_ambiguous_one_lists_its_matches(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url) as client:
        # 17 ids over 16 hex digits: at least two share their first character.
        ids = [client.post("/v1/experiments", json=README_SPEC).json()["id"] for _ in range(17)]
    first, count = collections.Counter(i[0] for i in ids).most_common(1)[0]
    assert count >= 2
    shared = [i for i in ids if i.startswith(first)]
    ambiguous = run(live.url, "show", first)
    assert ambiguous.returncode == 1 and "matches several" in ambiguous.stderr
    assert all(i in ambiguous.stderr for i in shared[:10])
    shown = run(live.url, "show", ids[0][:8])
    assert shown.returncode == 0 and ids[0] in shown.stdout
    compared = run(live.url, "compare", ids[0][:8], ids[1][:8], "--json")
    assert compared.returncode == 0, compared.stderr
    assert run(live.url, "show", "0123zz").returncode == 1


def test_presets_and_run_from_the_cli(live: LiveServer) -> None:
    listing = run(live.url, "presets")
    assert listing.returncode == 0 and "preset" in listing.stdout and "cuda" in listing.stdout
    with httpx.Client(base_url=live.url) as client:
        cpu = register(client, CPU_CAPS)
        name = next(p["name"] for p in client.get("/v1/presets").json() if not p["needs_cuda"])
    waiting = start(live.url, "run", name, "--size", "small", "--wait", "--json")
    with httpx.Client(base_url=live.url) as client:
        claimed = None
        for _ in range(200):
            claimed = claim(client, cpu, wait_s=0.2)
            if claimed:
                break
        assert claimed is not None and claimed["spec"]["device"] == "cpu"
        body = {"lease_token": claimed["lease_token"], "status": "failed",
                "error": {"type": "internal", "message": "test"}}  # fmt: skip
        client.post(f"/v1/worker/experiments/{claimed['id']}/result", json=body)
    _out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, err  # --wait exits non-zero unless it succeeded


def test_pages_show_why_it_waits_cancel_it_and_answer_errors_in_html(
    client: httpx.Client,
) -> None:
    register(client, CPU_CAPS)
    exp = client.post("/v1/experiments", json={**README_SPEC, "device": "cuda"}).json()
    page = client.get(f"/ui/experiments/{exp['id']}")
    assert page.status_code == 200
    assert 'id="queue-reason"' in page.text and "needs a cuda worker" in page.text
    assert 'id="cancel"' in page.text and "None" not in page.text
    done = client.post(f"/ui/experiments/{exp['id']}/cancel", follow_redirects=False)
    assert done.status_code == 303
    assert client.get(f"/v1/experiments/{exp['id']}").json()["status"] == "cancelled"
    after = client.get(f"/ui/experiments/{exp['id']}")
    assert 'id="cancel"' not in after.text and "None" not in after.text

    missing = client.get("/ui/experiments/not-an-id")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "no experiment" in missing.text and "<h1>404" in missing.text

    presets = client.get("/ui/presets")
    assert presets.status_code == 200 and "queue for a GPU" in presets.text
    form = client.get("/ui/submit")
    assert 'id="catalog"' in form.text and '"matmul"' in form.text and ">cpu<" in form.text


def test_a_preset_runs_from_its_page(client: httpx.Client) -> None:
    register(client, CPU_CAPS)
    name = next(p["name"] for p in client.get("/v1/presets").json() if not p["needs_cuda"])
    ran = client.post(f"/ui/presets/{name}/run", data={"size": "small"}, follow_redirects=False)
    assert ran.status_code == 303 and ran.headers["location"].startswith("/ui/experiments/")
    (exp,) = client.get("/v1/experiments").json()["items"]
    assert exp["preset"] == name and exp["spec"]["device"] == "cpu"


def test_ctrl_c_ends_a_waiting_command_cleanly(live: LiveServer) -> None:
    waiting = start(
        live.url, "submit", "--op", "add", "--shape", "8", "--device", "cuda", "--wait",
        "--give-up", "600", "--poll", "0.1",
    )  # fmt: skip
    assert waiting.stderr is not None
    # Wait for the live status line: the command is inside its wait loop.
    assert "queued" in waiting.stderr.read(len("\r\x1b[K") + 30)
    waiting.send_signal(signal.SIGINT)
    _out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 130 and "Traceback" not in err
