"""Plans and the GPU catalog through HTTP: a plan predicts and runs nothing, so it needs no
worker and ignores the experiment cap; names resolve loosely; its edges agree with the
predictor's own figures; what would make a step fit comes ranked by bytes saved."""

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ENGINES, Clock, LiveServer, fresh_database, make_settings
from tests.helpers import CUDA_CAPS, register

pytest.importorskip("transformers")
# Plans predict: the database only lists live workers' cards (tests/api/test_gpus* on both).
pytestmark = pytest.mark.one_engine

GiB = 2**30
MiB = 2**20
TINY = {"op": "model", "params": {"model": "tiny-gpt2", "seq_len": 32, "batch_size": 4}}


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One server for the tests that take `server` or `client`: its predictor starts (torch
    and transformers imported) once, not once a test. Each test that needs settings of its
    own starts its own server."""
    database = fresh_database(ENGINES[0], request, tmp_path_factory.mktemp("plans"))
    with LiveServer(make_settings(next(database))) as live:
        yield live
    next(database, None)  # drops it


def _plan(client: httpx.Client, **body: Any) -> dict[str, Any]:
    # The first plan of a server starts its predictor (torch imported): slow on a busy
    # machine, as tracing around edges is.
    r = client.post("/v1/plans", json={"spec": TINY, **body}, timeout=300)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_gpus_lists_the_cards_teams_use_with_usable_memory(client: httpx.Client) -> None:
    r = client.get("/v1/gpus")
    assert r.status_code == 200, r.text
    cards = {c["name"]: c for c in r.json()["items"]}
    for name in ("H100 SXM 80GB", "H100 PCIe 80GB", "H200 141GB", "A100 40GB", "A100 80GB",
                 "L40S 48GB", "L4 24GB", "A10G 24GB", "RTX 4090 24GB", "RTX 3090 24GB",
                 "T4 16GB", "V100 16GB", "V100 32GB"):  # fmt: skip
        card = cards[name]
        assert 0 < card["usable_bytes"] < card["total_bytes"]
        assert card["overhead_bytes"] == card["total_bytes"] - card["usable_bytes"]
        assert card["source"]
        assert card["bf16"] == card["flash_attention"] == (card["compute_capability"] >= "8.0")
    assert cards["H100 SXM 80GB"]["usable_source"] == "measured"
    assert cards["H200 141GB"]["usable_source"] == "measured"
    assert cards["H100 PCIe 80GB"]["usable_source"] == "placeholder"
    assert cards["H100 SXM 80GB"]["cublas_workspace_bytes"] == 32 * MiB
    assert cards["T4 16GB"]["bf16"] is False
    assert cards["RTX 4090 24GB"]["compute_capability"] == "8.9"


def test_a_live_workers_gpu_is_listed_and_can_be_planned_for(client: httpx.Client) -> None:
    register(client, CUDA_CAPS)  # one "NVIDIA H100 80GB HBM3" of 80 GiB
    items = client.get("/v1/gpus").json()["items"]
    mine = [c for c in items if c["from_worker"]]
    assert [(c["name"], c["total_bytes"]) for c in mine] == [("NVIDIA H100 80GB HBM3", 80 * GiB)]
    plan = _plan(client, gpus=["NVIDIA H100 80GB HBM3"], suggest=False, verify=False)
    assert plan["answers"][0]["gpu"]["total_bytes"] == 80 * GiB


def test_a_plan_answers_for_gpus_and_a_capacity_without_any_worker(
    database_url: str,
) -> None:
    # A cap far below the cards asked about: it bounds what runs, not what is predicted.
    # (its predictor starts with this server: on a busy machine that takes a while)
    settings = make_settings(
        database_url, max_experiment_bytes=64 * MiB, model_predict_wait_s=300.0
    )
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        plan = _plan(client, gpus=["4090", "h100"], capacity_bytes=24 * MiB, verify=False)
    assert plan["predicted"] is True and plan["device"] == "cuda"
    names = [a["gpu"]["name"] for a in plan["answers"]]
    assert names == ["RTX 4090 24GB", "H100 SXM 80GB", "24.0 MiB (capacity_bytes)"]
    for a in plan["answers"]:
        p = a["prediction"]
        assert p["peak_allocated"] == sum(p["categories"].values())
        assert p["peak_reserved"] >= p["peak_allocated"]
        assert a["headroom_bytes"] == a["gpu"]["usable_bytes"] - p["peak_reserved"]
        assert a["fits"] == (a["headroom_bytes"] >= 0)
        assert a["variant"]["value"] == 4
    emulated = plan["answers"][2]
    assert emulated["gpu"]["usable_bytes"] == 24 * MiB  # no overhead taken off a given size
    assert plan["answers"][0]["predicted_max_fitting"] > 4


def test_a_verified_edge_is_where_the_predictor_says_the_step_stops_fitting(
    server: LiveServer,
) -> None:
    # Each value around the edge is traced: slow on a busy machine.
    with httpx.Client(base_url=server.url, timeout=120) as client:
        capacity = 90 * MiB  # tiny-gpt2 at 32 tokens: 74 MiB reserved at batch 8, 96 at 16
        quick = _plan(client, capacity_bytes=capacity, suggest=False, verify=False)["answers"][0]
        assert quick["edge"] == "estimated" and quick["predicted_max_fitting"] >= 0
        assert "line" in quick["note"]
        verified = _plan(client, capacity_bytes=capacity, suggest=False, verify=True)
        answer = verified["answers"][0]
        edge = answer["predicted_max_fitting"]
        assert answer["edge"] == "traced" and edge > 4
        # Two steps traced (batch 4 and 2); every other batch's log synthesized from
        # theirs and replayed under the capacity, not traced one by one.
        assert verified["predictions"] == 2

        def fits(batch: int) -> bool:
            spec = {**TINY, "params": {**TINY["params"], "batch_size": batch}}
            body = {"spec": spec, "capacity_bytes": capacity, "suggest": False, "verify": True}
            r = client.post("/v1/plans", json=body)
            assert r.status_code == 200, r.text
            value: bool = r.json()["answers"][0]["fits"]
            return value

        assert fits(edge) and not fits(edge + 1)


def test_variants_and_suggestions_ranked_by_bytes_saved(client: httpx.Client) -> None:
    plan = _plan(
        client,
        capacity_bytes=16 * MiB,
        variants=[{}, {"checkpointing": True}],
    )
    assert [a["variant"]["label"] for a in plan["answers"]] == ["as given", "checkpointing=True"]
    plain, ckpt = plan["answers"]
    assert ckpt["prediction"]["peak_reserved"] <= plain["prediction"]["peak_reserved"]
    assert not plain["fits"]
    saved = [s["bytes_saved"] for s in plan["suggestions"]]
    assert saved and saved == sorted(saved, reverse=True) and min(saved) > 0
    for s in plan["suggestions"]:
        assert s["peak_reserved"] == plain["prediction"]["peak_reserved"] - s["bytes_saved"]
        assert s["makes_fit"] in ([], ["16.0 MiB (capacity_bytes)"])


def test_the_ways_to_fine_tune_are_ranked_for_each_card_with_what_they_train(
    client: httpx.Client,
) -> None:
    # Each predicted at the spec's batch: the spec as given (a full fine-tune), 8-bit
    # AdamW, LoRA (adapters only), QLoRA (a 4-bit base beneath them: GPT-2's Conv1D
    # layers quantized as transformers does) and FSDP2 on the fewest of 2, 4 or 8 GPUs
    # that fit, its figures per rank. At 2 x 64 tokens this 4-block GPT-2 reserves about
    # 1.6 GiB as given, 1.1 GiB with 8-bit AdamW or per rank of FSDP on 2 GPUs, 0.9 on 4,
    # under 0.5 GiB with LoRA or QLoRA.
    params = {"model": "gpt2", "batch_size": 2, "seq_len": 64, "config": {"n_layer": 4}}
    body = {
        "spec": {"op": "model", "params": params},
        "gpus": ["h100"],
        "capacity_bytes": 1000 * MiB,
        "max_value": 64,  # the edges are not what this asks (an H100's is far up)
    }
    r = client.post("/v1/plans", json=body, timeout=300)
    assert r.status_code == 200, r.text
    plan = r.json()
    full = 67_736_832  # GPT-2's embeddings and 4 blocks
    lora = 786_432  # r=16 on every linear layer (Conv1D) of 4 blocks
    answer = plan["answers"][0]["prediction"]
    assert answer["parameters"] == answer["trainable_parameters"] == full
    by_card = {c["gpu"]: c["ways"] for c in plan["ways"]}
    assert list(by_card) == ["H100 SXM 80GB", "1000.0 MiB (capacity_bytes)"]
    for card in plan["ways"]:
        ways = card["ways"]
        assert [w["rank"] for w in ways] == list(range(1, len(ways) + 1))
        by_label = {w["label"]: w for w in ways}
        assert by_label["full fine-tune (as given)"]["change"] == {}
        assert by_label["full fine-tune (as given)"]["trainable_parameters"] == full
        assert by_label["8-bit AdamW"]["trainable_parameters"] == full
        assert by_label["LoRA r=16 (adapters only)"]["trainable_parameters"] == lora
        qlora = by_label["QLoRA: a 4-bit NF4 base with LoRA r=16"]
        assert qlora["trainable_parameters"] == lora and qlora["parameters"] > full
        assert qlora["change"]["quantization"]["method"] == "nf4"
        for w in ways:
            assert w["headroom_bytes"] == card["usable_bytes"] - w["peak_reserved"]
    # On the H100 every way fits: the fewest GPUs, the most trained, the least changed.
    h100 = by_card["H100 SXM 80GB"]
    assert [(w["label"], w["gpus"], w["fits"]) for w in h100] == [
        ("full fine-tune (as given)", 1, True),
        ("8-bit AdamW", 1, True),
        ("LoRA r=16 (adapters only)", 1, True),
        ("QLoRA: a 4-bit NF4 base with LoRA r=16", 1, True),
        ("FSDP2 full sharding on 2 GPUs", 2, True),
    ]
    # On 1000 MiB what fits comes first; FSDP takes the fewest GPUs that fit (2 do not).
    small = by_card["1000.0 MiB (capacity_bytes)"]
    assert [(w["label"], w["gpus"], w["fits"]) for w in small] == [
        ("LoRA r=16 (adapters only)", 1, True),
        ("QLoRA: a 4-bit NF4 base with LoRA r=16", 1, True),
        ("FSDP2 full sharding on 4 GPUs", 4, True),
        ("full fine-tune (as given)", 1, False),
        ("8-bit AdamW", 1, False),
    ]
    fsdp = small[2]
    assert fsdp["change"] == {"distributed": {"strategy": "fsdp", "gpus": 4}}
    assert fsdp["trainable_parameters"] == full and "per rank" in fsdp["note"]
    assert fsdp["peak_reserved"] < 1000 * MiB < h100[4]["peak_reserved"]
    assert "adapters" in small[0]["time_cost"] and "dequantizes" in small[1]["time_cost"]
    # The ways are not repeated among the smaller changes that would make it fit.
    labels = [s["label"] for s in plan["suggestions"]]
    assert labels and not any("LoRA" in x or "FSDP" in x or "8-bit" in x for x in labels)
    assert all(s["trainable_parameters"] == full for s in plan["suggestions"])


def test_qlora_above_lora_says_why(
    client: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    # A small Llama with grouped-query heads at a long sequence in bf16: QLoRA's float32
    # activations (prepare_model_for_kbit_training) and its float32 attention's math
    # kernel (seq x seq scores) cost more than its 4-bit base saves, and the plan says so
    # on QLoRA's row (LoRA's says nothing).
    config = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip
    params = {"model": "llama", "batch_size": 1, "seq_len": 1024, "precision": "bf16",
              "config": config}  # fmt: skip
    body = {"spec": {"op": "model", "params": params}, "capacity_bytes": 8 * GiB,
            "verify": False}  # fmt: skip
    r = client.post("/v1/plans", json=body, timeout=300)
    assert r.status_code == 200, r.text
    ways = {w["label"]: w for w in r.json()["ways"][0]["ways"]}
    lora = ways["LoRA r=16 (adapters only)"]
    qlora = ways["QLoRA: a 4-bit NF4 base with LoRA r=16"]
    assert qlora["peak_allocated"] > lora["peak_allocated"]
    assert "float32" in qlora["note"] and "seq x seq" in qlora["note"]
    assert lora["note"] is None
    # `vramlab plan` prints it under its table, by the row's rank.
    from vramlab.commands.plans import show_ways

    show_ways(r.json()["ways"][0])
    assert f"  {qlora['rank']}: QLoRA peaks above LoRA here" in capsys.readouterr().out


def test_a_distributed_variant_is_answered_per_rank_with_its_gpus(
    client: httpx.Client,
) -> None:
    fsdp = {"distributed": {"strategy": "fsdp", "gpus": 4}}
    plan = _plan(client, capacity_bytes=2**30, variants=[{}, fsdp], suggest=False, verify=False)
    one, four = plan["answers"]
    assert one["variant"]["gpus"] == 1 and four["variant"]["gpus"] == 4
    assert four["prediction"]["peak_allocated"] < one["prediction"]["peak_allocated"]
    # every rank holds a quarter of the parameters, and trains the whole model
    full = one["prediction"]["categories"]["parameters"]
    assert four["prediction"]["categories"]["parameters"] < full
    assert four["prediction"]["trainable_parameters"] == one["prediction"]["trainable_parameters"]
    assert plan["ways"] == []  # suggest off: no ways either


def test_a_plan_varies_the_sequence_length_up_to_the_models_positions(
    client: httpx.Client,
) -> None:
    plan = _plan(client, capacity_bytes=2**40, vary="seq_len", suggest=False)
    answer = plan["answers"][0]
    assert answer["predicted_max_fitting"] == 256  # tiny-gpt2 has 256 positions
    assert "allows" in answer["note"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": ["no such card"]}, "gpus[0]"),
        ({}, "gpus"),
        ({"gpus": ["h100"], "spec": {"op": "add", "params": {}}}, "spec.op"),
        ({"gpus": ["h100"], "spec": {**TINY, "device": "cpu"}}, "spec.device"),
        ({"gpus": ["h100"], "variants": [{"capacity_bytes": 5}]}, "variants[0].capacity_bytes"),
        ({"gpus": ["h100"], "variants": [{"micro_batches": 3}]}, "variants[0].micro_batches"),
        ({"gpus": ["h100"] * 8, "variants": [{}] * 5}, "variants"),
    ],
)
def test_a_plan_that_cannot_be_answered_is_a_422_naming_its_field(
    client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    r = client.post("/v1/plans", json={"spec": TINY, **body})
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["error"]["details"]]
    assert field in fields, r.text


def test_the_plan_and_gpus_commands_print_readable_tables(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from vramlab.cli import main

    args = ["--api", server.url]
    assert main(["gpus", *args]) == 0
    out = capsys.readouterr().out
    assert "RTX 4090 24GB" in out and "placeholder" in out and "8.9" in out
    code = main(
        ["plan", "tiny-gpt2", "--batch", "4", "--seq", "32", "--gpu", "4090",
         "--capacity", "16MiB", "--variant", "micro_batches=2", "--quick", *args]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "predicted for cuda, nothing ran" in out
    assert "RTX 4090 24GB" in out and "yes," in out and "NO," in out and "short" in out
    assert "micro_batches=2" in out and "max batch_size" in out
    assert "what would make it fit" in out
    assert "ways to fine-tune on RTX 4090 24GB" in out and "LoRA r=16" in out
    assert "FSDP2 full sharding on 2 GPUs" in out and "per GPU" in out
    assert "full fine-tune (as given)" in out and " of " in out  # trainable of all
    assert main(["plan", "tiny-gpt2", "--gpu", "no such card", *args]) == 1
    assert "gpus[0]" in capsys.readouterr().err


def test_a_fit_for_a_gpu_no_worker_has_points_to_the_plan_that_answers_now(
    client: httpx.Client,
) -> None:
    spec = {"op": "model", "params": {"model": "gpt2", "batch_size": 16, "seq_len": 1024}}
    body = {"spec": spec, "requirements": {"gpu_name": "RTX 4090"}}
    r = client.post("/v1/fits", json=body)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["details"][0]["message"]
    assert 'vramlab plan gpt2 --batch 16 --seq 1024 --gpu "RTX 4090"' in message


def test_a_fit_across_gpus_for_a_named_gpu_needs_a_live_worker_with_that_many(
    database_url: str,
) -> None:
    # A distributed trial runs its N ranks on N GPUs of one host: a worker with one H100
    # runs none, so the fit is refused with the plan that answers now; a worker with two
    # gives the capacity, one H100's memory (each rank's card).
    settings = make_settings(database_url, max_experiment_bytes=128 * GiB)
    fsdp = {"strategy": "fsdp", "gpus": 2}
    params = {"model": "tiny-gpt2", "batch_size": 4, "seq_len": 32, "distributed": fsdp}
    body = {
        "spec": {"op": "model", "params": params},
        "requirements": {"gpu_name": "H100"},
        "max_value": 8,
    }
    two_gpus = {**CUDA_CAPS, "gpus": [{**CUDA_CAPS["gpus"][0], "index": i} for i in (0, 1)]}
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:
        register(client, CUDA_CAPS)
        one = client.post("/v1/fits", json=body)
        register(client, two_gpus)
        two = client.post("/v1/fits", json=body)
    assert one.status_code == 422, one.text
    detail = one.json()["error"]["details"][0]
    assert detail["field"] == "requirements.gpu_name"
    assert "no live worker has 2 GPUs (one a rank)" in detail["message"]
    assert 'vramlab plan tiny-gpt2 --batch 4 --seq 32 --gpu "H100"' in detail["message"]
    assert two.status_code == 202, two.text
    assert two.json()["capacity_bytes"] == 80 * GiB
    assert two.json()["capacity_source"] == "gpu H100"


def test_a_fit_for_the_gpu_of_a_worker_that_is_gone_points_to_the_plan(
    database_url: str,
) -> None:
    # A fit measures: a worker that registered an H100 and stopped answering runs no
    # trial, so the fit is refused at once rather than queued for nobody.
    clock = Clock()
    settings = make_settings(database_url, max_experiment_bytes=128 * GiB)
    spec = {"op": "model", "params": {"model": "gpt2", "batch_size": 16, "seq_len": 1024}}
    body = {"spec": spec, "requirements": {"gpu_name": "H100"}, "capacity_bytes": None}
    with LiveServer(settings, clock) as live, httpx.Client(base_url=live.url) as client:
        register(client, CUDA_CAPS)
        live_fit = client.post("/v1/fits", json=body)
        assert live_fit.status_code == 202, live_fit.text
        clock.advance(settings.worker_live_seconds + 1)
        gone = client.post("/v1/fits", json=body)
    assert gone.status_code == 422, gone.text
    message = gone.json()["error"]["details"][0]["message"]
    assert "no live worker" in message and '--gpu "H100"' in message


def test_the_plan_page_draws_each_answer_against_the_cards_usable_memory(
    client: httpx.Client,
) -> None:
    form = {
        "model": "tiny-gpt2",
        "batch": "4",
        "seq": "32",
        "gpus": "4090",
        "capacity": "16MiB",
        "variants": "micro_batches=2",
        "quick": "on",  # a 24 GB card's edge for a tiny model is in the thousands
    }
    page = client.get("/ui/plan", params=form, timeout=300)
    assert page.status_code == 200, page.text
    html = page.text
    assert "predicted for cuda" in html and "nothing ran" in html
    assert html.count("<svg") == 4  # 2 cards x 2 variants
    assert "RTX 4090 24GB" in html and "16.0 MiB (capacity_bytes)" in html
    assert "does not fit" in html and "short" in html and "spare" in html
    assert "What would make it fit" in html
    assert 'id="plan-ways"' in html and "FSDP2 full sharding on 2 GPUs" in html
    assert "full fine-tune (as given)" in html and "per GPU" in html
    assert 'id="plan-error"' not in html
    wrong = client.get("/ui/plan", params={**form, "gpus": "no such card"}, timeout=300)
    assert wrong.status_code == 200
    assert 'id="plan-error"' in wrong.text and "gpus[0]" in wrong.text
    empty = client.get("/ui/plan")
    assert empty.status_code == 200 and 'id="plan-form"' in empty.text
