"""Rules for the package's architecture: every import of every kind obeys `themis_mpi/layers.py`.

The walk counts top-level, function-local and ``TYPE_CHECKING`` imports alike. ``from P import
name`` counts as an import of P (a package's ``__init__``) and, when ``P.name`` is a module, of
that module too.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT

from themis_mpi.layers import DYNAMIC_IMPORTERS, LAYERS, architecture_markdown, may_import, module_path

PACKAGE = ROOT / "themis_mpi"


def package_modules() -> dict[str, Path]:
    """Every module of the package by its name relative to the package ("" for its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = package_modules()


def _resolve(importer: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute dotted name a ``from ... import`` names ("themis_mpi..." or another package)."""
    if not node.level:
        return node.module or ""
    here = ["themis_mpi", *importer.split(".")] if importer else ["themis_mpi"]
    if path.name != "__init__.py":
        here = here[:-1]
    base = here[: len(here) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _relative(name: str) -> str | None:
    """A dotted name as a module of the package (relative name), or None outside it."""
    if name != "themis_mpi" and not name.startswith("themis_mpi."):
        return None
    rel = name[len("themis_mpi.") :] if name != "themis_mpi" else ""
    while rel not in MODULES:  # a name inside a module (themis_mpi.x.Class) counts as the module
        rel = rel.rpartition(".")[0]
    return rel


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported package module, line) for every import statement in `module`, of every kind."""
    path = MODULES[module]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in _ABSOLUTE]
        else:
            continue
        for target in targets:
            rel = _relative(target)
            if rel is not None and rel != module:
                out.append((rel, node.lineno))
    return out


_ABSOLUTE = {"themis_mpi" + (f".{m}" if m else "") for m in MODULES}


def dynamic_imports_of(module: str) -> list[int]:
    """Lines where `module` imports importlib or calls __import__ (imports chosen at run time)."""
    lines = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "importlib" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "importlib":
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            lines.append(node.lineno)
    return lines


def test_every_module_is_in_exactly_one_layer():
    """The contract names every module of the package once, and names no module that does not exist."""
    listed = [m for layer in LAYERS for m in layer.modules]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_imports_point_only_down(module):
    """Every import of a package module (any kind, anywhere in the file) is one the layers allow."""
    wrong = [f"line {line}: {imported or '__init__'}" for imported, line in imports_of(module)
             if not may_import(module, imported)]  # fmt: skip
    assert wrong == [], f"themis_mpi.{module} imports upward or sideways: {wrong}"


def test_the_import_graph_has_no_cycle():
    """Following every import of every module never leads back to where it started."""
    graph = {m: sorted({i for i, _ in imports_of(m)}) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_the_walk_sees_an_upward_import():
    """A function-local import of the CLI from the engine is caught (the walk looks inside functions)."""
    source = "def f():\n    from .cli import main\n"
    node = ast.parse(source).body[0].body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _relative(_resolve("engine", MODULES["engine"], node)) == "cli"
    assert not may_import("engine", "cli") and may_import("cli", "engine")
    assert not may_import("cli.train", "cli.sweep"), "the CLI's commands are apart"


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_only_the_cli_and_the_registry_choose_imports_at_run_time(module):
    """Only the CLI (one module per command) and the policy registry use importlib or __import__."""
    if module in DYNAMIC_IMPORTERS:
        assert dynamic_imports_of(module), f"{module} is allowed dynamic imports but has none: drop it"
    else:
        assert dynamic_imports_of(module) == []


def test_the_architecture_page_is_drawn_from_the_layers():
    """docs/architecture.md is what `python scripts/architecture.py` draws from themis_mpi/layers.py."""
    assert (ROOT / "docs" / "architecture.md").read_text() == architecture_markdown(PACKAGE) + "\n"


def test_every_module_has_a_docstring_for_the_page():
    """Each module's first docstring line describes it on the architecture page."""
    assert [m for m in MODULES if not ast.get_docstring(ast.parse(module_path(PACKAGE, m).read_text()))] == []


def test_the_architecture_script_writes_the_page(tmp_path):
    """scripts/architecture.py --out writes the same page the test expects."""
    out = tmp_path / "architecture.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "architecture.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == architecture_markdown(PACKAGE) + "\n"
