"""The client's modules import only the standard library, httpx and the client itself
(the contract and the run spec included: plain dataclasses; never the server's
packages): what keeps ``pip install ./client`` to httpx alone. The slow test installs it
for real."""

import ast
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client" / "vramlab"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_client_imports_only_the_standard_library_httpx_and_itself() -> None:
    modules = list(CLIENT.rglob("*.py"))
    assert len(modules) > 10
    for path in modules:
        for name in _imports(path):
            top = name.split(".")[0]
            allowed = top in sys.stdlib_module_names or top == "httpx"
            # torch: only inside the boot module, in the recorded program's own environment.
            allowed |= top == "torch" and path.parent.name == "recorder_boot"
            allowed |= top == "vramlab"
            assert allowed, f"{path.relative_to(CLIENT.parent)} imports {name}"
