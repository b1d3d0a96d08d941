"""The package's dependency direction, and that every module imports.

tunnels and models depend on torch (and the leaf modules config and metrics) only;
neither imports the other, so a tunnel can never depend on a model's internals or the
reverse. The report depends on saved results, not on models or training. The check reads import statements, so it also sees imports inside functions.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import windtunnel

PACKAGE_DIR = Path(windtunnel.__file__).parent
LEAVES = {"windtunnel.config", "windtunnel.metrics"}
ALLOWED = {  # subpackage -> windtunnel modules it may import (besides itself)
    "windtunnel.tunnels": LEAVES,
    "windtunnel.models": LEAVES,
    "windtunnel.config": set(),
    "windtunnel.metrics": set(),
    "windtunnel.files": set(),
    "windtunnel.history": set(),
    "windtunnel.memory": {"windtunnel.config"},
    # The report reads saved results only: never a model, a tunnel or the trainer (jobs and
    # reproduce appear in its type hints: the runs table takes the reproduction's plan).
    "windtunnel.report": {"windtunnel.files", "windtunnel.history", "windtunnel.jobs", "windtunnel.reproduce"},
}


def _module_names() -> list[str]:
    return [m.name for m in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="windtunnel.")]


def _imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.startswith("windtunnel")}


def test_every_module_imports():
    names = _module_names()
    assert "windtunnel.tunnels.hmm" in names and "windtunnel.cli" in names
    for name in names:
        if name != "windtunnel.__main__":  # running it is the CLI itself
            importlib.import_module(name)


def test_no_forbidden_import_edges():
    for module in _module_names():
        owner = next((p for p in ALLOWED if module == p or module.startswith(p + ".")), None)
        if owner is None:
            continue
        for imported in _imports(module):
            inside = imported == owner or imported.startswith(owner + ".")
            assert inside or imported in ALLOWED[owner], f"{module} imports {imported}"
