"""Timelines, sweeps and comparisons over HTTP: figures render and show what they claim."""

import csv
import io
import re

import httpx

from tests.helpers import ADD, CPU_CAPS, MATMUL, MEMORY, claim, register
from tests.results.trace_data import events, upload


def test_timeline_in_three_formats_shows_the_peak(client: httpx.Client) -> None:
    exp_id = upload(client, MATMUL, [events()])
    url = f"/v1/experiments/{exp_id}/timeline"
    page = client.get(url, params={"format": "html"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "peak 16.0 KiB" in text and "block 8.0 KiB" in text
    assert all(f">{phase}</text>" in text for phase in ("setup", "op", "after"))
    assert ">reserved</text>" in text  # segments were recorded
    # Self-contained: nothing is fetched from elsewhere.
    assert not re.search(r"""(src|href)=["']?https?:""", text)
    svg = client.get(url, params={"format": "svg"})
    assert svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.lstrip().startswith("<?xml") and "<svg" in svg.text
    assert "peak 16.0 KiB" in svg.text
    png = client.get(url, params={"format": "png"})
    assert png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n") and len(png.content) > 5000
    assert client.get(url, params={"format": "gif"}).status_code == 422


def test_timeline_of_an_experiment_without_trace_is_404(client: httpx.Client) -> None:
    exp = client.post("/v1/experiments", json=ADD).json()
    response = client.get(f"/v1/experiments/{exp['id']}/timeline")
    assert response.status_code == 404 and "no trace events" in response.json()["error"]["message"]


def _finish_all(client: httpx.Client, n: int) -> None:
    """Play a worker: each claimed point 'measures' its prediction plus 512 bytes."""
    worker = register(client, CPU_CAPS)
    for _ in range(n):
        got = claim(client, worker)
        assert got is not None
        exp = client.get(f"/v1/experiments/{got['id']}").json()
        predicted = exp["prediction"]["delta_allocated"]
        memory = {**MEMORY, "delta_allocated": predicted + 512, "allocated_peak": 3 * predicted}
        body = {
            "lease_token": got["lease_token"],
            "status": "succeeded",
            "result": {"memory": memory, "timing": {"median_s": 0.001}},
        }
        response = client.post(f"/v1/worker/experiments/{got['id']}/result", json=body)
        assert response.status_code == 200, response.text
    assert claim(client, worker) is None


def test_a_sweep_queues_its_grid_and_tables_it(client: httpx.Client) -> None:
    grid = {"shape": [[64, 64], [256, 256], [1024, 1024]], "dtype": ["float32", "float16"]}
    created = client.post("/v1/sweeps", json={"spec": {**ADD, "tags": ["sw"]}, "grid": grid})
    assert created.status_code == 202, created.text
    sweep = created.json()
    assert sweep["n_points"] == 6 and sweep["progress"]["queued"] == 6 and not sweep["done"]
    assert [r["values"] for r in sweep["rows"][:2]] == [
        {"shape": [64, 64], "dtype": "float32"},
        {"shape": [64, 64], "dtype": "float16"},
    ]
    queued = client.get("/v1/experiments", params={"tag": "sw"}).json()["items"]
    assert len(queued) == 6

    _finish_all(client, 6)
    done = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert done["done"] and done["progress"]["succeeded"] == 6
    last = done["rows"][-1]
    assert last["values"] == {"shape": [1024, 1024], "dtype": "float16"}
    assert last["predicted_delta"] == 1024 * 1024 * 2
    assert last["delta_allocated"] == last["predicted_delta"] + 512
    assert last["time_s"] == 0.001

    table = client.get(f"/v1/sweeps/{sweep['id']}", params={"format": "csv"})
    assert table.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert len(rows) == 6 and rows[5]["shape"] == "1024x1024" and rows[5]["dtype"] == "float16"
    assert int(rows[5]["delta_allocated"]) == 1024 * 1024 * 2 + 512

    page = client.get(f"/v1/sweeps/{sweep['id']}/plot", params={"format": "html"}).text
    for dtype in ("float32", "float16"):
        for line in ("peak", "delta", "predicted delta"):
            assert f"dtype={dtype}: {line}</title>" in page
    svg = client.get(f"/v1/sweeps/{sweep['id']}/plot", params={"format": "svg"})
    assert "dtype=float16: predicted delta" in svg.text
    png = client.get(f"/v1/sweeps/{sweep['id']}/plot", params={"format": "png"})
    assert png.content.startswith(b"\x89PNG")


def test_a_sweep_with_one_bad_point_queues_nothing(client: httpx.Client) -> None:
    grid = {"shape": [[8, 8]], "other_shape": [[8, 8], [3, 5]], "allocator.max_split_size_mb": [64]}
    response = client.post("/v1/sweeps", json={"spec": ADD, "grid": grid})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["details"][0]["field"].startswith("points[1].params.other_shape")
    assert "other_shape=[3, 5]" in error["message"]
    assert client.get("/v1/experiments").json()["items"] == []

    typo = client.post("/v1/sweeps", json={"spec": ADD, "grid": {"allocator.nope": [1]}})
    assert typo.status_code == 422 and "points[0].allocator.nope" in typo.text
    big = {"shape": [[i] for i in range(1, 41)], "dtype": ["float32"] * 26}
    too_many = client.post("/v1/sweeps", json={"spec": ADD, "grid": big})
    assert too_many.status_code == 422 and "1040 points" in too_many.text
    assert client.get("/v1/sweeps/nope").status_code == 404


def test_compare_lines_up_figures_and_environments(client: httpx.Client) -> None:
    small = upload(
        client,
        MATMUL,
        [events()],
        memory={"delta_allocated": 1000},
        environment={"torch": "2.13", "gpu_name": "A"},
    )
    big = upload(
        client,
        MATMUL,
        [events()[:6]],
        memory={"delta_allocated": 5000},
        environment={"torch": "2.13", "gpu_name": "B"},
    )
    out = client.get("/v1/compare", params={"ids": f"{small},{big}"}).json()
    assert [i["id"] for i in out["items"]] == [small, big]
    assert out["differences"]["delta_allocated"] == [0, 4000]
    assert out["environment"] == {"gpu_name": ["A", "B"]}
    assert out["environment_same"] == {"torch": "2.13"}
    overlay = client.get("/v1/compare/timeline", params={"ids": f"{small},{big}", "format": "html"})
    assert overlay.text.count('class="vl-line"') == 2 and small[:8] in overlay.text
    assert client.get(
        "/v1/compare/timeline", params={"ids": f"{small},{big}", "format": "png"}
    ).content.startswith(b"\x89PNG")
    missing = client.get("/v1/compare", params={"ids": f"{small},nope"})
    assert missing.status_code == 404
    assert client.get("/v1/compare", params={"ids": ""}).status_code == 422
