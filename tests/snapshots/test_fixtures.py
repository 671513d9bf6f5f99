"""The held fixtures of ``bench/category_truth.py`` (made on a GPU host, in
``tests/snapshots/data/fixtures``): each training loop recorded by ``vramlab record`` and
as a plain Python-stack snapshot, with the truth at the peak computed inside the program.
Imported here as an upload is, their categories must be what the bench saw, the recorded
parameters, gradients and optimizer state within 1% of the truth, and every category
the bench found within its goal must still be."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.snapshots.test_import import imported

DATA = Path(__file__).resolve().parent / "data" / "fixtures"


def _results() -> list[dict[str, Any]]:
    path = DATA / "truth.json"
    return json.loads(path.read_text()) if path.exists() else []


RESULTS = {r["fixture"]: r for r in _results()}
needs_fixtures = pytest.mark.skipif(
    not RESULTS, reason="run bench/category_truth.py --save on a GPU host"
)
GOALS = {"recorded": 1.0, "inferred": 5.0}
FILES = {"recorded": "recorded_file", "inferred": "inferred_file"}


def _categories(client: httpx.Client, name: str) -> dict[str, int]:
    snap = imported(client, (DATA / name).read_bytes(), name=name)
    cats = {c["category"]: c["bytes"] for c in snap["categories"]}
    cats["peak"] = snap["peak"]["allocated"]
    return cats


@needs_fixtures
@pytest.mark.parametrize("fixture", sorted(RESULTS))
@pytest.mark.parametrize("way", ["recorded", "inferred"])
def test_categories_against_the_truth(client: httpx.Client, fixture: str, way: str) -> None:
    result = RESULTS[fixture]
    if not result.get(FILES[way]):
        pytest.skip(f"the bench kept no {way} snapshot of {fixture}")
    got = _categories(client, result[FILES[way]])
    assert got == result[way]  # what the bench's import gave
    for row in result["rows"]:
        err = row[f"{way}_error"]
        if row["category"] in ("parameters", "gradients", "optimizer_state") and way == "recorded":
            assert abs(err) <= GOALS[way], row
        elif err is not None and abs(err) <= GOALS[way]:
            # Within the goal on the GPU host: still within it here.
            truth = row["truth"]
            peak = result["rows"][-1]["truth"]
            now = 100.0 * (got[row["category"]] - truth) / max(truth, peak / 100, 1)
            assert abs(now) <= GOALS[way], row
