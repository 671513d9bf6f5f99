"""What held memory at the peak, by category, as the API and the page say it, for
snapshots recorded with Python frames alone (PyTorch's ``stacks="python"``)."""

import gzip
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.snapshots.loops import adam_loop
from tests.snapshots.synthetic import dumps
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
