"""The OpenAPI document: typed results, readable operation ids, the worker protocol
marked internal. A generated client reads these."""

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.openapi import WORKER_TAG
from app.main import create_app
from tests.conftest import make_settings
from vramlab.contract import MEMORY_KEYS


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path: Path = tmp_path_factory.mktemp("openapi") / "vramlab.db"
    document: dict[str, Any] = create_app(make_settings(f"sqlite:///{path}")).openapi()
    return document


def _schema(doc: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    name = ref["$ref"].rsplit("/", 1)[1]
    schema: dict[str, Any] = doc["components"]["schemas"][name]
    return schema


def _ops(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_a_result_is_typed_down_to_its_integer_figures(doc: dict[str, Any]) -> None:
    out = doc["components"]["schemas"]["ExperimentOut"]["properties"]
    result = _schema(doc, out["result"]["anyOf"][0])  # an experiment's; then a snapshot's
    memory = _schema(doc, result["properties"]["memory"])
    assert set(MEMORY_KEYS) <= set(memory["required"])
    assert {memory["properties"][k]["type"] for k in MEMORY_KEYS} == {"integer"}
    prediction = _schema(doc, out["prediction"]["anyOf"][0])
    assert prediction["properties"]["delta_allocated"]["type"] == "integer"
    assert "enum" in doc["components"]["schemas"]["ErrorType"]


def test_the_catalog_is_typed(doc: dict[str, Any]) -> None:
    ok = doc["paths"]["/v1/catalog"]["get"]["responses"]["200"]["content"]["application/json"]
    catalog = _schema(doc, ok["schema"])
    assert {"ops", "dtypes", "devices", "limits"} <= set(catalog["properties"])


def test_operation_ids_are_readable_and_unique(doc: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in _ops(doc)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", i) and "_v1_" not in i for i in ids), ids
    assert doc["paths"]["/v1/experiments"]["post"]["operationId"] == "submit_experiment"


def test_the_worker_protocol_is_marked_internal(doc: dict[str, Any]) -> None:
    for _, path, op in _ops(doc):
        internal = path.startswith("/v1/worker/")
        assert (op["tags"] == [WORKER_TAG]) == internal, path
        assert op["operationId"].startswith("worker_") == internal, path
    tag = next(t for t in doc["tags"] if t["name"] == WORKER_TAG)
    assert tag["x-internal"] is True and "INTERNAL" in tag["description"]


def test_options_answers_every_method_of_every_path(client: httpx.Client) -> None:
    """``Allow`` names what the path answers, whichever of its routes FastAPI tried first."""
    response = client.options("/v1/experiments")
    assert response.status_code == 204, response.text
    assert response.headers["Allow"] == "GET, OPTIONS, POST"
    put = client.put("/v1/experiments", json={})
    assert put.status_code == 405 and put.json()["error"]["type"] == "method_not_allowed"
    assert put.headers["Allow"] == "GET, OPTIONS, POST"
    paths = client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        url = re.sub(r"\{[^}]+\}", "x", path)
        allow = client.options(url).headers.get("Allow", "")
        documented = {m.upper() for m in operations if m != "parameters"}
        assert documented <= set(allow.split(", ")), (path, allow)
    # HEAD is named only where it is answered.
    head = client.head("/v1/experiments")
    assert head.status_code == 405 and "HEAD" not in head.headers["Allow"]


STORED = Path(__file__).with_name("openapi.json")


def test_the_document_is_the_one_stored(doc: dict[str, Any]) -> None:
    """The OpenAPI document is what tests/api/openapi.json holds: a change to the API's
    shape (what generated clients read) is made on purpose, by rewriting that file
    (``python -m tests.api.openapi_file``), never as a side effect of a refactoring."""
    assert json.loads(json.dumps(doc)) == json.loads(STORED.read_text())
