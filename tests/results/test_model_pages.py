"""The pages of model experiments: the list names each by its model, batch x length and
predicted peak; a queued, running or failed one's page shows the prediction (categories,
and the device it is for). Real predictor; the test plays the worker over the protocol."""

from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import CPU_CAPS, claim, register
from tests.results.test_cli_models import RANK_FIGURES, report_ranks
from vramlab.units import human_bytes

pytest.importorskip("transformers")
# The first prediction starts the predictor (torch and transformers); a machine shared by
# other work may take a while: these tests are about what is shown, not how fast.
PATIENT = {"model_predict_wait_s": 600.0, "model_predict_timeout_s": 120.0}

TINY = {"op": "model", "shape": [], "params": {"model": "tiny-gpt2", "seq_len": 32}}


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    for url in fresh_database("sqlite", request, tmp_path):
        with LiveServer(make_settings(url, **PATIENT)) as live:
            with httpx.Client(base_url=live.url, timeout=300) as c:
                yield c


def _submit(client: httpx.Client, **changes: Any) -> dict[str, Any]:
    made = client.post("/v1/experiments", json={**TINY, **changes})
    assert made.status_code == 202, made.text
    out: dict[str, Any] = made.json()
    return out


def test_the_list_names_a_model_by_batch_and_length_with_its_predicted_peak(
    client: httpx.Client,
) -> None:
    exp = _submit(client, device="cpu", params={**TINY["params"], "batch_size": 3})
    page = unescape(client.get("/ui/").text)
    row = page[page.index(exp["id"][:8]) :].split("</tr>", 1)[0]
    assert "model tiny-gpt2" in row and "3 \u00d7 32" in row and "fp32" in row
    assert human_bytes(exp["prediction"]["peak_allocated"]) in row
    assert ">0 B<" not in row


def test_a_queued_model_experiments_page_shows_its_prediction_for_cuda(
    client: httpx.Client,
) -> None:
    register(client, CPU_CAPS)
    exp = _submit(client)  # no device, CPU workers only: predicted for CUDA, runs on the CPU
    page = unescape(client.get(f"/ui/experiments/{exp['id']}").text)
    peak = human_bytes(exp["prediction"]["peak_allocated"])
    assert "Predicted, before it runs" in page
    assert f"Predicted for <b>cuda (H100-class)</b>: the step peaks at <b>{peak}</b>" in page
    table = page[page.index('id="prediction-categories"') :].split("</table>", 1)[0]
    assert "parameters" in table and "temporaries" in table, table
    assert 'id="prediction-stack"' in page
    assert "no device was named" in page


def test_a_failed_model_experiments_page_keeps_its_prediction(client: httpx.Client) -> None:
    worker = register(client, CPU_CAPS)
    exp = _submit(client, device="cpu")
    claimed = claim(client, worker, wait_s=1)
    assert claimed is not None
    body = {
        "lease_token": claimed["lease_token"],
        "status": "failed",
        "error": {"type": "timeout", "message": "ran past its timeout_s"},
    }
    assert client.post(f"/v1/worker/experiments/{exp['id']}/result", json=body).is_success
    page = unescape(client.get(f"/ui/experiments/{exp['id']}").text)
    assert "timeout: ran past its timeout_s" in page
    assert "Predicted for <b>cpu</b>" in page and 'id="prediction-categories"' in page


def test_the_compare_page_puts_model_knobs_and_categories_side_by_side(
    client: httpx.Client,
) -> None:
    a = _submit(client, device="cpu", params={**TINY["params"], "batch_size": 2})
    b = _submit(client, device="cpu", params={**TINY["params"], "batch_size": 5})
    page = unescape(client.get("/ui/compare", params={"ids": f"{a['id']},{b['id']}"}).text)
    models = page[page.index('id="compare-models"') :].split("</table>", 1)[0]
    batch = models[models.index("batch size") :].split("</tr>", 1)[0]
    assert "<td>2</td><td>5</td>" in batch
    categories = page[page.index('id="compare-categories"') :].split("</table>", 1)[0]
    assert "parameters" in categories and "(predicted " in categories


def test_a_distributed_runs_page_lists_each_rank(client: httpx.Client) -> None:
    made, model = report_ranks(client)
    page = unescape(client.get(f"/ui/experiments/{made['id']}").text)
    heading = page[page.index('id="ranks-heading"') :].split("</h3>", 1)[0]
    assert "FSDP2 full sharding on 2 CPU ranks (gloo), bf16 mixed precision" in heading
    table = page[page.index('id="ranks"') :].split("</table>", 1)[0]
    for r in model["ranks"]:
        row = table[table.index(f"<td>{r['rank']}</td><td>cpu</td>") :].split("</tr>", 1)[0]
        for key in RANK_FIGURES:
            assert f">{human_bytes(r[key])}<" in row, (key, row)


def test_a_failed_distributed_runs_page_names_the_ranks_past_its_card(
    client: httpx.Client,
) -> None:
    made, _ = report_ranks(client, capacity=5_500_000)
    page = unescape(client.get(f"/ui/experiments/{made['id']}").text)
    over = page[page.index('id="ranks-over"') :].split("</p>", 1)[0]
    assert "rank 1 " in over and human_bytes(6_000_000) in over, over
    assert 'id="ranks"' in page  # its ranks' figures are kept


def test_a_ranks_page_escapes_what_a_worker_reported(client: httpx.Client) -> None:
    made, _ = report_ranks(client, device="<b>cpu</b>")
    page = client.get(f"/ui/experiments/{made['id']}").text
    assert "<b>cpu</b>" not in page and "&lt;b&gt;cpu&lt;/b&gt;" in page
