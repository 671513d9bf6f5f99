"""Timelines, sweeps and comparisons over HTTP: figures render and show what they claim."""

import csv
import io
import json
import re
from typing import Any

import httpx

from tests.helpers import ADD, CPU_CAPS, MATMUL, MEMORY, claim, register
from tests.results.trace_data import events, many_events, upload


def _tensor(name: str, nbytes: int) -> dict[str, object]:
    """A tensor as the worker describes it (the contract's TensorInfo)."""
    return {
        "name": name,
        "shape": [nbytes // 4],
        "dtype": "float32",
        "device": "cuda:0",
        "bytes": nbytes,
        "storage_bytes": nbytes,
        "layout": "strided",
        "is_contiguous": True,
        "is_view_of_input": False,
    }


IO = {
    "inputs": [_tensor("a", 4096), _tensor("b", 4000)],
    "outputs": [_tensor("c", 8192)],
}
ROUND_BYTES = re.compile(r"^(0|[1-9][0-9]*(\.(25|5|75))? (B|KiB|MiB|GiB|TiB))$")


def chart_data(page: str) -> dict[str, Any]:
    """The data block an HTML chart carries for its hover read-outs."""
    found = re.search(r'<script type="application/json" class="vl-data">(.*?)</script>', page)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1).replace("<\\/", "</"))
    return data


def test_timeline_in_three_formats_shows_bands_phases_and_the_peak(
    client: httpx.Client,
) -> None:
    exp_id = upload(client, MATMUL, [events()], **IO)
    url = f"/v1/experiments/{exp_id}/timeline"
    page = client.get(url, params={"format": "html"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    # Each allocation is a band named for what it is, with its size, phase and stack.
    bands = re.findall(r'<polygon class="vl-band"[^>]*><title>(.*?)</title>', text, re.S)
    assert [b.split("\n")[0] for b in bands] == ["input a", "input b", "output c", "after"]
    assert "8.0 KiB (8,192 B)" in bands[2] and "made in op at 5 µs" in bands[2]
    assert "still alive at the end" in bands[2]
    assert "&lt;lambda&gt; workers/ops/elementwise.py:42" in bands[2]
    assert "freed at 6.5 µs" in bands[0]
    # The phases are shaded and named; the axis starts at set-up, in a unit that fits.
    assert text.count('<g class="vl-phase">') == 3
    assert re.findall(r'class="vl-phase-label"[^>]*>([^<]*)<', text) == ["setup", "op", "after"]
    assert "time since set-up (µs)" in text
    # The peak is marked once; ticks fall on round values.
    assert text.count('class="vl-label vl-peak"') == 1 and "peak 16.0 KiB at 5 µs, op" in text
    y_ticks = re.findall(r'class="vl-tick vl-ytick"[^>]*>([^<]*)<', text)
    assert y_ticks[0] == "0" and all(ROUND_BYTES.match(t) for t in y_ticks), y_ticks
    x_ticks = re.findall(r'class="vl-tick vl-xtick"[^>]*>([^<]*)<', text)
    assert x_ticks == ["0", "2", "4", "6", "8"], x_ticks
    assert ">reserved</text>" in text  # segments were recorded: a dashed line
    data = chart_data(text)
    assert [line["name"] for line in data["lines"]] == ["allocated", "reserved"]
    assert max(data["lines"][0]["ys"]) == 16384 and data["lines"][0]["xs"][0] == 0
    # Self-contained: nothing is fetched from elsewhere.
    assert not re.search(r"""(src|href)=["']?https?:""", text)
    svg = client.get(url, params={"format": "svg"})
    assert svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.lstrip().startswith("<?xml") and "<svg" in svg.text
    assert "peak 16.0 KiB at 5 µs, op" in svg.text and "input a" in svg.text
    png = client.get(url, params={"format": "png"})
    assert png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n") and len(png.content) > 5000
    assert client.get(url, params={"format": "gif"}).status_code == 422


def test_labels_are_text_never_markup(client: httpx.Client) -> None:
    """A step label that matplotlib would read as mathtext, one that starts with an
    underscore (which matplotlib hides from legends) and a lone surrogate from a worker
    draw as written in every format: no 500."""
    spec = {
        "op": "scenario",
        "shape": [],
        "dtype": "float32",
        "device": "cuda",
        "steps": [
            {"do": "create", "name": "_x", "fn": "empty", "shape": [1024], "label": "$\\frac{$"},
            {"do": "create", "name": "y", "fn": "empty", "shape": [1024], "label": "$x$ \\"},
        ],
    }
    rows = [
        {"seq": 0, "t_us": 0.0, "action": "mark", "name": "00 $\\frac{$", "size": 0},
        {"seq": 1, "t_us": 1.0, "action": "alloc", "addr": 1, "size": 4096},
        {"seq": 2, "t_us": 2.0, "action": "mark", "name": "01 $x$ \\ \udfff", "size": 0},
        {"seq": 3, "t_us": 3.0, "action": "alloc", "addr": 2, "size": 4096},
    ]
    for i, row in enumerate(rows):
        row.update(device="cuda:0", stream=0, phase=rows[0 if i < 2 else 2].get("name"))
    steps = [  # JSON cannot carry \udfff
        {"name": "00 $\\frac{$", "do": "create"},
        {"name": "01 $x$ \\", "do": "create"},
    ]
    exp_id = upload(client, spec, [rows], steps=steps)
    for path, params in (
        (f"/v1/experiments/{exp_id}/timeline", {}),
        ("/v1/compare/timeline", {"ids": exp_id}),
    ):
        for fmt in ("html", "svg", "png"):
            response = client.get(path, params={**params, "format": fmt})
            assert response.status_code == 200, (path, fmt, response.text[:300])
            if fmt == "svg" and "compare" not in path:
                # As written: matplotlib's SVG keeps each text in a comment beside its glyphs.
                assert "$\\frac{$" in response.text and "_x (step 0)" in response.text
    page = client.get(f"/v1/experiments/{exp_id}/timeline").text
    assert "00 $\\frac{$" in page and "_x (step 0)" in page and "\ufffd" in page


def test_timeline_of_an_experiment_without_trace_is_404(client: httpx.Client) -> None:
    exp = client.post("/v1/experiments", json=ADD).json()
    response = client.get(f"/v1/experiments/{exp['id']}/timeline")
    assert response.status_code == 404 and "no trace events" in response.json()["error"]["message"]


def _finish_all(client: httpx.Client, n: int, extra: int = 512) -> None:
    """Play a worker: each claimed point 'measures' its prediction plus ``extra`` bytes."""
    worker = register(client, CPU_CAPS)
    for _ in range(n):
        got = claim(client, worker)
        assert got is not None
        exp = client.get(f"/v1/experiments/{got['id']}").json()
        predicted = exp["prediction"]["delta_allocated"]
        memory = {
            **MEMORY,
            "delta_allocated": predicted + extra,
            "allocated_peak": 3 * predicted,
        }
        body = {
            "lease_token": got["lease_token"],
            "status": "succeeded",
            "result": {"memory": memory, "timing": {"method": "perf_counter", "median_s": 0.001}},
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


def test_a_sweep_plot_shows_every_line_it_names(client: httpx.Client) -> None:
    """A prediction equal to what was measured would lie on its line and hide it: it is
    drawn as rings around the measured points and named as its equal."""
    grid = {"shape": [[64, 64], [256, 256], [1024, 1024]], "dtype": ["float32", "float16"]}
    sweep = client.post("/v1/sweeps", json={"spec": ADD, "grid": grid}).json()
    _finish_all(client, 6, extra=0)
    page = client.get(f"/v1/sweeps/{sweep['id']}/plot", params={"format": "html"}).text
    svg = page[page.index("<svg") : page.index("</svg>")]
    polylines = re.findall(r'<polyline[^>]*points="([^"]*)"><title>([^<]*)</title>', svg)
    rings = re.findall(r'<circle class="vl-ring"[^>]*><title>([^<]*)</title>', svg)
    legend = re.findall(r"<text[^>]*>([^<]*)</text>", svg[svg.index('class="vl-legend"') :])
    assert len(legend) == 6
    for name in legend:  # every entry is drawn where it can be seen
        assert name in {t for _, t in polylines} or name in rings, name
    points = [p for p, _ in polylines]
    assert len(points) == len(set(points)), "two lines drawn on top of each other"
    for dtype in ("float32", "float16"):
        equal = f"dtype={dtype}: predicted delta (= measured delta)"
        assert equal in legend and rings.count(equal) == 3
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


def test_compare_overlays_are_aligned_on_the_op_start(client: httpx.Client) -> None:
    """Two runs of one trace, the second starting 40 ms later in its child: on the overlay
    their op starts coincide at 0, and both lines begin at set-up, not the child's start."""
    late = [{**e, "t_us": e["t_us"] + 40_000.0} for e in events()]
    first = upload(client, MATMUL, [events()])
    second = upload(client, MATMUL, [late])
    page = client.get("/v1/compare/timeline", params={"ids": f"{first},{second}"}).text
    data = chart_data(page)
    assert data["xlabel"] == "time since the op started (µs)"
    for line in data["lines"]:
        # set-up starts 4 µs before the op; the op's 8 KiB block at +1 µs makes 16 KiB.
        assert line["xs"][0] == -4
        assert line["xs"][line["ys"].index(16384)] == 1
    assert re.search(r'class="vl-mark"[^>]*><title>op starts</title>', page)


def test_sweep_plots_put_values_on_the_axis_as_written(client: httpx.Client) -> None:
    grid = {"shape": [[64, 64], [256, 256], [1024, 1024]], "dtype": ["float32", "float16"]}
    sweep = client.post("/v1/sweeps", json={"spec": ADD, "grid": grid}).json()
    _finish_all(client, 6)
    url = f"/v1/sweeps/{sweep['id']}/plot"
    page = client.get(url).text
    ticks = re.findall(r'class="vl-tick vl-xtick"[^>]*>([^<]*)<', page)
    assert ticks == ["[64, 64]", "[256, 256]", "[1024, 1024]"]
    assert "e+0" not in page and ">shape</text>" in page
    svg = client.get(url, params={"format": "svg"}).text
    assert "[1024, 1024]" in svg and "e+06" not in svg

    by_dtype = client.post(
        "/v1/sweeps", json={"spec": ADD, "grid": {"dtype": ["float32", "float16", "bfloat16"]}}
    ).json()
    _finish_all(client, 3)
    page = client.get(f"/v1/sweeps/{by_dtype['id']}/plot").text
    ticks = re.findall(r'class="vl-tick vl-xtick"[^>]*>([^<]*)<', page)
    assert ticks == ["float32", "float16", "bfloat16"]


def test_a_large_trace_is_reduced_on_the_server(client: httpx.Client) -> None:
    """200,000 events in four chunks: the page carries a bounded number of shapes and
    points, and the peak is still exact."""
    rows = many_events(100_000)
    chunks = [rows[i : i + 50_000] for i in range(0, len(rows), 50_000)]
    exp_id = upload(client, ADD, chunks)
    page = client.get(f"/v1/experiments/{exp_id}/timeline").text
    assert len(page) < 600_000, len(page)
    assert page.count('class="vl-band') <= 121
    assert page.count('class="vl-band vl-group"') == 1  # the small ones, grouped
    data = chart_data(page)
    allocated = data["lines"][0]
    assert len(allocated["xs"]) <= 2 * 800 + 2 * 120 + 2
    # The last pair alive is the largest: (100 + 99,998) + (100 + 99,999) bytes.
    peak = 100 + 99_998 + 100 + 99_999
    assert max(allocated["ys"]) == peak and "peak 195.5 KiB" in page
