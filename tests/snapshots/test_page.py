"""The snapshot page as a person reads it: its title, PyTorch's own figures beside the
replayed ones, and a timeline zoomed to where memory changes."""

import gzip
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.snapshots.synthetic import MiB, dumps, training_snapshot
from tests.snapshots.test_import import imported

DATA = Path(__file__).parent / "data"


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url)) as live, httpx.Client(base_url=live.url) as c:
            yield c


def _memory_table(page: str) -> list[list[str]]:
    table = page[page.index('<table id="memory">') : page.index("</table>", page.index("memory"))]
    return [
        [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<t[dh][^>]*>.*?</t[dh]>", row)
        ]
        for row in re.findall(r"<tr>.*?</tr>", table, re.S)
    ]


def _x_ticks(page: str) -> list[float]:
    return [float(t) for t in re.findall(r'class="vl-tick vl-xtick"[^>]*>([-\d.]+)<', page)]


def test_a_snapshot_without_a_name_is_titled_once(client: httpx.Client) -> None:
    snap = imported(client, (DATA / "train_python.pickle.gz").read_bytes())
    assert snap["name"] == "snapshot"
    page = client.get(f"/ui/snapshots/{snap['id']}").text
    found = re.search(r"<h1>(.*?)</h1>", page, re.S)
    assert found is not None
    h1 = re.sub(r"<[^>]+>", "", found.group(1))
    assert h1.split() == ["Memory", "snapshot", "on", "cuda:0"]
    assert "snapshot snapshot" not in page
    named = imported(client, (DATA / "train_python.pickle.gz").read_bytes(), name="train")
    page = client.get(f"/ui/snapshots/{named['id']}").text
    assert re.search(r"<h1>train <span[^>]*>· memory snapshot on cuda:0</span></h1>", page)


def test_pytorchs_own_figures_fill_their_column(client: httpx.Client) -> None:
    # A snapshot from torch.cuda.memory._dump_snapshot: no counters, but its segments.
    plain = imported(client, (DATA / "train_python.pickle.gz").read_bytes())
    assert plain["counters"] is None
    rows = _memory_table(client.get(f"/ui/snapshots/{plain['id']}").text)
    assert rows[0] == ["figure", "replayed from the trace", "PyTorch's segments at the dump"]
    end = {r[0]: r[1:] for r in rows[1:]}
    assert end["allocated at the end"] == ["65.0 MiB", "65.0 MiB"]
    assert end["reserved at the end"] == ["68.0 MiB", "68.0 MiB"]
    assert end["allocated at the peak"] == ["67.6 MiB", "not in the file"]

    # Recorded with PyTorch's counters: every row has them.
    snap: dict[str, Any] = training_snapshot(iterations=3, layers=4)
    snap["memory_stats"] = {
        "allocated_bytes.all.peak": 22 * MiB,
        "allocated_bytes.all.current": 12 * MiB,
        "reserved_bytes.all.peak": 2**30,
        "reserved_bytes.all.current": 2**30,
    }
    counted = imported(client, gzip.compress(dumps(snap)))
    rows = _memory_table(client.get(f"/ui/snapshots/{counted['id']}").text)
    assert rows[0][2] == "PyTorch's counters"
    assert [r[2] for r in rows[1:]] == ["22.0 MiB", "1.0 GiB", "12.0 MiB", "1.0 GiB"]

    # Neither counters nor segments: no empty column.
    bare = training_snapshot(iterations=1, layers=2)
    bare["segments"] = []
    none = imported(client, gzip.compress(dumps(bare)))
    rows = _memory_table(client.get(f"/ui/snapshots/{none['id']}").text)
    assert rows[0] == ["figure", "replayed from the trace"]
    assert all(len(r) == 2 for r in rows)


def test_the_timeline_zooms_to_where_memory_changes(client: httpx.Client) -> None:
    # A real training run that waited about 4 s between building its model and its work.
    snap = imported(client, (DATA / "train_python.pickle.gz").read_bytes())
    full = client.get(f"/ui/snapshots/{snap['id']}", params={"x": "full"}).text
    ticks = _x_ticks(full)
    assert ticks[0] == 0 and ticks[-1] >= 4000
    assert 'id="timeline-zoom" href="?x=changes#timeline"' in full

    page = client.get(f"/ui/snapshots/{snap['id']}").text
    ticks = _x_ticks(page)
    # The flat stretch is left out: the axis starts just before the work (about 3.9 s in).
    assert ticks[0] >= 3900 and ticks[-1] >= 4200, ticks
    assert 'id="timeline-full" href="?x=full#timeline"' in page
    assert "nothing changed from 0.58 to 3939 ms" in page
    # The peak is in the zoomed range, labelled.
    assert "peak 67.6 MiB at 4142 ms" in page

    # A snapshot whose memory changes throughout is drawn whole, with no zoom offered.
    busy = imported(client, gzip.compress(dumps(training_snapshot(iterations=3, layers=4))))
    page = client.get(f"/ui/snapshots/{busy['id']}").text
    assert 'id="timeline-range"' not in page


def test_a_snapshot_of_a_program_that_failed_is_marked_partial(client: httpx.Client) -> None:
    body = dumps(training_snapshot(iterations=1, layers=2))
    whole = imported(client, body, name="ok", program_exit=0)
    assert (whole["program_exit"], whole["partial"]) == (0, False)
    assert 'id="partial"' not in client.get(f"/ui/snapshots/{whole['id']}").text
    unsaid = imported(client, body, name="upload")  # a plain upload says nothing of it
    assert (unsaid["program_exit"], unsaid["partial"]) == (None, False)
    for code, says in ((1, "exited with status 1"), (-9, "was killed by signal 9")):
        out = imported(client, body, name="failed", program_exit=code)
        assert (out["program_exit"], out["partial"]) == (code, True)
        assert client.get(f"/v1/snapshots/{out['id']}").json()["partial"] is True
        page = client.get(f"/ui/snapshots/{out['id']}").text
        partial = page[page.index('id="partial"') :]
        assert says in partial[: partial.index("</p>")]
    for bad in (256, -65, "x"):
        refused = client.post("/v1/snapshots", params={"program_exit": bad}, content=body)
        assert refused.status_code == 422, refused.text
