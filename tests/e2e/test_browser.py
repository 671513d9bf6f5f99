"""The web page in a real browser (headless Chromium driven by Playwright) against the
real `vramlab serve` and `vramlab worker` processes: submit through the form, then see the
result, its timeline and the API docs, with nothing fetched from outside."""

import json
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_processes import service  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium chromium-driver)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        # A fresh profile each run; Playwright takes it as user_data_dir.
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS
        )
        try:
            yield context
        finally:
            context.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_submit_through_the_page_and_see_the_result(service: str, browser: Any) -> None:  # noqa: F811
    from playwright.sync_api import expect

    requested: list[str] = []
    console: list[str] = []
    page = browser.new_page()
    page.on("request", lambda r: requested.append(r.url))
    page.on("console", lambda m: console.append(m.text))

    page.goto(f"{service}/ui/submit")
    spec = {"op": "add", "shape": [512, 512], "dtype": "float32", "device": "cpu"}
    page.fill("#spec", json.dumps(spec))
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*", timeout=30_000)
    expect(page.locator("#status")).to_have_text("succeeded", timeout=120_000)

    memory = page.locator("#memory")
    expect(memory).to_contain_text("delta_allocated")
    expect(memory).to_contain_text("1.0 MiB")  # 512 x 512 float32 out
    chart = page.locator("#timeline svg")
    expect(chart).to_be_visible()
    # The timeline: allocation bands (inputs a and b, the output), the phases shaded and
    # named, the peak marked once, ticks on both axes, the allocated line.
    bands = page.locator("#timeline polygon.vl-band")
    assert bands.count() >= 3
    titles = [bands.nth(i).locator("title").text_content() or "" for i in range(bands.count())]
    assert any(t.startswith("input a") for t in titles), titles
    assert any(t.startswith("output") for t in titles), titles
    assert page.locator("#timeline .vl-phase").count() == 3
    labels = page.locator("#timeline .vl-phase-label").all_text_contents()
    assert labels[:2] == ["setup", "op"], labels
    assert page.locator("#timeline .vl-peak").count() == 1
    expect(page.locator("#timeline .vl-peak")).to_contain_text("peak")
    assert page.locator("#timeline .vl-xtick").count() >= 3
    assert page.locator("#timeline .vl-ytick").count() >= 3
    assert page.locator("#timeline polyline.vl-line").count() >= 1
    # No label overlaps another or runs outside the figure.
    overlaps = page.evaluate(
        """() => {
          const svg = document.querySelector("#timeline svg").getBoundingClientRect();
          const boxes = [...document.querySelectorAll(
            "#timeline .vl-tick, #timeline .vl-phase-label, #timeline .vl-peak text, "
            + "#timeline .vl-title, #timeline .vl-legend text")]
            .map(e => [e.textContent, e.getBoundingClientRect()]);
          const bad = [];
          for (const [t, r] of boxes) {
            if (r.left < svg.left || r.right > svg.right || r.top < svg.top
                || r.bottom > svg.bottom) bad.push("clipped: " + t);
          }
          for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [a, p] = boxes[i], [b, q] = boxes[j];
            if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom)
              bad.push("overlap: " + a + " / " + b);
          }
          return bad;
        }"""
    )
    assert overlaps == [], overlaps
    # Hovering a band names it, with its size; the read-out follows the pointer.
    input_a = bands.nth(next(i for i, t in enumerate(titles) if t.startswith("input a")))
    input_a.scroll_into_view_if_needed()
    box = input_a.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.5)
    tip = page.locator("#timeline .vl-tip")
    expect(tip).to_contain_text("allocated:")
    expect(tip).to_contain_text("input a")
    expect(tip).to_contain_text("1.0 MiB (1,048,576 B)")  # 512 x 512 float32

    exp_id = page.url.rsplit("/", 1)[1]
    # The real CPU profiler trace, exported for PyTorch's viewer, reads back in torch's code.
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    export = httpx.get(f"{service}/v1/experiments/{exp_id}/trace?format=memory_viz", timeout=30)
    snapshot = pickle.loads(export.content)
    assert any(e["action"] == "alloc" and e["size"] == 2**20 for e in snapshot["device_traces"][0])
    assert "total_reserved" in memory_viz.segsum(snapshot)
    assert "<html>" in memory_viz.trace_plot(snapshot).lower()
    page.goto(f"{service}/ui/")
    expect(page.locator("#experiments")).to_contain_text(exp_id[:8])
    # The pages' scripts run under their Content-Security-Policy (nonces, no inline handlers).
    page.check(f"input[name=pick][value='{exp_id}']")
    page.click("#compare-selected")
    page.wait_for_url(f"**/ui/compare?ids={exp_id}", timeout=30_000)
    expect(page.locator("body")).to_contain_text(exp_id[:8])
    assert not [m for m in console if "Content Security Policy" in m], console

    # Swagger UI renders and runs a request under the same policy (its scripts carry the
    # response's nonce; its stylesheet and icons come from this site).
    page.goto(f"{service}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("vramlab", timeout=30_000)
    listing = page.locator(".opblock-get", has_text="List experiments, newest first").first
    listing.locator(".opblock-summary").click()
    listing.get_by_role("button", name="Try it out").click()
    listing.get_by_role("button", name="Execute").click()
    answered = listing.locator(".live-responses-table tbody .response-col_status").first
    expect(answered).to_contain_text("200", timeout=30_000)
    expect(listing.locator(".live-responses-table")).to_contain_text(exp_id)
    assert not [m for m in console if "Content Security Policy" in m], console

    outside = [u for u in requested if not u.startswith((service, "data:", "blob:"))]
    assert not outside, f"the pages fetched from elsewhere: {outside}"
