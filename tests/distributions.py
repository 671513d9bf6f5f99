"""vramlab's three distributions as the tests see them: what each pyproject.toml declares,
their wheels built from a copy of this checkout, and fresh venvs to install them into.

- ``vramlab-client`` (client/): the ``vramlab`` script and package, httpx alone;
- ``vramlab-worker`` (worker/, its package workers/ at the top): ``vramlab worker``;
- ``vramlab`` (the top): the server, app/ and migrations/, and its commands.
"""

import fnmatch
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each distribution's name and the folder of its pyproject.toml.
DISTRIBUTIONS = {"vramlab-client": "client", "vramlab-worker": "worker", "vramlab": "."}
# What each one's wheel is built from (copied, so that the build leaves nothing here).
SOURCES = ("pyproject.toml", "README.md", "app", "migrations", "client", "worker", "workers")
COMMANDS_GROUP = "vramlab.commands"
# The server's web stack: never in the client's or the worker's environment.
WEB_STACK = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "matplotlib")


def pyproject(folder: str) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())
    return data


def declared_packages(folder: str, root: Path = ROOT) -> set[str]:
    """The packages a pyproject's ``packages.find`` picks (where, include, exclude), read
    from the folders as setuptools would find them."""
    found = pyproject(folder)["tool"]["setuptools"]["packages"]["find"]
    include, exclude = found.get("include", ["*"]), found.get("exclude", [])
    names: set[str] = set()

    def walk(folder: Path, prefix: str) -> None:
        # As setuptools does: a folder is a package with its __init__.py, and the search
        # goes down through packages only.
        for child in sorted(folder.iterdir()):
            if child.is_dir() and "." not in child.name and (child / "__init__.py").is_file():
                name = prefix + child.name
                picked = any(fnmatch.fnmatchcase(name, pattern) for pattern in include)
                if picked and not any(fnmatch.fnmatchcase(name, p) for p in exclude):
                    names.add(name)
                walk(child, name + ".")

    for where in found.get("where", ["."]):
        walk((root / folder / where).resolve(), "")
    return names


def shared_packages(packages: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each top-level package that more than one distribution ships, with those that do."""
    owners: dict[str, list[str]] = {}
    for dist, names in sorted(packages.items()):
        for top in sorted({n.split(".")[0] for n in names}):
            owners.setdefault(top, []).append(dist)
    return {top: dists for top, dists in owners.items() if len(dists) > 1}


PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation")


def build_wheels(out: Path) -> dict[str, Path]:
    """The three wheels, built (``pip wheel --no-deps``) from a copy of this checkout."""
    tree = out / "src"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc")
            shutil.copytree(source, tree / name, ignore=ignore)
        else:
            tree.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    wheels = out / "wheels"
    built: dict[str, Path] = {}
    for dist, folder in DISTRIBUTIONS.items():
        done = subprocess.run(
            [*PIP_WHEEL, "-w", str(wheels), str(tree / folder)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        prefix = dist.replace("-", "_") + "-"
        (built[dist],) = [p for p in wheels.glob("*.whl") if p.name.startswith(prefix)]
    return built


def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def wheel_packages(wheel: Path) -> set[str]:
    """The top-level packages a wheel installs (its folders but the metadata's)."""
    return {
        name.split("/")[0]
        for name in wheel_files(wheel)
        if "/" in name and not name.split("/")[0].endswith((".dist-info", ".data"))
    }


def wheel_entry_points(wheel: Path) -> dict[str, dict[str, str]]:
    """A wheel's entry points by group (``console_scripts``, ``vramlab.commands``)."""
    with zipfile.ZipFile(wheel) as z:
        found = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(found[0]).decode() if found else ""
    groups: dict[str, dict[str, str]] = {}
    group = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            group = line.strip("[]")
            groups[group] = {}
        elif "=" in line:
            key, _, value = line.partition("=")
            groups[group][key.strip()] = value.strip()
    return groups


# -- fresh venvs ------------------------------------------------------------------------


def new_venv(where: Path) -> Path:
    venv = where / "venv"
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make a venv here: {exc}")
    return venv


def venv_bin(venv: Path, name: str) -> str:
    return str(venv / "bin" / name)


def pip(venv: Path, *args: str) -> None:
    done = subprocess.run(
        [venv_bin(venv, "python"), "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def user_env(venv: Path, api: str = "http://127.0.0.1:9") -> dict[str, str]:
    """A user's shell in the venv: nothing of this checkout on the path."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("VRAMLAB_", "PYTHON", "VIRTUAL"))
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VRAMLAB_API_URL"] = api
    return env


def run_in(
    venv: Path,
    env: dict[str, str],
    tool: str,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """The venv's ``tool`` (its python, its vramlab) run with ``args`` as a user would."""
    return subprocess.run(
        [venv_bin(venv, tool), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def listed_commands(help_text: str) -> set[str]:
    """The subcommands ``vramlab --help`` lists."""
    return set(help_text.split("{", 1)[1].split("}", 1)[0].split(","))
