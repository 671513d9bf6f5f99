"""`vramlab worker` on a host that lacks what it needs: a clear message, a non-zero exit,
and no registration (so no experiment is claimed by a worker that would fail it)."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, fresh_database, make_settings
from tests.helpers import cuda_available
from workers.cli import EXIT_REFUSED, EXIT_UNFIT


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """What is checked here happens before registering: one engine is enough."""
    yield from fresh_database("sqlite", request, tmp_path)


@pytest.fixture
def api(sqlite_url: str) -> Iterator[LiveServer]:
    with LiveServer(make_settings(sqlite_url)) as live:
        yield live


def workers_listed(api: LiveServer) -> list[object]:
    listed: list[object] = httpx.get(f"{api.url}/v1/workers").json()
    return listed


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
    api: LiveServer, module: str, words: str
) -> None:
    done = worker(api.url, "--device", "cpu", hide=module)
    assert done.returncode == EXIT_UNFIT, done.stderr
    assert f"missing {words}" in done.stderr and "pip install vramlab-worker" in done.stderr
    assert workers_listed(api) == []


def test_a_cuda_worker_without_a_gpu_exits_before_registering(api: LiveServer) -> None:
    if cuda_available():
        pytest.skip("this host has a GPU")
    done = worker(api.url, "--device", "cuda")
    assert done.returncode == EXIT_UNFIT, done.stderr
    assert "no usable CUDA device" in done.stderr
    assert workers_listed(api) == []


def test_a_worker_the_api_refuses_says_so_and_exits(sqlite_url: str) -> None:
    with LiveServer(make_settings(sqlite_url, worker_token="s3cret")) as live:
        done = worker(live.url, "--device", "cpu", "--token", "wrong")
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert "refused this worker: 401" in done.stderr and "Traceback" not in done.stderr
