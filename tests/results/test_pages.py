"""The web pages and /docs, served with no outside network: rendered over HTTP."""

import re

import httpx

from tests.helpers import ADD, MATMUL
from tests.results.trace_data import events, many_events, upload

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def test_docs_are_served_locally(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert not re.search(r"https?://", page.text), "the docs page names an outside URL"
    for asset in re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text):
        assert client.get(asset).status_code == 200, asset
    assert client.get("/redoc").status_code == 404  # ReDoc would need a CDN
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/experiments/{experiment_id}/peak",
        "/v1/experiments/{experiment_id}/timeline",
        "/v1/sweeps",
        "/v1/sweeps/{sweep_id}",
        "/v1/sweeps/{sweep_id}/plot",
        "/v1/compare",
        "/v1/compare/timeline",
    ):
        assert path in paths, path


def test_pages_show_experiments_sweeps_and_comparisons(client: httpx.Client) -> None:
    first = upload(client, MATMUL, [events()], memory={"delta_allocated": 8192}, notes=["a note"])
    second = upload(client, MATMUL, [events()[:6]], memory={"delta_allocated": 4096})
    queued = client.post("/v1/experiments", json={**ADD, "tags": ["later"]}).json()["id"]

    index = client.get("/ui/")
    assert index.status_code == 200
    assert all(i[:8] in index.text for i in (first, second, queued))
    filtered = client.get("/ui/", params={"status": "queued"}).text
    assert queued[:8] in filtered and first[:8] not in filtered
    assert first[:8] not in client.get("/ui/", params={"tag": "later"}).text

    page = client.get(f"/ui/experiments/{first}").text
    assert "8.0 KiB" in page and "a note" in page
    assert 'class="vl-chart"' in page and "peak 16.0 KiB" in page
    assert f"/v1/experiments/{first}/trace?format=memory_viz" in page
    assert 'id="peak"' in page
    # Still queued: the page refreshes itself and shows no chart yet.
    waiting = client.get(f"/ui/experiments/{queued}").text
    assert 'http-equiv="refresh"' in waiting and 'class="vl-chart"' not in waiting

    sweep = client.post(
        "/v1/sweeps", json={"spec": ADD, "grid": {"shape": [[8, 8], [16, 16]]}}
    ).json()
    sweep_page = client.get(f"/ui/sweeps/{sweep['id']}").text
    assert "16x16" in sweep_page and "2 queued" in sweep_page
    assert sweep["id"][:8] in client.get("/ui/").text

    compare = client.get("/ui/compare", params={"ids": f"{first},{second}"}).text
    assert "delta_allocated" in compare and "-4.0 KiB" in compare
    assert compare.count('class="vl-line"') == 2
    assert "no experiment" in client.get("/ui/compare", params={"ids": "nope"}).text

    form = client.get("/ui/submit").text
    assert 'id="spec"' in form and "/v1/experiments" in form
    assert '<select id="isolation">' in form and 'value="shared"' in form
    for html in (index.text, page, sweep_page, compare, form):
        assert not EXTERNAL.search(html), "a page loads something from elsewhere"
    assert client.get("/ui/experiments/nope").status_code == 404


def _environment_table(page: str) -> dict[str, list[str]]:
    start = page.index('<table id="compare-environment">')
    table = page[start : page.index("</table>", start)]
    rows = [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh]>.*?</t[dh]>", row)]
        for row in re.findall(r"<tr>.*?</tr>", table, re.S)
    ]
    return {r[0]: r[1:] for r in rows}


def test_compare_shows_every_sides_environment(client: httpx.Client) -> None:
    env = {"torch": "2.13.0", "python": "3.11.7", "allocator_conf": "", "isolation": "clean"}
    first = upload(client, ADD, [many_events(3)], environment=env)
    second = upload(
        client,
        ADD,
        [many_events(3)],
        environment={"torch": "2.14.1", "python": "3.11.7", "concurrent": 2},
    )
    page = client.get("/ui/compare", params={"ids": f"{first},{second}"}).text
    rows = _environment_table(page)
    assert rows["setting"] == [f"add 1000x1000 float32 cpu ({i[:8]})" for i in (first, second)]
    assert rows["torch"] == ["2.13.0", "2.14.1"]
    # A value one side did not record is said, not left blank.
    assert rows["isolation"] == ["clean", "not recorded"]
    assert rows["concurrent"] == ["not recorded", "2"]
    assert rows["allocator_conf"] == ["(empty)", "not recorded"]
    assert "python" not in rows
    assert "The same in all: python 3.11.7" in page
