"""The package layout says what runs when: the op registry is a leaf, the framework
and compiler import at module level only (a function-local import hides a circle),
the call kernel is registered like every other kernel, and the compiler holds no
run-time code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncflow
import asyncflow as af
from asyncflow.framework import registry

PACKAGE = Path(asyncflow.__file__).parent

#: What the registry may import of asyncflow when it runs (type-only imports aside).
_REGISTRY_DEPENDS_ON = {"asyncflow.errors", "asyncflow.dtypes"}


def _asyncflow_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every asyncflow module imported in ``tree``
    (``from asyncflow import errors`` imports ``asyncflow.errors``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncflow":
            found.extend((node.lineno, f"asyncflow.{a.name}") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncflow."):
            found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.Import):
            found.extend(
                (node.lineno, a.name) for a in node.names if a.name.startswith("asyncflow")
            )
    return found


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """The asyncflow imports of a module outside its ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[int, str]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "TYPE_CHECKING":
            continue
        found.extend(_asyncflow_imports(stmt))
    return found


def _function_local_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.extend(_asyncflow_imports(node))
    return sorted(set(found))


def test_the_registry_imports_only_errors_and_dtypes() -> None:
    # Anywhere in the module, functions included (a type-only import aside): a
    # function-local import of the graph was a circle registry -> graph -> registry.
    tree = ast.parse((PACKAGE / "framework" / "registry.py").read_text())
    imported = {name for _, name in _runtime_imports(tree)}
    assert imported <= _REGISTRY_DEPENDS_ON, sorted(imported)


def test_the_registry_loads_alone_in_a_fresh_process() -> None:
    # The packages' __init__ modules are skipped (asyncflow's imports everything):
    # what gets imported is what the registry itself needs, defining an op type and
    # a kernel included.
    code = """
import sys, types
root = sys.argv[1]
for name, path in (("asyncflow", root), ("asyncflow.framework", root + "/framework")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from asyncflow.framework import registry
registry.define_op("LayoutProbe", lambda inputs, attrs: [])
registry.register_kernel("LayoutProbe", lambda: None)
registry.get_kernel("LayoutProbe").instantiate(types.SimpleNamespace(node_attrs=dict))
print(" ".join(sorted(m for m in sys.modules if m.startswith("asyncflow"))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert "asyncflow.framework.graph" not in out
    assert set(out) <= {"asyncflow", "asyncflow.framework", "asyncflow.framework.registry"} | (
        _REGISTRY_DEPENDS_ON
    ), out


def test_framework_and_compiler_import_at_module_level_only() -> None:
    local = {
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for folder in ("framework", "compiler")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for line, name in _function_local_imports(ast.parse(path.read_text()))
    }
    assert not local, sorted(local)


async def test_the_call_kernel_comes_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncflow.runtime import function_call

    assert registry.get_kernel(registry.CALL).factory is function_call.make_call_kernel
    made: list[str] = []

    def factory(*args: Any) -> tuple[Any, int]:
        made.append(args[0].name)  # the call node
        return function_call.make_call_kernel(*args)

    # A call node the optimizer did not inline runs the kernel registered under CALL.
    monkeypatch.setitem(
        registry._KERNELS, (registry.CALL, "CPU"), registry.KernelDef(registry.CALL, "CPU", factory)
    )
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def double(x: af.Tensor) -> af.Tensor:
            return x * 2.0

        p = af.placeholder(af.float32, name="p")
        y = double(p, name="call")
    no_inlining = af.GraphOptions(optimizer_options=af.OptimizerOptions(do_function_inlining=False))
    async with af.Session(g, config=af.SessionConfig(graph_options=no_inlining)) as sess:
        assert await sess.run(y, {p: 3.0}) == 6.0
    assert made == ["call"]


async def test_a_call_without_a_registered_kernel_names_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(registry._KERNELS, (registry.CALL, "CPU"))
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def double(x: af.Tensor) -> af.Tensor:
            return x * 2.0

        p = af.placeholder(af.float32, name="p")
        y = double(p, name="call")
    no_inlining = af.GraphOptions(optimizer_options=af.OptimizerOptions(do_function_inlining=False))
    async with af.Session(g, config=af.SessionConfig(graph_options=no_inlining)) as sess:
        with pytest.raises(af.errors.NotFoundError, match="function call 'call'"):
            await sess.run(y, {p: 3.0})
        assert await sess.run(p, {p: 3.0}) == 3.0  # still usable


def _module_imports(module: str) -> set[str]:
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    return {name for _, name in _asyncflow_imports(ast.parse(path.read_text()))}


def test_every_compiler_module_is_part_of_compiling() -> None:
    # What the compile pipeline reaches, at module level, from its entry point: a
    # compiler module outside it would be code only the runtime runs.
    reached: set[str] = set()
    todo = ["asyncflow.compiler.pipeline"]
    while todo:
        module = todo.pop()
        if module in reached or not module.startswith("asyncflow.compiler."):
            continue
        reached.add(module)
        todo.extend(_module_imports(module))
    compiler = {f"asyncflow.compiler.{p.stem}" for p in (PACKAGE / "compiler").glob("*.py")}
    assert compiler - {"asyncflow.compiler.__init__"} <= reached, sorted(compiler - reached)
    runtime_uses = {
        name
        for path in (PACKAGE / "compiler").glob("*.py")
        for _, name in _asyncflow_imports(ast.parse(path.read_text()))
        if name.startswith("asyncflow.runtime")
    }
    assert not runtime_uses  # the compiler never imports the runtime
