"""Model specs at the API's edge: the models it knows, and a spec accepted without a
prediction when predictions are off (no torch needed for that)."""

import httpx
import pytest

from tests.conftest import LiveServer, make_settings

PRESETS = {
    "gpt2",
    "gpt2-medium",
    "bert-base",
    "t5-base",
    "llama-1b",
    "llama-8b",
    "mistral-7b",
    "vit-base",
    "resnet-50",
}


def test_the_model_catalog_lists_presets_hub_names_and_model_types(client: httpx.Client) -> None:
    listing = client.get("/v1/catalog/models").json()
    assert {p["name"] for p in listing["presets"]} >= PRESETS
    assert listing["hub_names"]["meta-llama/Llama-3.1-8B"] == "llama-8b"
    assert "llama" in listing["model_types"]["causal-lm"]
    assert "t5" in listing["model_types"]["seq2seq-lm"]
    assert "vit" in listing["model_types"]["image-classification"]


def test_an_unknown_model_is_refused_with_what_is_known(client: httpx.Client) -> None:
    response = client.post(
        "/v1/experiments",
        json={"op": "model", "shape": [], "device": "cpu", "params": {"model": "gtp2"}},
    )
    assert response.status_code == 422, response.text
    [detail] = response.json()["error"]["details"]
    assert detail["field"] == "params.model"
    assert "gpt2" in detail["message"] and "llama-8b" in detail["message"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"model": "bert-base", "task": "generate"}, "params.task"),
        ({"model": "gpt2", "seq_len": 4096}, "params.seq_len"),
        ({"model": "gpt2", "batch_size": 6, "micro_batches": 4}, "params.micro_batches"),
        (
            {"model": "gpt2", "optimizer": "adafactor", "optimizer_impl": "fused"},
            "params.optimizer_impl",
        ),
        ({"model": "vit-base", "seq_len": 128}, "params.seq_len"),
        ({"model": "gpt2", "steps": 1}, "params.steps"),
        ({"model": "gpt2", "config": {"n_layer": {"nested": 1}}}, "params.config"),
        ({"model": "gpt2", "target_len": 16}, "params.target_len"),
        ({"model": "t5-small", "task": "inference", "target_len": 16}, "params.target_len"),
        ({"model": "gpt2", "use_cache": False}, "params.use_cache"),
        ({"model": "gpt2", "task": "inference", "dropout": 0.1}, "params.dropout"),
        ({"model": "bert-base", "task": "inference", "logits_to_keep": 1}, "params.logits_to_keep"),
        ({"model": "gpt2", "dropout": 1.5}, "params.dropout"),
    ],
)
def test_knobs_that_do_not_combine_name_their_field(
    client: httpx.Client, params: dict[str, object], field: str
) -> None:
    response = client.post(
        "/v1/experiments", json={"op": "model", "shape": [], "device": "cpu", "params": params}
    )
    assert response.status_code == 422, response.text
    fields = [d["field"] for d in response.json()["error"]["details"]]
    assert any(f.startswith(field) for f in fields), fields


def test_with_predictions_off_a_model_spec_queues_unpredicted(database_url: str) -> None:
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        response = http.post(
            "/v1/experiments",
            json={"op": "model", "shape": [], "device": "cpu", "params": {"model": "gpt2"}},
        )
    assert response.status_code == 202, response.text
    prediction = response.json()["prediction"]
    assert prediction.get("peak_allocated") is None
    assert any("VRAMLAB_MODEL_PREDICTIONS" in c for c in prediction["caveats"])


@pytest.mark.slow
def test_a_cuda_model_spec_is_predicted_reserved_with_its_allocator_settings(
    database_url: str,
) -> None:
    """The spec's allocator settings reach the predictor: the reserved figure is the
    step replayed through the caching-allocator model with them."""
    pytest.importorskip("transformers")
    from workers.models.predict import predict

    params = {"model": "gpt2", "config": {"n_layer": 2}, "batch_size": 2, "seq_len": 128}
    allocator = {"expandable_segments": True}
    with (
        LiveServer(make_settings(database_url)) as live,
        httpx.Client(base_url=live.url, timeout=120) as http,
    ):
        answers = []
        for settings in ({}, allocator):
            spec = {
                "op": "model",
                "shape": [],
                "device": "cuda",
                "params": params,
                "allocator": settings,
                "isolation": "clean",
            }
            response = http.post("/v1/experiments", json=spec)
            assert response.status_code == 202, response.text
            answers.append(response.json()["prediction"])
    plain, expandable = answers
    assert plain["peak_allocated"] == expandable["peak_allocated"]
    assert plain["peak_reserved"] == predict(params, "cuda")["peak_reserved"]
    assert expandable["peak_reserved"] == predict(params, "cuda", allocator)["peak_reserved"]
    assert plain["peak_reserved"] != expandable["peak_reserved"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"model": "gpt2", "peft": {"r": 0}}, "params.peft.r"),
        ({"model": "gpt2", "peft": {"rank": 8}}, "params.peft.rank"),
        ({"model": "gpt2", "peft": {"r": 8, "target_modules": 3}}, "params.peft.target_modules"),
        ({"model": "gpt2", "task": "inference", "peft": {"r": 8}}, "params.peft"),
    ],
)
def test_lora_settings_are_checked(
    client: httpx.Client, params: dict[str, object], field: str
) -> None:
    response = client.post(
        "/v1/experiments", json={"op": "model", "shape": [], "device": "cpu", "params": params}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == field


def test_lora_settings_are_written_out_in_the_stored_spec(client: httpx.Client) -> None:
    response = client.post(
        "/v1/experiments",
        json={
            "op": "model",
            "shape": [],
            "device": "cpu",
            "params": {"model": "tiny-gpt2", "peft": {"r": 4}},
        },
    )
    assert response.status_code == 202, response.text
    lora = response.json()["spec"]["params"]["peft"]
    assert lora == {"r": 4, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
