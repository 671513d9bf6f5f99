"""`vramlab worker` on a host that lacks what it needs: a clear message, a non-zero exit,
and no registration (so no experiment is claimed by a worker that would fail it)."""

import subprocess
import sys

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from workers.cli import EXIT_REFUSED, EXIT_UNFIT


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def worker(api: str, *args: str, hide: str | None = None) -> subprocess.CompletedProcess[str]:
    """`vramlab worker` as the README runs it; ``hide`` makes a module impossible to import."""
    prelude = f"import sys; sys.modules[{hide!r}] = None; " if hide else "import sys; "
    code = prelude + "from app.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "worker", "--api", api, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("module, words", [("torch", "PyTorch"), ("psutil", "psutil")])
def test_a_worker_without_its_packages_exits_before_registering(
    server: LiveServer, client: httpx.Client, module: str, words: str
) -> None:
    done = worker(server.url, "--device", "cpu", hide=module)
    assert done.returncode == EXIT_UNFIT, done.stderr
    assert f"missing {words}" in done.stderr and "vramlab[worker]" in done.stderr
    assert client.get("/v1/workers").json() == []


def test_a_cuda_worker_without_a_gpu_exits_before_registering(
    server: LiveServer, client: httpx.Client
) -> None:
    if _cuda_available():
        pytest.skip("this host has a GPU")
    done = worker(server.url, "--device", "cuda")
    assert done.returncode == EXIT_UNFIT, done.stderr
    assert "no usable CUDA device" in done.stderr
    assert client.get("/v1/workers").json() == []


def test_a_worker_the_api_refuses_says_so_and_exits(database_url: str) -> None:
    with LiveServer(make_settings(database_url, worker_token="s3cret")) as live:
        done = worker(live.url, "--device", "cpu", "--token", "wrong")
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert "refused this worker: 401" in done.stderr and "Traceback" not in done.stderr
