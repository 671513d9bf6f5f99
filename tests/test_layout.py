"""The house's shape, read from the source: the import graph has no circle beyond the ORM
tables, no module imports one of a layer above its own, the worker stands apart from
the server, and the client imports nothing of either."""

import ast
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ForwardRef, get_args, get_type_hints

import pytest

from tests.distributions import (
    COMMANDS_GROUP,
    DISTRIBUTIONS,
    declared_packages,
    pyproject,
    shared_packages,
    wheel_entry_points,
    wheel_files,
    wheel_packages,
)
from vramlab import runspec

ROOT = Path(__file__).resolve().parents[1]
# Where each top-level package's source lives.
SOURCES = {"app": ROOT / "app", "workers": ROOT / "workers", "vramlab": ROOT / "client" / "vramlab"}
# The ORM tables refer to each other (relationships): the one circle allowed.
TABLES = "app.tables"
# The layers, bottom up; a module may import its own layer and those below.
CONTRACT, CORE, TABLES_LAYER, CATALOG, DOMAIN, HTTP_SHELL, ENDPOINTS = range(7)


def _modules() -> dict[str, Path]:
    found = {}
    for top, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((top, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Each module of ours that ``path`` imports, at its top or inside a function."""

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                target = ours(f"{node.module}.{alias.name}")
                if target:
                    yield target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = ours(alias.name)
                if target:
                    yield target


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        graph[name] |= {t for t in _imports(path, modules) if t != name}
    return graph


def _layer(module: str) -> int:
    top, _, rest = module.partition(".")
    if top == "vramlab":
        return CONTRACT
    if top == "workers":
        return DOMAIN
    head = rest.partition(".")[0]
    if module.endswith(".endpoints") or module in ("app.main", "app.cli", "app.api.docs"):
        return ENDPOINTS
    if module == "app.api.health" or module.endswith("_endpoints"):
        return ENDPOINTS
    return {"core": CORE, "tables": TABLES_LAYER, "catalog": CATALOG, "api": HTTP_SHELL}.get(
        head, DOMAIN
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circle_beyond_the_orm_tables() -> None:
    circles = [c for c in _cycles(_graph()) if not all(m.startswith(TABLES) for m in c)]
    assert circles == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    graph = _graph()
    upward = [(a, b) for a, targets in graph.items() for b in targets if _layer(b) > _layer(a)]
    assert upward == []


def test_the_worker_stands_apart_from_the_server() -> None:
    """workers/ imports nothing of app/: what it needs of the catalog (dtypes, devices,
    the model zoo) is the client package's (vramlab.catalog), so a worker installs
    without the server."""
    allowed = ("workers", "vramlab")
    graph = _graph()
    reaching = {
        (a, b)
        for a, targets in graph.items()
        if a.startswith("workers")
        for b in targets
        if not b.startswith(allowed)
    }
    assert reaching == set()


def test_the_client_imports_neither_server_nor_worker() -> None:
    graph = _graph()
    reaching = {
        (a, b)
        for a, targets in graph.items()
        if a.startswith("vramlab")
        for b in targets
        if not b.startswith("vramlab")
    }
    assert reaching == set()


def test_the_layout_check_sees_a_circle_and_an_upward_import() -> None:
    """The checks above can fail: a made-up graph with both defects is caught."""
    made_up = {
        "app.fits.service": {"app.fits.endpoints"},
        "app.fits.endpoints": {"app.fits.service"},
    }
    assert _cycles(made_up) == [["app.fits.endpoints", "app.fits.service"]]
    assert _layer("app.fits.endpoints") > _layer("app.fits.service") > _layer("app.core.db")


# What names a run spec (or its typed parts) where workers/ holds it. The ops of the
# registry (workers/ops/) read their own op's params, which the catalog declares per op,
# and a scenario reads its steps: those are the op's data, not the run spec's fields.
SPEC_NAMES = {"spec", "run_spec", "run", "model_params"}
OP_PARAM_MODULES = ("workers/ops/", "workers/scenario.py")


def _spec_key_reads(source: str, path: str) -> list[str]:
    """Where ``source`` reads a run spec by string key: ``spec["op"]``, ``spec.get("x")``,
    and outside the op registry ``params["x"]`` / ``params.get("x")`` too."""
    names = set(SPEC_NAMES)
    if not path.startswith(OP_PARAM_MODULES):
        names.add("params")

    def spec_like(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in names
        return isinstance(node, ast.Attribute) and node.attr in names

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and spec_like(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append(f"{path}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and spec_like(node.func.value)
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def test_the_worker_reads_the_run_spec_by_attribute_not_by_key() -> None:
    found = []
    for path in sorted((ROOT / "workers").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += _spec_key_reads(path.read_text(), rel)
    assert found == []


def test_the_spec_key_check_sees_a_key_read() -> None:
    made_up = 'x = spec["op"]\ny = spec.get("trace", "events")\nz = params.get("seq_len")\n'
    assert len(_spec_key_reads(made_up, "workers/runner.py")) == 3
    assert len(_spec_key_reads('n = ctx.params["width"]\n', "workers/ops/modules.py")) == 0


def _loose(tp: object) -> bool:
    """Whether a type is ``Any`` or holds it (``dict[str, Any]``...)."""
    if tp is Any:
        return True
    return any(_loose(arg) for arg in get_args(tp) if not isinstance(arg, str | ForwardRef))


def test_the_run_spec_is_typed_all_the_way_down() -> None:
    """No field of the run spec or its parts is ``Any`` or a ``dict[str, Any]``: op params
    and a scenario's steps are JSON data, a model's config overrides a mapping of JSON."""
    loose = [
        f"{cls.__name__}.{name}"
        for cls in (runspec.RunSpec, runspec.ModelParams, runspec.AllocatorSettings)
        for name, tp in get_type_hints(cls).items()
        if _loose(tp)
    ]
    assert loose == []
    assert _loose(dict[str, Any]) and not _loose(runspec.OpParams)


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which of app's packages import which, leaving out those built to read every domain:
    the HTTP shell (app.api, app.main, app.cli) and the pages (app.ui)."""
    apart = ("app.api", "app.main", "app.cli", "app.ui")
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        if not a.startswith("app.") or a.startswith(apart):
            continue
        pa = ".".join(a.split(".")[:2])
        found = {".".join(b.split(".")[:2]) for b in targets if not b.startswith(apart)}
        packages[pa] |= found - {pa}
    return packages


def test_no_two_packages_import_each_other() -> None:
    """Package by package (app.experiments, app.queue, ...), the import graph has no
    circle either: the queue builds the run spec it hands out from its row, not from the
    experiments' views."""
    assert _cycles(_package_graph(_graph())) == []
    made_up = {
        "app.queue.endpoints": {"app.experiments.views"},
        "app.experiments.service": {"app.queue.service"},
    }
    assert _cycles(_package_graph(made_up)) == [["app.experiments", "app.queue"]]


def _started_modules(source: str) -> set[str]:
    """The modules a source starts as processes (``[..., "-m", "workers.cli", ...]``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.List):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found |= {str(b) for a, b in itertools.pairwise(items) if a == "-m" and b}
    return found


def test_the_worker_modules_the_server_starts_are_the_known_two() -> None:
    """The server never imports workers/, but it starts two of its modules as processes:
    the model predictor beside the API (which needs torch and transformers, and says so
    when they are missing) and the local worker of ``vramlab up``. The import graph cannot
    see a process; this test does, so a third one is a decision, not an accident."""
    started = set()
    for path in (ROOT / "app").rglob("*.py"):
        started |= {m for m in _started_modules(path.read_text()) if m.startswith("workers")}
    assert started == {"workers.models.predict", "workers.cli"}
    assert _started_modules('cmd = [sys.executable, "-m", "workers.x", "--a"]\n') == {"workers.x"}


# -- distributions: one owner for every package and for the script ----------------------


def test_no_package_is_declared_by_two_distributions() -> None:
    """Each pyproject.toml's package search picks packages no other one picks: the client
    vramlab/, the worker workers/, the server app/ and migrations/. Installed together,
    no wheel overwrites another's files."""
    declared = {dist: declared_packages(folder) for dist, folder in DISTRIBUTIONS.items()}
    assert shared_packages(declared) == {}
    tops = {dist: {n.split(".")[0] for n in names} for dist, names in declared.items()}
    assert tops == {
        "vramlab-client": {"vramlab"},
        "vramlab-worker": {"workers"},
        "vramlab": {"app", "migrations"},
    }
    # Every package of this checkout is someone's (a new one is a decision).
    for top in ("app", "workers", "migrations"):
        subpackages = {p.parent for p in (ROOT / top).rglob("__init__.py")}
        owned = {ROOT.joinpath(*n.split(".")) for names in declared.values() for n in names}
        assert subpackages <= owned, sorted(map(str, subpackages - owned))


def test_the_client_owns_the_script_and_the_others_add_commands() -> None:
    scripts = {
        dist: pyproject(folder)["project"].get("scripts", {})
        for dist, folder in DISTRIBUTIONS.items()
    }
    assert scripts == {
        "vramlab-client": {"vramlab": "vramlab.cli:main"},
        "vramlab-worker": {},
        "vramlab": {},
    }
    commands = {
        dist: pyproject(folder)["project"].get("entry-points", {}).get(COMMANDS_GROUP)
        for dist, folder in DISTRIBUTIONS.items()
    }
    assert commands == {
        "vramlab-client": None,
        "vramlab-worker": {"worker": "workers.cli:register"},
        "vramlab": {"server": "app.cli:register"},
    }


def test_the_worker_and_the_server_need_the_client_and_the_worker_no_web_stack() -> None:
    def needs(folder: str) -> set[str]:
        found = pyproject(folder)["project"]["dependencies"]
        return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in found}

    client, worker, server = needs("client"), needs("worker"), needs(".")
    assert client == {"httpx"}
    assert "vramlab-client" in worker and "vramlab-client" in server
    assert {"torch", "numpy", "psutil"} <= worker
    assert not worker & {"fastapi", "sqlalchemy", "alembic", "matplotlib", "uvicorn", "vramlab"}
    assert "torch" not in server  # the API never imports torch


def test_the_package_check_sees_a_package_in_two_distributions() -> None:
    """Before the split, the server shipped the client's vramlab/ as well."""
    before = {
        "vramlab-client": {"vramlab", "vramlab.commands"},
        "vramlab": {"app", "workers", "migrations", "vramlab", "vramlab.catalog"},
    }
    assert shared_packages(before) == {"vramlab": ["vramlab", "vramlab-client"]}


@pytest.mark.slow
def test_no_package_is_in_two_built_wheels(wheels: dict[str, Path]) -> None:
    """The wheels as built: each top-level package in one of them, with its data files,
    and the ``vramlab`` script in the client's alone."""
    packages = {dist: wheel_packages(wheel) for dist, wheel in wheels.items()}
    assert shared_packages(packages) == {}
    assert packages == {
        "vramlab-client": {"vramlab"},
        "vramlab-worker": {"workers"},
        "vramlab": {"app", "migrations"},
    }
    files = {dist: set(wheel_files(wheel)) for dist, wheel in wheels.items()}
    assert {
        "vramlab/catalog/model_types.json",
        "vramlab/recorder_boot/sitecustomize.py",
        "vramlab/py.typed",
    } <= files["vramlab-client"]
    assert {"app/gpus/cards.json", "app/ui/templates/base.html"} <= files["vramlab"]
    assert any(f.startswith("migrations/versions/0001_") for f in files["vramlab"])
    assert "workers/models/predict.py" in files["vramlab-worker"]
    scripts = {
        dist: wheel_entry_points(wheel).get("console_scripts", {}) for dist, wheel in wheels.items()
    }
    assert scripts == {
        "vramlab-client": {"vramlab": "vramlab.cli:main"},
        "vramlab-worker": {},
        "vramlab": {},
    }
    commands = {dist: wheel_entry_points(w).get(COMMANDS_GROUP) for dist, w in wheels.items()}
    assert commands["vramlab-worker"] == {"worker": "workers.cli:register"}
    assert commands["vramlab"] == {"server": "app.cli:register"}
