"""The package's dependency direction, and that every module imports.

tunnels and models depend on torch (and the leaf modules config and metrics) only;
neither imports the other, so a tunnel can never depend on a model's internals or the
reverse. The report depends on saved results (read as the leaf package results' types) and draws with the figures package, not on
models or training; figures on saved JSON alone. Training sits below the runs, the runs below the analyses, and none of them
imports the report, the reproduction or the CLI. Every file name of a run directory comes
from the leaf module run_layout. The check reads import statements, so it also sees
imports inside functions.
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
    # every file name of a run directory and a reproduction folder, from one place
    "windtunnel.run_layout": set(),
    "windtunnel.history": {"windtunnel.run_layout"},
    "windtunnel.provenance": {"windtunnel.files", "windtunnel.run_layout"},
    # a run directory's files checked before a command reads them
    "windtunnel.run_files": {"windtunnel.config", "windtunnel.history", "windtunnel.run_layout"},
    "windtunnel.memory": {"windtunnel.config"},
    # The typed analysis results: plain data, read by the analyses that make them and the report.
    "windtunnel.results": set(),
    # Figures are drawn from saved JSON alone, and written as every other file is (atomically).
    "windtunnel.figures": {"windtunnel.files"},
    # The report reads saved results only: never a model, a tunnel, the trainer, or the
    # reproduction that wrote them. It draws the figures that span runs (the phase diagrams)
    # with the figures package's save, so every PNG is written the same way.
    "windtunnel.report": {"windtunnel.files", "windtunnel.figures", "windtunnel.history", "windtunnel.provenance",
                          "windtunnel.results", "windtunnel.run_files", "windtunnel.run_layout"},
}

#: Layers above a package that it must not import (the arrows run one way: the CLI and the
#: reproduction over the runs, the runs over training, the report over saved results).
ABOVE = {"windtunnel.cli", "windtunnel.cli_commands", "windtunnel.command", "windtunnel.reproduce", "windtunnel.jobs",
         "windtunnel.ray_engine", "windtunnel.studies", "windtunnel.export", "windtunnel.lm"}
FORBIDDEN = {  # package -> windtunnel modules (and their submodules) it must not import
    "windtunnel.training": ABOVE | {"windtunnel.runs", "windtunnel.analysis", "windtunnel.report", "windtunnel.figures"},
    "windtunnel.runs": ABOVE | {"windtunnel.analysis", "windtunnel.report", "windtunnel.figures"},
    "windtunnel.analysis": ABOVE | {"windtunnel.report"},
}

#: Import cycles kept on purpose (every other strongly connected set of modules fails the test).
ALLOWED_CYCLES = {
    # the figures package imports its modules to register their figures; each imports figure/save from it
    frozenset({"windtunnel.figures", *(f"windtunnel.figures.{m}" for m in
               ("ablation", "calibration", "dynamics", "generalization", "geometry", "phases"))}),
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
            # ``from windtunnel.models import trace`` imports the module windtunnel.models.trace
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    modules = set(_module_names())
    return {name for name in found if name in modules}


def test_every_module_imports():
    names = _module_names()
    assert "windtunnel.tunnels.hmm" in names and "windtunnel.cli" in names
    for name in names:
        if name != "windtunnel.__main__":  # running it is the CLI itself
            importlib.import_module(name)


def test_no_import_cycles_but_the_named_ones():
    # Every import counts, also those under TYPE_CHECKING and inside functions: a cycle there
    # still ties two modules into one concept. Tarjan's strongly connected components.
    graph = {module: _imports(module) for module in _module_names()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert set(cycles) == ALLOWED_CYCLES, ([sorted(c) for c in set(cycles) - ALLOWED_CYCLES],
                                            "allowed but gone:", [sorted(c) for c in ALLOWED_CYCLES - set(cycles)])


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _ruled_imports(rules: dict[str, set[str]]):
    """(module, the package whose rule applies to it, a module it imports), for every module under a rule."""
    for module in _module_names():
        owner = next((p for p in rules if _within(module, p)), None)
        if owner is not None:
            yield from ((module, owner, imported) for imported in _imports(module))


def test_no_forbidden_import_edges():
    for module, owner, imported in _ruled_imports(ALLOWED):
        assert _within(imported, owner) or any(_within(imported, allowed) for allowed in ALLOWED[owner]), f"{module} imports {imported}"


def test_no_import_runs_back_up_the_layers():
    for module, owner, imported in _ruled_imports(FORBIDDEN):
        assert not any(_within(imported, b) for b in FORBIDDEN[owner]), f"{module} imports {imported}: {owner} sits below it"
