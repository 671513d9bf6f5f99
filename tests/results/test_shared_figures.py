"""Shared-process figures: host RSS of an experiment that ran in a shared process after
others depends on that history; the page, `vramlab show` and a comparison mark it (the
test plays the worker over the protocol)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import ADD, CPU_CAPS, MEMORY, claim, register, submit
from tests.results.test_cli import run


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url)) as server:
            yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as c:
        yield c


def _ran(client: httpx.Client, environment: dict[str, Any]) -> str:
    exp = submit(client, {**ADD, "shape": [64, 64], "isolation": "shared"})
    got = claim(client, register(client, CPU_CAPS))
    assert got is not None and got["id"] == exp["id"]
    memory = {**MEMORY, "host_rss_before": 261_197_824, "host_rss_after": 261_197_824}
    result = {"memory": memory, "environment": environment}
    body = {"lease_token": got["lease_token"], "status": "succeeded", "result": result}
    assert client.post(f"/v1/worker/experiments/{got['id']}/result", json=body).status_code == 200
    exp_id: str = exp["id"]
    return exp_id


def test_host_rss_after_earlier_experiments_is_marked(
    live: LiveServer, client: httpx.Client
) -> None:
    first = _ran(client, {"isolation": "shared", "experiments_before": 0})
    third = _ran(client, {"isolation": "shared", "experiments_before": 2})

    page = client.get(f"/ui/experiments/{third}").text
    assert page.count('class="flag shared-process"') == 2
    assert 'host_rss_before <span class="flag shared-process"' in page
    assert 'host_rss_after <span class="flag shared-process"' in page
    assert 'id="shared-process"' in page and "after 2 other experiment(s)" in page
    # A shared process's first experiment starts as a clean one: nothing to mark.
    assert "shared-process" not in client.get(f"/ui/experiments/{first}").text

    shown = run(live.url, "show", third).stdout
    assert "host_rss_before †" in shown and "host_rss_after †" in shown
    assert "† a shared-process figure" in shown
    assert "†" not in run(live.url, "show", first).stdout

    compared = client.get("/v1/compare", params={"ids": f"{first},{third}"}).json()
    assert [i["shared_process_figures"] for i in compared["items"]] == [
        [],
        ["host_rss_before", "host_rss_after"],
    ]
    page = client.get("/ui/compare", params={"ids": f"{first},{third}"}).text
    assert page.count('class="flag shared-process"') == 2
    assert 'id="compare-shared-process"' in page
