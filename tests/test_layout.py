"""The house's shape, read from the source: the import graph has no circle beyond the ORM
models, no module imports one of a layer above its own, the worker stands apart from
the server, and the client imports nothing of either."""

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each top-level package's source lives.
SOURCES = {"app": ROOT / "app", "workers": ROOT / "workers", "vramlab": ROOT / "client" / "vramlab"}
# The ORM models refer to each other (relationships): the one circle allowed.
MODELS = "app.models"
# The layers, bottom up; a module may import its own layer and those below.
CONTRACT, CORE, MODELS_LAYER, CATALOG, DOMAIN, HTTP_SHELL, ENDPOINTS = range(7)


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
    return {"core": CORE, "models": MODELS_LAYER, "catalog": CATALOG, "api": HTTP_SHELL}.get(
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


def test_no_circle_beyond_the_orm_models() -> None:
    circles = [c for c in _cycles(_graph()) if not all(m.startswith(MODELS) for m in c)]
    assert circles == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    graph = _graph()
    upward = [(a, b) for a, targets in graph.items() for b in targets if _layer(b) > _layer(a)]
    assert upward == []


def test_the_worker_stands_apart_from_the_server() -> None:
    allowed = ("workers", "vramlab", "app.catalog")
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
