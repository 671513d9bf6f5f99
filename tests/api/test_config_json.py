"""A model given as its own config.json (inline ``config_json``): accepted as transformers
writes it, refused where it would load code, bounded in size; the CLI's ``--config``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

# A config.json as transformers writes it for a small Llama (from a checkpoint folder).
LLAMA_JSON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 128,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0",
}


def post(client: httpx.Client, params: dict[str, Any]) -> httpx.Response:
    return client.post(
        "/v1/experiments", json={"op": "model", "shape": [], "device": "cpu", "params": params}
    )


def test_a_config_json_is_a_model_without_a_model_name(client: httpx.Client) -> None:
    response = post(client, {"config_json": LLAMA_JSON, "batch_size": 2, "seq_len": 16})
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["params"]["config_json"]["model_type"] == "llama"


@pytest.mark.parametrize(
    ("document", "field", "words"),
    [
        ({**LLAMA_JSON, "auto_map": {"AutoModel": "x.Y"}}, "params.config_json.auto_map", "code"),
        ({**LLAMA_JSON, "trust_remote_code": True}, "params.config_json.trust_remote_code", "code"),
        (
            {k: v for k, v in LLAMA_JSON.items() if k != "model_type"},
            "params.config_json.model_type",
            "required",
        ),
        ({**LLAMA_JSON, "model_type": "not-a-model"}, "params.config_json", "model_type"),
        ({**LLAMA_JSON, "padding": "x" * 70000}, "params.config_json", "bytes"),
        ({**LLAMA_JSON, "a": {"b": {"c": {"d": {"e": 1}}}}}, "params.config_json", "deeper"),
        ("llama", "params.config_json", "object"),
    ],
    ids=["auto_map", "remote-code", "no-model_type", "unknown-type", "too-big", "too-deep", "text"],
)
def test_a_config_json_that_would_load_code_or_is_unbounded_is_refused(
    client: httpx.Client, document: Any, field: str, words: str
) -> None:
    response = post(client, {"config_json": document})
    assert response.status_code == 422, response.text
    [detail] = response.json()["error"]["details"]
    assert detail["field"].startswith(field)
    assert words in detail["message"]


def test_a_spec_names_a_model_or_gives_its_config(client: httpx.Client) -> None:
    response = post(client, {"batch_size": 2})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == "params.model"


def test_the_cli_sends_a_config_file_inline(tmp_path: Path) -> None:
    from vramlab.cli import build_parser
    from vramlab.commands.experiments import spec_of

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_JSON))
    args = build_parser().parse_args(
        ["submit", "--config", str(path), "--device", "cpu", "--param", "batch_size=2"]
    )
    spec = spec_of(args)
    assert spec["op"] == "model" and spec["shape"] == []
    assert spec["params"] == {"config_json": LLAMA_JSON, "batch_size": 2}
