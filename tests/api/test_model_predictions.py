"""Model specs' predictions through the API: bounded, remembered, fair across submitters,
awaited without a server thread, from children of the API's own or a predictor service.

Most tests point the API at a predictor service (``VRAMLAB_PREDICTOR_URL``) that this
test serves itself, holding its answers until the test lets them go; the last ones use
the real predictor (children, and ``vramlab predictor``)."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.api.test_auth import bearer, create_token
from tests.conftest import LiveServer, free_port, make_settings


def model_spec(batch: int, **config: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"model": "gpt2", "batch_size": batch, "seq_len": 32}
    if config:
        params["config"] = config
    return {"op": "model", "shape": [], "device": "cuda", "params": params}


class FakePredictor:
    """A predictor service that answers every request with a small prediction once the
    test releases it (``gate``), or as ``answers`` says for a batch size."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.gate = threading.Semaphore(0)
        self.held = True
        self.answers: dict[int, dict[str, Any]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                if fake.held:
                    fake.gate.acquire()
                batch = body["params"]["batch_size"]
                answer = fake.answers.get(batch) or {
                    "peak_allocated": 1000 + batch,
                    "peak_reserved": 2 * 2**20,
                    "categories": {"parameters": 1000 + batch},
                    "caveats": ["fake"],
                }
                data = json.dumps({"id": body["id"], **answer}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} of {count} requests came"
            time.sleep(0.02)

    def close(self) -> None:
        self.held = False
        for _ in range(1000):
            self.gate.release()
        self.server.shutdown()


@pytest.fixture
def fake() -> Iterator[FakePredictor]:
    f = FakePredictor()
    yield f
    f.close()


def test_submits_waiting_for_predictions_hold_no_server_thread(
    database_url: str, fake: FakePredictor
) -> None:
    """Sixty model submits wait for the predictor (more than the server's thread pool
    holds); a plain read is answered while they wait, then every one gets its 202 with
    its prediction."""
    settings = make_settings(
        database_url,
        predictor_url=fake.url,
        model_predictor_children=2,
        model_predict_per_submitter=100,
    )

    async def scenario(url: str) -> tuple[int, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            submits = [
                asyncio.ensure_future(http.post("/v1/experiments", json=model_spec(b)))
                for b in range(1, 61)
            ]
            await asyncio.to_thread(fake.wait_for, 2)  # both lanes are held
            read = await http.get("/v1/experiments", params={"limit": 1})
            assert fake.held and len(fake.requests) == 2  # still held while it was read
            fake.held = False
            for _ in range(60):
                fake.gate.release()
            return read.status_code, list(await asyncio.gather(*submits))

    with LiveServer(settings) as live:
        read_status, answers = asyncio.run(scenario(live.url))
    assert read_status == 200
    assert [r.status_code for r in answers] == [202] * 60, answers[0].text
    assert answers[4].json()["prediction"]["peak_allocated"] == 1005


def test_submitters_take_turns(database_url: str, fake: FakePredictor) -> None:
    """One submitter's five specs wait behind one lane; another's two are served before
    the first submitter's last ones (a submitter is its token)."""
    settings = make_settings(
        database_url, predictor_url=fake.url, model_predictor_children=1, auth="on"
    )
    first, second = create_token(database_url, "submit"), create_token(database_url, "submit")

    async def scenario(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            def submit(token: str, batch: int) -> "asyncio.Future[httpx.Response]":
                return asyncio.ensure_future(
                    http.post("/v1/experiments", json=model_spec(batch), headers=bearer(token))
                )

            flood = [submit(first, b) for b in range(1, 6)]
            await asyncio.to_thread(fake.wait_for, 1)
            await asyncio.sleep(0.5)  # the flood's other four reach the predictor's queue
            others = [submit(second, b) for b in (101, 102)]
            await asyncio.sleep(0.5)
            fake.held = False
            for _ in range(10):
                fake.gate.release()
            return list(await asyncio.gather(*flood, *others))

    with LiveServer(settings) as live:
        answers = asyncio.run(scenario(live.url))
    assert [r.status_code for r in answers] == [202] * 7
    order = [r["params"]["batch_size"] for r in fake.requests]
    # In turns: A, A (held when B came), B, A, B, A, A; one queue would serve B last.
    assert max(order.index(101), order.index(102)) < 5, order


def test_a_lane_nobody_else_needs_is_not_left_idle(database_url: str, fake: FakePredictor) -> None:
    """After another submitter asked (so turns are shared), one submitter's two specs
    take both lanes at once while nobody else has a spec waiting; the other submitter's
    next spec is then served as soon as a lane is free, before the first's third."""
    settings = make_settings(
        database_url, predictor_url=fake.url, model_predictor_children=2, auth="on"
    )
    first, second = create_token(database_url, "submit"), create_token(database_url, "submit")

    async def scenario(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            def submit(token: str, batch: int) -> "asyncio.Future[httpx.Response]":
                return asyncio.ensure_future(
                    http.post("/v1/experiments", json=model_spec(batch), headers=bearer(token))
                )

            fake.held = False
            assert (await submit(second, 100)).status_code == 202  # B has asked lately
            fake.held = True
            pair = [submit(first, b) for b in (1, 2)]
            await asyncio.to_thread(fake.wait_for, 3)  # both of A's on the two lanes
            third = submit(first, 3)
            await asyncio.sleep(0.3)  # A's third waits: both lanes are busy
            other = submit(second, 101)
            await asyncio.sleep(0.3)
            fake.gate.release()  # one lane frees: B's spec goes before A's third
            await asyncio.to_thread(fake.wait_for, 4)
            fake.held = False
            for _ in range(10):
                fake.gate.release()
            return list(await asyncio.gather(*pair, third, other))

    with LiveServer(settings) as live:
        answers = asyncio.run(scenario(live.url))
    assert [r.status_code for r in answers] == [202] * 4
    order = [r["params"]["batch_size"] for r in fake.requests]
    assert sorted(order[1:3]) == [1, 2] and order[3:] == [101, 3], order


def test_a_family_goes_to_the_lane_that_answered_it(database_url: str, fake: FakePredictor) -> None:
    """Specs that differ only in their batch size go to the lane whose child answered
    their family while that lane is free (the child answers them from its traces, without
    tracing: workers/models/families.py); while it is busy, to another free lane."""
    settings = make_settings(database_url, predictor_url=fake.url, model_predictor_children=2)

    def spec(batch: int, seq_len: int) -> dict[str, Any]:
        out = model_spec(batch)
        out["params"]["seq_len"] = seq_len
        return out

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            fake.held = False
            for b in range(1, 7):  # one after another: both lanes are free for each
                for seq_len in (32, 64):
                    r = await http.post("/v1/experiments", json=spec(b, seq_len))
                    assert r.status_code == 202, r.text
            fake.held = True
            held = asyncio.ensure_future(http.post("/v1/experiments", json=spec(7, 32)))
            await asyncio.to_thread(fake.wait_for, 13)
            other = asyncio.ensure_future(http.post("/v1/experiments", json=spec(8, 32)))
            await asyncio.to_thread(fake.wait_for, 14)  # taken while the family's lane is held
            fake.held = False
            for _ in range(10):
                fake.gate.release()
            assert [r.status_code for r in await asyncio.gather(held, other)] == [202] * 2

    with LiveServer(settings) as live:
        asyncio.run(scenario(live.url))
    lanes: dict[int, set[int]] = {}
    for r in fake.requests[:12]:
        lanes.setdefault(r["params"]["seq_len"], set()).add(r["lane"])
    assert all(len(v) == 1 for v in lanes.values()), fake.requests
    assert fake.requests[12]["lane"] == next(iter(lanes[32]))
    assert fake.requests[13]["lane"] != fake.requests[12]["lane"]


def test_a_submitter_may_not_queue_without_bound(database_url: str, fake: FakePredictor) -> None:
    settings = make_settings(
        database_url,
        predictor_url=fake.url,
        model_predictor_children=1,
        model_predict_per_submitter=2,
    )

    async def scenario(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            first = asyncio.ensure_future(http.post("/v1/experiments", json=model_spec(1)))
            await asyncio.to_thread(fake.wait_for, 1)
            waiting = [
                asyncio.ensure_future(http.post("/v1/experiments", json=model_spec(b)))
                for b in (2, 3)
            ]
            await asyncio.sleep(0.5)
            over = await http.post("/v1/experiments", json=model_spec(4))
            fake.held = False
            for _ in range(10):
                fake.gate.release()
            return [over, *await asyncio.gather(first, *waiting)]

    with LiveServer(settings) as live:
        over, *served = asyncio.run(scenario(live.url))
    assert over.status_code == 503, over.text
    assert "waiting for a prediction" in over.json()["error"]["message"]
    assert [r.status_code for r in served] == [202] * 3


def test_refusals_and_time_outs_are_remembered_by_spec(
    database_url: str, fake: FakePredictor
) -> None:
    """A spec the predictor refused, or whose prediction passed the limit, is answered
    422 again without asking the predictor again."""
    fake.held = False
    fake.answers[7] = {"error": {"field": "params.config", "message": "cannot be built"}}
    timed_out = "predicting this spec passed the limit of 5 s: it is refused"
    fake.answers[8] = {"error": {"field": "params", "message": timed_out}}
    settings = make_settings(database_url, predictor_url=fake.url)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        for _ in range(2):
            refused = http.post("/v1/experiments", json=model_spec(7))
            assert refused.status_code == 422, refused.text
            assert "cannot be built" in refused.text
            slow = http.post("/v1/experiments", json=model_spec(8))
            assert slow.status_code == 422, slow.text
            assert "passed the limit" in slow.text
    assert sorted(r["params"]["batch_size"] for r in fake.requests) == [7, 8]


@pytest.mark.slow
def test_real_predictions_bound_hostile_specs_and_answer_encoder_decoders(
    database_url: str,
) -> None:
    """Through the API's own children: a spec that cannot be built is 422 (not queued
    unpredicted), a GPT-2 a million blocks deep is 422 over the cap at once, BART with
    its default config is predicted, and the child runs nice'd."""
    pytest.importorskip("transformers")
    import psutil

    settings = make_settings(database_url, model_predictor_children=1, model_predictor_nice=10)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=300) as http:
        bart = http.post(
            "/v1/experiments",
            json={**model_spec(1), "params": {"model": "bart", "batch_size": 1, "seq_len": 32}},
        )
        assert bart.status_code == 202, bart.text
        assert bart.json()["prediction"]["peak_allocated"] > 0
        for config, field in (({"n_head": 0}, "params.config"), ({"n_layer": -1}, "n_layer")):
            refused = http.post("/v1/experiments", json=model_spec(1, **config))
            assert refused.status_code == 422, refused.text
            assert field in refused.json()["error"]["details"][0]["field"]
        deep = http.post("/v1/experiments", json=model_spec(1, n_layer=1_000_000))
        assert deep.status_code == 422, deep.text
        assert "the step peaks at" in deep.text
        # The child runs at a lower CPU priority than the API (this process).
        me = psutil.Process()
        [child] = [
            p for p in me.children(recursive=True) if "workers.models.predict" in p.cmdline()
        ]
        assert child.nice() == me.nice() + 10
    # A limit no prediction meets: the spec is refused, and refused again from memory.
    settings = make_settings(
        database_url, model_predictor_children=1, model_predict_timeout_s=0.001
    )
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=300) as http:
        for _ in range(2):
            late = http.post("/v1/experiments", json=model_spec(3))
            assert late.status_code == 422, late.text
            assert "passed the limit" in late.text


@pytest.mark.slow
def test_the_predictor_service_answers_an_api_without_torch_children(database_url: str) -> None:
    """`vramlab predictor` beside an API pointed at it (as in the deployments)."""
    pytest.importorskip("transformers")
    port = free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "predictor", "--port", str(port)],
        env={**os.environ, "VRAMLAB_MODEL_PREDICTOR_CHILDREN": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the predictor service did not start"
            time.sleep(0.2)
        settings = make_settings(database_url, predictor_url=url)
        with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=300) as http:
            answer = http.post("/v1/experiments", json=model_spec(2, n_layer=2))
            assert answer.status_code == 202, answer.text
            prediction = answer.json()["prediction"]
            assert prediction["peak_allocated"] > 0 and prediction["categories"]
            refused = http.post("/v1/experiments", json=model_spec(1, n_head=0))
            assert refused.status_code == 422, refused.text
            # A plan's edges come from the service too: its logs, then each card's edge.
            tiny = {"model": "tiny-gpt2", "batch_size": 4, "seq_len": 32}
            plan = {
                "spec": {"op": "model", "params": tiny},
                "capacity_bytes": 90 * 2**20,
                "suggest": False,
            }
            r = http.post("/v1/plans", json=plan)
            assert r.status_code == 200, r.text
            [planned] = r.json()["answers"]
            assert planned["edge"] == "traced" and planned["predicted_max_fitting"] > 4
            assert r.json()["predictions"] == 2  # the edge was synthesized, not walked
    finally:
        service.terminate()
        service.wait(30)


def _lanes_ready(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("vramlab_predictor_lanes_ready "):
            return float(line.split()[1])
    raise AssertionError("no vramlab_predictor_lanes_ready gauge")


@pytest.mark.slow
def test_the_predictor_starts_with_the_api_when_asked(database_url: str) -> None:
    """`VRAMLAB_MODEL_PREDICTOR_START` (on under `vramlab up`): the children import torch
    and transformers before the first model question, not during it; off, none starts
    until a model spec arrives."""
    pytest.importorskip("transformers")
    settings = make_settings(database_url, model_predictor_children=1)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=300) as http:
        time.sleep(1)
        assert _lanes_ready(http) == 0
    settings = make_settings(database_url, model_predictor_children=1, model_predictor_start=True)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=300) as http:
        deadline = time.monotonic() + 240
        while _lanes_ready(http) < 1:
            assert time.monotonic() < deadline, "the predictor's child never started"
            time.sleep(0.5)
        answer = http.post("/v1/experiments", json=model_spec(2, n_layer=2))
        assert answer.status_code == 202, answer.text
        assert answer.json()["prediction"]["peak_allocated"] > 0
