"""The benchmark modules form a tree: every import of another benchmarks module is at
the top of its module (none hidden in a function, where a circle would go unseen),
the top-level imports have no cycle, and each module imports on its own in a fresh
interpreter."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "benchmarks"
MODULES = sorted(
    f"benchmarks.{p.stem}"
    for p in BENCHMARKS.glob("*.py")
    if p.stem not in ("__init__", "__main__")
)


def _benchmarks_imports(node: ast.AST) -> list[str]:
    """The benchmarks modules one import statement names (``from benchmarks import x``
    names ``benchmarks.x`` when ``x`` is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("benchmarks.")]
    if isinstance(node, ast.ImportFrom) and node.module is not None:
        if node.module == "benchmarks":
            return [f"benchmarks.{a.name}" for a in node.names if f"benchmarks.{a.name}" in MODULES]
        if node.module.startswith("benchmarks."):
            return [node.module]
    return []


def _tree(module: str) -> ast.Module:
    path = BENCHMARKS / f"{module.removeprefix('benchmarks.')}.py"
    return ast.parse(path.read_text(), filename=str(path))


def _local_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every benchmarks import inside a function or class."""
    found = []
    for scope in ast.walk(tree):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for node in ast.walk(scope):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found += [(node.lineno, m) for m in _benchmarks_imports(node)]
    return found


def test_no_benchmarks_module_is_imported_inside_a_function() -> None:
    hidden = {m: _local_imports(_tree(m)) for m in MODULES}
    assert {m: found for m, found in hidden.items() if found} == {}


def test_the_top_level_imports_have_no_cycle() -> None:
    graph = {
        m: {dep for node in _tree(m).body for dep in _benchmarks_imports(node) if dep != m}
        for m in MODULES
    }
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the cycle


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
