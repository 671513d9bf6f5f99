"""The submit form for a model experiment, in headless Chromium against a live API:
choosing op `model` drops the default op's shape and dtype, the model is chosen from the
catalog's list, and a capacity is written with its unit. Submitting one over the cap
shows the refusal with its prediction and the plan."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.e2e.test_browser import browser  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow


@pytest.fixture
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url, model_predictions=False)) as server:
            yield server


def test_the_model_form_sends_a_model_spec(live: LiveServer, browser: Any) -> None:  # noqa: F811
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(f"{live.url}/ui/submit")
    page.select_option("#op", "model")
    expect(page.locator("#shape")).to_be_hidden()
    model = page.locator("#param-model")
    assert model.evaluate("el => el.tagName") == "SELECT"
    presets = model.locator("optgroup[label=presets] option").all_text_contents()
    assert any(p.startswith("gpt2 (GPT-2 small") for p in presets), presets
    page.select_option("#param-model", '"tiny-gpt2"')
    page.fill("#param-batch_size", "4")
    page.fill("#param-capacity_bytes", "1.5GiB")
    spec = json.loads(page.input_value("#spec"))
    assert spec == {
        "op": "model",
        "params": {"model": "tiny-gpt2", "batch_size": 4, "capacity_bytes": 3 * 2**29},
    }
    page.fill("#param-capacity_bytes", "lots")
    expect(page.locator("#message")).to_contain_text("capacity_bytes")
    expect(page.locator("#message")).to_contain_text("24GiB")
    page.fill("#param-capacity_bytes", "80GB")
    assert json.loads(page.input_value("#spec"))["params"]["capacity_bytes"] == 80 * 10**9

    page.fill("#param-capacity_bytes", "")
    page.click("#submit")  # the first submit of a model goes through
    page.wait_for_url("**/ui/experiments/*", timeout=30_000)
    expect(page.locator("h1")).to_contain_text("tiny-gpt2 train, batch 4")
