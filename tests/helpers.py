"""Small helpers the tests share: specs, a fake worker speaking the protocol."""

import importlib.util
from typing import Any

import httpx
import pytest

from vramlab.contract import MEMORY_KEYS

ADD = {"op": "add", "shape": [1000, 1000], "dtype": "float32", "device": "cpu"}
MATMUL = {
    "op": "matmul",
    "shape": [1000, 2000],
    "params": {"other_shape": [2000, 500]},
    "dtype": "float32",
    "device": "cuda",
}
CPU_CAPS: dict[str, Any] = {"device_types": ["cpu"], "gpus": [], "torch": "test"}
CUDA_CAPS: dict[str, Any] = {
    "device_types": ["cpu", "cuda"],
    "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_memory": 80 * 2**30}],
    "torch": "test",
}
MEMORY = dict.fromkeys(MEMORY_KEYS, 0)


def cuda_available() -> bool:
    """Whether this machine has torch and a CUDA GPU it can use (torch imported only here)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def needs_cuda() -> list[pytest.MarkDecorator]:
    """The marks of a test module that means something only on a GPU:
    ``pytestmark = needs_cuda()`` (marked ``cuda``; skipped, saying why, without one)."""
    return [pytest.mark.cuda, pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")]


def submit(
    client: httpx.Client, spec: dict[str, Any] | None = None, **changes: Any
) -> dict[str, Any]:
    body = {**(spec or ADD), **changes}
    response = client.post("/v1/experiments", json=body)
    assert response.status_code == 202, response.text
    data: dict[str, Any] = response.json()
    return data


def register(client: httpx.Client, caps: dict[str, Any] | None = None, name: str = "test") -> str:
    response = client.post(
        "/v1/worker/register", json={"name": name, "capabilities": caps or CPU_CAPS}
    )
    assert response.status_code == 200, response.text
    worker_id: str = response.json()["worker_id"]
    return worker_id


def claim(client: httpx.Client, worker_id: str, wait_s: float = 0) -> dict[str, Any] | None:
    response = client.post("/v1/worker/claim", json={"worker_id": worker_id, "wait_s": wait_s})
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def succeed(client: httpx.Client, claimed: dict[str, Any], **result: Any) -> httpx.Response:
    body = {
        "lease_token": claimed["lease_token"],
        "status": "succeeded",
        "result": {"memory": MEMORY, **result},
    }
    return client.post(f"/v1/worker/experiments/{claimed['id']}/result", json=body)
