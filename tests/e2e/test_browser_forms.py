"""The submit form, the presets page and the cancel button in a real browser (headless
Chromium) against the real `vramlab serve` and a CPU `vramlab worker`."""

import json
from typing import Any

import httpx
import pytest

from tests.e2e.test_browser import browser  # noqa: F401  (a fixture)
from tests.e2e.test_processes import service  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_form_presets_and_cancel_work_in_a_browser(service: str, browser: Any) -> None:  # noqa: F811
    from playwright.sync_api import expect

    requested: list[str] = []
    page = browser.new_page()
    page.on("request", lambda r: requested.append(r.url))

    # The form is built from the catalog and writes the JSON that is sent.
    page.goto(f"{service}/ui/submit")
    page.select_option("#op", "matmul")
    expect(page.locator("#param-other_shape")).to_be_visible()
    page.fill("#shape", "64,32")
    page.fill("#param-other_shape", "[32, 16]")
    spec = json.loads(page.input_value("#spec"))
    assert spec == {"op": "matmul", "shape": [64, 32], "dtype": "float32",
                    "params": {"other_shape": [32, 16]}}  # fmt: skip
    page.click("#submit")
    page.wait_for_url("**/ui/experiments/*", timeout=30_000)
    expect(page.locator("#status")).to_have_text("succeeded", timeout=120_000)
    expect(page.locator("h1")).to_contain_text("on cpu")

    # A bad spec shows every bad field, not only the first.
    page.goto(f"{service}/ui/submit")
    page.fill("#spec", json.dumps({"op": "add", "shape": [4], "dtype": "float99", "device": "tpu"}))
    page.click("#submit")
    expect(page.locator("#message")).to_contain_text("dtype")
    expect(page.locator("#message")).to_contain_text("device")

    # A preset runs from its page where it can run; one that needs CUDA says so.
    page.goto(f"{service}/ui/presets")
    expect(page.locator("#presets")).to_contain_text("needs a GPU; none is live")
    page.locator("#presets tr", has_text="elementwise_add").locator("button").click()
    page.wait_for_url("**/ui/experiments/*", timeout=30_000)
    expect(page.locator("#status")).to_have_text("succeeded", timeout=120_000)

    # Work no live worker can run says why on its page, and the page cancels it.
    body = {"op": "add", "shape": [4], "device": "cuda"}
    queued = httpx.post(f"{service}/v1/experiments", json=body, timeout=30).json()
    page.goto(f"{service}/ui/experiments/{queued['id']}")
    expect(page.locator("#queue-reason")).to_contain_text("needs a cuda worker")
    page.click("#cancel")
    expect(page.locator("#status")).to_have_text("cancelled", timeout=30_000)

    outside = [u for u in requested if not u.startswith((service, "data:", "blob:"))]
    assert not outside, f"the pages fetched from elsewhere: {outside}"
