"""The client distribution alone (client/pyproject.toml, ``vramlab-client``): installed
into a fresh venv it brings httpx and nothing of the server, and its ``vramlab`` records
a program and waits for an experiment against a live service (``vramlab up``: the API
and a CPU worker, started from this checkout the way the README does)."""

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.distributions import listed_commands, new_venv, pip, run_in, user_env
from tests.e2e.procs import env_for, kill_group, start, stop, wait_ready
from tests.snapshots.test_record import FAKE_PROGRAM

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "sqlalchemy", "pydantic", "alembic", "app", "workers", "migrations")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> Path:
    """The client's wheel alone into a new venv (its one dependency from the index), then
    torch, as a training environment has it."""
    venv = new_venv(tmp_path_factory.mktemp("client-alone"))
    pip(venv, "install", "-q", str(wheels["vramlab-client"]))
    return venv


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vramlab up --device cpu`` from this checkout: the API and one CPU worker."""
    folder = tmp_path_factory.mktemp("client-service")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up = start(
        ["up", "--port", str(port), "--device", "cpu"],
        env_for(f"sqlite:///{folder / 'up.db'}"),
        folder / "up.log",
    )
    try:
        wait_ready(url, up)
        yield url
    finally:
        stop(up)
        kill_group(up)


def test_the_client_installs_without_the_server(venv: Path, tmp_path: Path) -> None:
    probe = textwrap.dedent(
        f"""
        import importlib, importlib.util, pkgutil, sys
        import vramlab
        found = [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is not None]
        assert not found, f"importable: {{found}}"
        # Every module of the client imports without them, the contract, the run spec
        # and the catalog's shared part among them (the boot module runs inside a
        # recorded program).
        skip = ("vramlab.recorder_boot.sitecustomize",)
        for info in pkgutil.walk_packages(vramlab.__path__, "vramlab."):
            if info.name not in skip:
                importlib.import_module(info.name)
        from vramlab import ApiError, Client, Recording
        from vramlab.recorder import BOOT
        assert (BOOT / "sitecustomize.py").is_file(), BOOT
        from vramlab.catalog.model_zoo import model_types
        assert model_types()["causal-lm"], "model_types.json ships with the client"
        print(sorted(m for m in sys.modules if m.split(".")[0] in {SERVER_ONLY!r}))
        """
    )
    done = run_in(venv, user_env(venv), "python", "-c", probe, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    helped = run_in(venv, user_env(venv), "vramlab", "--help")
    assert helped.returncode == 0, helped.stderr
    listed = listed_commands(helped.stdout)
    assert {"submit", "show", "ls", "sweep", "fit", "record"} <= listed
    # The worker's and the server's commands come with their distributions.
    assert not {"serve", "up", "worker", "migrate", "token", "predictor"} & listed


@pytest.fixture(scope="module")
def with_torch(venv: Path) -> Path:
    pip(venv, "install", "-q", "torch==2.13.0")
    return venv


def test_submit_wait_and_the_python_api(with_torch: Path, service: str, tmp_path: Path) -> None:
    env = user_env(with_torch, service)
    submit = ("submit", "--op", "add", "--shape", "64x64", "--device", "cpu")
    done = run_in(with_torch, env, "vramlab", *submit, "--wait", "--give-up", "120", "--json")
    assert done.returncode == 0, done.stderr
    exp = json.loads(done.stdout)
    assert exp["status"] == "succeeded", exp
    assert exp["result"]["memory"]["delta_allocated"] > 0

    shown = run_in(with_torch, env, "vramlab", "show", exp["id"][:8], timeout=60)
    assert shown.returncode == 0 and "delta_allocated" in shown.stdout, shown.stderr
    listed = run_in(with_torch, env, "vramlab", "ls", "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert exp["id"] in {e["id"] for e in json.loads(listed.stdout)["items"]}

    program = textwrap.dedent(
        """
        from vramlab import ApiError, Client
        with Client() as api:
            exp = api.submit({"op": "add", "shape": [32, 32], "device": "cpu"}, wait=True)
            assert exp["status"] == "succeeded", exp
            assert api.show(exp["id"][:8])["id"] == exp["id"]
            try:
                api.submit({"op": "add", "shape": [-1]})
            except ApiError as exc:
                print(exc.status_code, exc.type)
        """
    )
    api = run_in(with_torch, env, "python", "-c", program, cwd=tmp_path, timeout=300)
    assert api.returncode == 0, api.stderr
    assert api.stdout.split() == ["422", "validation_error"]


def test_record_a_program(with_torch: Path, service: str, tmp_path: Path) -> None:
    env = user_env(with_torch, service)
    # A program that uses torch: recorded on a GPU; on a CPU the boot says why not.
    real = tmp_path / "real.py"
    real.write_text(
        "import torch\nx = torch.ones(1024, device=DEVICE) * 2\n".replace(
            "DEVICE", "'cuda' if torch.cuda.is_available() else 'cpu'"
        )
    )
    done = run_in(
        with_torch, env, "vramlab", "record", "--", "python", str(real), cwd=tmp_path, timeout=300
    )
    has_cuda = run_in(
        with_torch, env, "python", "-c", "import torch; print(torch.cuda.is_available())"
    ).stdout.strip()
    if has_cuda == "True":
        assert done.returncode == 0, done.stderr
        assert f"{service}/ui/snapshots/" in done.stdout
    else:
        assert "no CUDA device; nothing recorded" in done.stderr
        assert done.returncode == 0  # the program's status, though it left no snapshot

    # Where there is no GPU: a program that leaves what PyTorch's dump would.
    fake = tmp_path / "train.py"
    fake.write_text(FAKE_PROGRAM.format(root=str(REPO)))
    done = run_in(
        with_torch,
        env,
        "vramlab",
        "record",
        "--name",
        "alone",
        "--",
        "python",
        str(fake),
        "0",
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip().splitlines()[-1]
    assert url.startswith(f"{service}/ui/snapshots/")
    snap = httpx.get(f"{service}/v1/snapshots/{url.rsplit('/', 1)[1]}", timeout=30).json()
    assert snap["name"] == "alone" and snap["gzipped"]

    # The same through the Python API.
    program = textwrap.dedent(
        f"""
        from vramlab import Client
        with Client() as api:
            run = api.record(["python", {str(fake)!r}, "4"], name="from python", tags=["x"])
        print(run.code, run.snapshot["id"])
        """
    )
    done = run_in(with_torch, env, "python", "-c", program, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    code, snap_id = done.stdout.split()
    assert code == "4"  # the program's status
    snap = httpx.get(f"{service}/v1/snapshots/{snap_id}", timeout=30).json()
    assert snap["name"] == "from python" and sorted(snap["tags"]) == ["failed", "x"]
