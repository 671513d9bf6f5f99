"""The worker distribution alone (worker/pyproject.toml, ``vramlab-worker``): its wheel and
the client's in a fresh venv, with PyTorch and no web stack; its ``vramlab worker``
claims an experiment from a live API, runs it on the CPU and reports it. Then the
server's wheel joins the same venv (all three in one environment), and the worker leaves
it (the client and the server together): each time, one ``vramlab`` with the commands
of what is installed.

The tests share one venv, in order: the last one adds the server and removes the worker.
"""

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, free_port, make_settings
from tests.distributions import (
    WEB_STACK,
    listed_commands,
    new_venv,
    pip,
    run_in,
    user_env,
)
from tests.helpers import ADD, submit

pytestmark = pytest.mark.slow

CLIENT_COMMANDS = {"submit", "show", "ls", "sweep", "fit", "plan", "record"}
SERVER_COMMANDS = {"serve", "up", "migrate", "token", "predictor"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> Path:
    """The worker's wheel and the client's (its one vramlab dependency) into a new venv,
    with PyTorch's CPU build; their other dependencies from the index."""
    venv = new_venv(tmp_path_factory.mktemp("worker-alone"))
    pip(
        venv,
        "install",
        "-q",
        "torch==2.13.0",
        *(str(wheels[d]) for d in ("vramlab-client", "vramlab-worker")),
    )
    return venv


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[LiveServer]:
    """The API of this checkout, on SQLite, with no worker of its own."""
    database = tmp_path_factory.mktemp("worker-alone-api") / "vramlab.db"
    shutil.copy(sqlite_template, database)
    with LiveServer(make_settings(f"sqlite:///{database}", claim_wait_seconds=0.5)) as live:
        yield live


def test_the_worker_installs_without_the_web_stack(venv: Path, tmp_path: Path) -> None:
    probe = textwrap.dedent(
        f"""
        import importlib.metadata, importlib.util
        import workers.cli, workers.loop, workers.runner, workers.client, vramlab.cli
        found = [m for m in {(*WEB_STACK, "app", "migrations")!r}
                 if importlib.util.find_spec(m) is not None]
        print(found, importlib.metadata.version("vramlab-worker"))
        """
    )
    done = run_in(venv, user_env(venv), "python", "-c", probe, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "0.1.0"]
    helped = run_in(venv, user_env(venv), "vramlab", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    listed = listed_commands(helped.stdout)
    assert "worker" in listed and listed >= CLIENT_COMMANDS
    assert not SERVER_COMMANDS & listed


def test_vramlab_worker_runs_an_experiment_from_a_live_api(
    venv: Path, api: LiveServer, tmp_path: Path
) -> None:
    with httpx.Client(base_url=api.url, timeout=30) as http:
        exp = submit(http, ADD)
        done = run_in(
            venv,
            user_env(venv, api.url),
            "vramlab",
            "worker",
            "--device",
            "cpu",
            "--name",
            "alone",
            "--max-experiments",
            "1",
            cwd=tmp_path,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ran = http.get(f"/v1/experiments/{exp['id']}").json()
        assert ran["status"] == "succeeded", ran
        assert ran["result"]["memory"]["delta_allocated"] > 0
        # One loop, or the host's default of several (each its own name: alone/0, ...).
        names = {w["name"].partition("/")[0] for w in http.get("/v1/workers").json()}
        assert names == {"alone"}
    # The client's commands of the same vramlab, against the same API.
    shown = run_in(venv, user_env(venv, api.url), "vramlab", "show", exp["id"], "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "succeeded"


def test_the_server_joins_the_worker_and_the_client_then_the_worker_leaves(
    venv: Path, wheels: dict[str, Path], tmp_path: Path
) -> None:
    """Any two, or all three, in one environment: no wheel overwrites another's files,
    and ``vramlab`` lists the commands of each installed."""
    pip(venv, "install", "-q", str(wheels["vramlab"]))
    pip(venv, "check")
    env = {**user_env(venv), "VRAMLAB_DATABASE_URL": f"sqlite:///{tmp_path / 'both.db'}"}
    helped = run_in(venv, env, "vramlab", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert CLIENT_COMMANDS | SERVER_COMMANDS | {"worker"} <= listed_commands(helped.stdout)
    imported = run_in(venv, env, "python", "-c", "import app.main, workers.cli, vramlab.cli")
    assert imported.returncode == 0, imported.stderr

    pip(venv, "uninstall", "-y", "-q", "vramlab-worker")
    helped = run_in(venv, env, "vramlab", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    listed = listed_commands(helped.stdout)
    assert listed >= CLIENT_COMMANDS | SERVER_COMMANDS and "worker" not in listed
    migrated = run_in(venv, env, "vramlab", "migrate", cwd=tmp_path, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    up = run_in(venv, env, "vramlab", "up", "--port", str(free_port()), cwd=tmp_path)
    assert up.returncode == 2
    assert "install the worker's distribution" in up.stderr, up.stderr
