"""A model spec's ``distributed`` param at the API's edge: what is refused (with the field
at fault), what a worker must offer (its GPUs), and where the catalog lists it."""

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.helpers import claim, register

DDP2 = {"strategy": "ddp", "gpus": 2}
FSDP4 = {"strategy": "fsdp", "gpus": 4}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"distributed": {"strategy": "zero3", "gpus": 2}}, "params.distributed.strategy"),
        ({"distributed": {"strategy": "ddp"}}, "params.distributed.gpus"),
        ({"distributed": {"strategy": "ddp", "gpus": 1}}, "params.distributed.gpus"),
        ({"distributed": {"strategy": "ddp", "gpus": 9}}, "params.distributed.gpus"),
        ({"distributed": {**DDP2, "sharding": "full"}}, "params.distributed.sharding"),
        ({"distributed": {**DDP2, "offload_optimizer": True}}, "params.distributed.offload"),
        ({"distributed": {**DDP2, "mixed_precision": "bf16"}}, "params.distributed.mixed"),
        ({"distributed": {**FSDP4, "sharding": "zero"}}, "params.distributed.sharding"),
        (
            {"distributed": {"strategy": "fsdp", "gpus": 2, "sharding": "hybrid"}},
            "params.distributed.sharding",
        ),
        ({"distributed": {**FSDP4, "mixed_precision": "fp8"}}, "params.distributed.mixed"),
        ({"distributed": {**FSDP4, "replicas": 2}}, "params.distributed.replicas"),
        ({"distributed": FSDP4, "optimizer": "adafactor"}, "params.optimizer"),
        ({"distributed": FSDP4, "precision": "fp16-autocast"}, "params.precision"),
        (
            {"distributed": {**FSDP4, "mixed_precision": "bf16"}, "precision": "bf16"},
            "params.precision",
        ),
        ({"distributed": DDP2, "peft": {"r": 8}}, "params.peft"),
        (
            {"distributed": {"strategy": "fsdp", "gpus": 2, "offload_optimizer": True}},
            "params.distributed.offload_optimizer",
        ),
    ],
)
def test_distributed_specs_that_make_no_sense_name_their_field(
    client: httpx.Client, params: dict[str, object], field: str
) -> None:
    response = client.post(
        "/v1/experiments",
        json={
            "op": "model",
            "shape": [],
            "device": "cpu",
            "params": {"model": "tiny-gpt2", **params},
        },
    )
    assert response.status_code == 422, response.text
    fields = [d["field"] for d in response.json()["error"]["details"]]
    assert any(f.startswith(field) for f in fields), fields


def test_distributed_inference_is_refused_as_a_training_only_param(client: httpx.Client) -> None:
    response = client.post(
        "/v1/experiments",
        json={
            "op": "model",
            "shape": [],
            "device": "cpu",
            "params": {"model": "tiny-gpt2", "task": "inference", "distributed": DDP2},
        },
    )
    assert response.status_code == 422, response.text
    [detail] = response.json()["error"]["details"]
    assert detail["field"] == "params.distributed"
    assert "training" in detail["message"], detail


def test_quantization_with_distributed_is_refused_on_cuda(client: httpx.Client) -> None:
    response = client.post(
        "/v1/experiments",
        json={
            "op": "model",
            "shape": [],
            "device": "cuda",
            "params": {"model": "tiny-llama", "distributed": DDP2, "quantization": "qlora"},
        },
    )
    assert response.status_code == 422, response.text
    fields = [d["field"] for d in response.json()["error"]["details"]]
    assert "params.quantization" in fields or "params.peft" in fields, fields


def test_the_catalog_lists_distributed_with_its_choices(client: httpx.Client) -> None:
    entry = next(e for e in client.get("/v1/catalog").json()["ops"] if e["name"] == "model")
    param = next(p for p in entry["params"] if p["name"] == "distributed")
    assert param["kind"] == "mapping"
    for word in ("ddp", "fsdp", "hybrid", "grad-op", "offload_optimizer", "bf16"):
        assert word in param["description"]


def _gpus(n: int) -> dict[str, object]:
    return {
        "device_types": ["cpu", "cuda"],
        "gpus": [{"index": i, "name": "NVIDIA H100", "total_memory": 80 * 2**30} for i in range(n)],
    }


def test_a_cuda_distributed_spec_is_claimed_by_a_worker_with_its_gpus(database_url: str) -> None:
    settings = make_settings(database_url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        response = http.post(
            "/v1/experiments",
            json={
                "op": "model",
                "shape": [],
                "device": "cuda",
                "params": {
                    "model": "tiny-gpt2",
                    "distributed": {**FSDP4, "sharding": "hybrid", "mixed_precision": "bf16"},
                },
            },
        )
        assert response.status_code == 202, response.text
        exp = response.json()
        assert exp["spec"]["params"]["distributed"] == {
            "strategy": "fsdp",
            "gpus": 4,
            "sharding": "hybrid",
            "offload_optimizer": False,
            "mixed_precision": "bf16",
        }
        two = register(http, _gpus(2))
        assert claim(http, two) is None
        reason = http.get(f"/v1/experiments/{exp['id']}").json()["queue"]["reason"]
        assert "4 GPU" in reason, reason
        four = register(http, _gpus(4))
        got = claim(http, four)
    assert got is not None and got["id"] == exp["id"]
    assert got["spec"]["params"]["distributed"]["gpus"] == 4


def test_a_distributed_spec_is_predicted_per_rank(client: httpx.Client) -> None:
    spec = {"op": "model", "shape": [], "device": "cpu"}
    params = {"model": "tiny-gpt2", "batch_size": 2, "seq_len": 16}
    alone = client.post("/v1/experiments", json={**spec, "params": params})
    ddp = client.post("/v1/experiments", json={**spec, "params": {**params, "distributed": DDP2}})
    assert alone.status_code == ddp.status_code == 202, ddp.text
    one, two = alone.json()["prediction"], ddp.json()["prediction"]
    assert one.get("ranks") is None
    assert [r["rank"] for r in two["ranks"]] == [0, 1]
    for rank in two["ranks"]:
        assert rank["peak_allocated"] == two["peak_allocated"]
        assert rank["categories"] == two["categories"]
    # each rank holds a whole replica, and DDP's buckets beside its gradients
    assert two["categories"]["parameters"] == one["categories"]["parameters"]
    assert two["categories"]["gradients"] > one["categories"]["gradients"]
    assert any("fake process group" in c for c in two["caveats"])
