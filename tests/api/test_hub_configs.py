"""A hub id's config.json, fetched by the API with ``VRAMLAB_HUB_CONFIGS=on`` from a fake
hub on 127.0.0.1: the spec carries it as ``config_json`` (the worker gets data), it is
fetched once, and every way a fetch can fail is a clear 422 or 503, never a 500; with the
setting off, a hub id is refused with the word to pass the file. Plans, submits and the
CLI's ``vramlab plan``."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.core.config import Settings
from tests.conftest import LiveServer, make_settings
from tests.helpers import CPU_CAPS, claim, register

# A config.json as transformers writes it for a small GPT-2.
GPT2_JSON: dict[str, Any] = {
    "_name_or_path": "acme/tiny-gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_embd": 64,
    "n_head": 2,
    "n_layer": 2,
    "n_positions": 128,
    "vocab_size": 1000,
    "torch_dtype": "float32",
    "transformers_version": "4.45.0",
}
SLOW_S = 3.0  # the slow answer's delay, well past the tests' time-out
TIMEOUT_S = 0.3


class FakeHub:
    """A hub that serves ``/{owner}/{name}/resolve/{revision}/config.json``, counting what
    is asked of it by host name and path."""

    def __init__(self) -> None:
        self.hits: Counter[tuple[str, str]] = Counter()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                host = self.headers.get("Host", "").split(":")[0]
                hub.hits[(host, self.path)] += 1
                hub.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        parts = h.path.strip("/").split("/")
        if len(parts) != 5 or parts[2:4] != ["resolve", parts[3]] or parts[4] != "config.json":
            return self.send(h, 404, b"Entry not found")
        name, revision = parts[1], parts[3]
        if name == "tiny-gpt2" and revision in ("main", "v1"):
            return self.send(h, 200, json.dumps(GPT2_JSON, indent=2).encode())
        if name == "remote-code":
            document = {**GPT2_JSON, "auto_map": {"AutoModelForCausalLM": "modeling.Mine"}}
            return self.send(h, 200, json.dumps(document).encode())
        if name == "huge":
            return self.send(h, 200, b'{"model_type": "gpt2", "pad": "' + b"x" * 2**21 + b'"}')
        if name == "not-json":
            return self.send(h, 200, b"<html>a login page</html>", "text/html")
        if name == "gated":
            return self.send(h, 401, b"Access to model acme/gated is restricted.")
        if name == "down":
            return self.send(h, 500, b"Internal Error")
        if name == "slow":
            time.sleep(SLOW_S)
            return self.send(h, 200, json.dumps(GPT2_JSON).encode())
        if name == "renamed":  # the hub's own redirect for a renamed repository
            return self.redirect(h, f"/acme/tiny-gpt2/resolve/{revision}/config.json")
        if name == "elsewhere":  # another host (the same server under another name)
            return self.redirect(
                h, f"http://localhost:{self.port}/acme/tiny-gpt2/resolve/main/config.json"
            )
        return self.send(h, 404, b"Repository not found")

    @staticmethod
    def send(
        h: BaseHTTPRequestHandler, code: int, body: bytes, kind: str = "application/json"
    ) -> None:
        h.send_response(code)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        with contextlib.suppress(OSError):  # the API stopped reading (a body over its cap)
            h.wfile.write(body)

    @staticmethod
    def redirect(h: BaseHTTPRequestHandler, location: str) -> None:
        h.send_response(307)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def count(self, name: str, host: str = "127.0.0.1") -> int:
        return sum(n for (h, path), n in self.hits.items() if h == host and f"/{name}/" in path)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as fake:
        yield fake


def hub_settings(database_url: str, hub: FakeHub, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "hub_configs": True,
        "hub_url": hub.url,
        "hub_timeout_s": TIMEOUT_S,
        "model_predictions": False,
    }
    return make_settings(database_url, **{**values, **overrides})


def post(client: httpx.Client, model: str, **params: Any) -> httpx.Response:
    spec = {"op": "model", "shape": [], "device": "cpu", "params": {"model": model, **params}}
    return client.post("/v1/experiments", json=spec)


def test_with_hub_configs_off_a_hub_id_is_refused_saying_to_pass_the_file(
    database_url: str, hub: FakeHub
) -> None:
    settings = make_settings(database_url, hub_url=hub.url, model_predictions=False)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        r = post(client, "acme/tiny-gpt2", batch_size=2, seq_len=16)
        assert r.status_code == 422, r.text
        [detail] = r.json()["error"]["details"]
        assert detail["field"] == "params.model"
        for words in ("VRAMLAB_HUB_CONFIGS", "config_json", "vramlab plan --config"):
            assert words in detail["message"]
        plan = client.post("/v1/plans", json={"spec": {"params": {"model": "acme/tiny-gpt2"}}})
        assert plan.status_code == 422, plan.text
        assert plan.json()["error"]["details"][0]["field"] == "spec.params.model"
        assert "VRAMLAB_HUB_CONFIGS" in plan.text
        # A preset's hub name is the preset, fetched from nowhere.
        assert post(client, "openai-community/gpt2", batch_size=1, seq_len=8).status_code == 202
    assert not hub.hits


def test_a_hub_id_is_fetched_once_and_the_worker_gets_its_config_as_data(
    database_url: str, hub: FakeHub
) -> None:
    with (
        LiveServer(hub_settings(database_url, hub)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        first = post(client, "acme/tiny-gpt2", batch_size=2, seq_len=16)
        assert first.status_code == 202, first.text
        params = first.json()["spec"]["params"]
        assert params["model"] == "acme/tiny-gpt2"  # the label people gave
        assert params["config_json"] == GPT2_JSON
        again = post(client, "acme/tiny-gpt2", batch_size=4, seq_len=16)
        assert again.status_code == 202, again.text
        assert hub.count("tiny-gpt2") == 1  # cached
        pinned = post(client, "acme/tiny-gpt2@v1", batch_size=2, seq_len=16)
        assert pinned.status_code == 202, pinned.text
        assert hub.hits[("127.0.0.1", "/acme/tiny-gpt2/resolve/v1/config.json")] == 1
        renamed = post(client, "acme/renamed", batch_size=2, seq_len=16)
        assert renamed.status_code == 202, renamed.text
        assert renamed.json()["spec"]["params"]["config_json"] == GPT2_JSON
        worker = register(client, CPU_CAPS)
        claimed = claim(client, worker)
        assert claimed is not None and claimed["id"] == first.json()["id"]
        assert claimed["spec"]["params"]["config_json"] == GPT2_JSON
        assert claimed["spec"]["params"]["model"] == "acme/tiny-gpt2"


def test_every_failed_fetch_is_a_clear_422_or_503(database_url: str, hub: FakeHub) -> None:
    cases = [
        ("acme/missing", 422, "params.model", "no config.json"),
        ("acme/tiny-gpt2@no-such-branch", 422, "params.model", "revision no-such-branch"),
        ("acme/gated", 422, "params.model", "gated or private"),
        ("acme/huge", 422, "params.model", "over 1048576 bytes"),
        ("acme/not-json", 422, "params.model", "not JSON"),
        ("acme/remote-code", 422, "params.config_json.auto_map", "code to load"),
        ("acme/elsewhere", 422, "params.model", "another host"),
        ("acme/down", 503, None, "HTTP 500"),
        ("acme/slow", 503, None, "did not answer"),
        ("acme/../tiny-gpt2", 422, "params.model", "not a hub id"),
        ("acme/tiny gpt2", 422, "params.model", "not a hub id"),
        ("acme/x@refs/pr/1", 422, "params.model", "not a hub id"),
    ]
    with (
        LiveServer(hub_settings(database_url, hub)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        for model, status, field, words in cases:
            r = post(client, model, batch_size=2, seq_len=16)
            assert r.status_code == status, (model, r.text)
            error = r.json()["error"]
            assert words in error["message"], (model, error)
            if status == 503:
                assert error["type"] == "hub_unavailable"
                assert r.headers["Retry-After"]
                assert "config_json" in error["message"]
            else:
                assert error["details"][0]["field"] == field, (model, error)
        assert hub.count("tiny-gpt2", host="localhost") == 0  # the redirect was not followed
        assert hub.count("..") == 0
        # Nothing failed is kept: the hub is asked again.
        assert post(client, "acme/missing", batch_size=2, seq_len=16).status_code == 422
        assert hub.count("missing") == 2


@pytest.mark.one_engine
def test_a_plan_of_a_hub_id_and_the_cli(
    database_url: str, hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    from vramlab.cli import main

    settings = hub_settings(database_url, hub, model_predictions=True)
    with (
        LiveServer(settings) as live,
        httpx.Client(base_url=live.url, timeout=300) as client,
    ):
        spec = {"params": {"model": "acme/tiny-gpt2", "batch_size": 2, "seq_len": 32}}
        body = {"spec": spec, "capacity_bytes": 16 * 2**20, "suggest": False, "verify": False}
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 200, r.text
        plan = r.json()
        assert plan["model"] == "acme/tiny-gpt2"
        assert plan["answers"][0]["prediction"]["peak_allocated"] > 0
        two = {**body, "variants": [{}, {"model": "gpt2"}]}
        r = client.post("/v1/plans", json=two)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["details"][0]["field"] == "variants[1].model"

        args = ["--api", live.url]
        code = main(
            ["plan", "acme/tiny-gpt2", "--batch", "2", "--seq", "32", "--capacity", "16MiB",
             "--quick", *args]
        )  # fmt: skip
        assert code == 0
        assert "acme/tiny-gpt2" in capsys.readouterr().out
        assert main(["plan", "acme/slow", "--capacity", "16MiB", "--quick", *args]) == 1
        err = capsys.readouterr().err
        assert "did not answer" in err and "--config" in err
        assert hub.count("slow") == 1  # a hub that does not answer is not asked again at once
    assert hub.count("tiny-gpt2") == 1


def test_fits_and_sweeps_fetch_the_hub_id_their_spec_names(database_url: str, hub: FakeHub) -> None:
    """A fit search and a sweep over a hub id search and sweep that model: their stored
    spec (what each trial and point runs) carries the fetched config; a variant or grid
    key that names another model is refused, as a plan's is."""
    spec = {
        "op": "model",
        "shape": [],
        "device": "cpu",
        "params": {"model": "acme/tiny-gpt2", "batch_size": 2, "seq_len": 16},
    }
    with (
        LiveServer(hub_settings(database_url, hub)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        fit = client.post("/v1/fits", json={"spec": spec, "capacity_bytes": 64 * 2**20})
        assert fit.status_code == 202, fit.text
        assert fit.json()["spec"]["params"]["config_json"] == GPT2_JSON
        other = {"spec": spec, "capacity_bytes": 64 * 2**20, "variants": [{"model": "gpt2"}]}
        refused = client.post("/v1/fits", json=other)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["details"][0]["field"] == "variants[0].model"

        sweep = client.post("/v1/sweeps", json={"spec": spec, "grid": {"batch_size": [1, 2]}})
        assert sweep.status_code == 202, sweep.text
        assert sweep.json()["spec"]["params"]["config_json"] == GPT2_JSON
        worker = register(client, CPU_CAPS)
        claimed = claim(client, worker)
        assert claimed is not None
        assert claimed["spec"]["params"]["config_json"] == GPT2_JSON
        grid = {"params.model": ["acme/tiny-gpt2", "gpt2"]}
        refused = client.post("/v1/sweeps", json={"spec": spec, "grid": grid})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["details"][0]["field"] == "grid.params.model"
    assert hub.count("tiny-gpt2") == 1


def test_the_hub_is_vramlabs_setting_else_hf_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().hub_url == "https://huggingface.co"
    assert Settings().hub_configs is False
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/hf/")
    assert Settings().hub_url == "https://mirror.example/hf"
    monkeypatch.setenv("VRAMLAB_HUB_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("VRAMLAB_HUB_CONFIGS", "on")
    assert Settings().hub_url == "http://127.0.0.1:9000"
    assert Settings().hub_configs is True
    for bad in ("file:///etc", "https://hub.example/?x=1", "https://user:pw@hub.example"):
        monkeypatch.setenv("VRAMLAB_HUB_URL", bad)
        with pytest.raises(ValidationError):
            Settings()
