"""Every ```python block of README.md and docs/*.md runs as written, and prints what it says.

The blocks of one file run in order in one fresh interpreter, as a reader would
paste them.  A ``print(...)  # text`` line promises ``text`` in the output: the
promises must appear in the output in order (whitespace-insensitive).  Blocks that
are pytest files (first line ``# test_*.py``) run under pytest with the plugin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s*(.+?)\s*$")


def blocks(path: Path, language: str = "python") -> list[str]:
    """The fenced code blocks of ``path`` in ``language``, in order."""
    return [body for lang, body in _FENCE.findall(path.read_text(encoding="utf-8"))
            if lang == language]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_docs_exist() -> None:
    names = {p.name for p in DOCS}
    assert {"README.md", "concepts.md", "coming-from-tf1.md", "async-services.md",
            "testing.md", "performance.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_python_blocks_run_and_print_what_they_promise(path: Path, tmp_path: Path) -> None:
    code = "\n\n".join(blocks(path))
    assert code, f"{path.name} has no python blocks"
    env = {**os.environ, "PYTHONWARNINGS": "error", "PYTHONPATH": str(ROOT)}
    # The blocks run as a reader runs them from a checkout (files they read, like the
    # TF fixtures, are under tests/), writing only into a scratch directory.
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = _squash(proc.stdout)
    promises = [m.group(1) for line in code.splitlines() if (m := _PROMISE.match(line))]
    position = 0
    for promise in promises:
        found = out.find(_squash(promise), position)
        assert found >= 0, f"{path.name}: output lacks {promise!r} (after what came before)"
        position = found + len(_squash(promise))
    if path.name == "README.md":
        assert len(promises) >= 7
        # The picture README shows is what its code prints.
        (picture,) = blocks(path, "mermaid")
        assert picture in proc.stdout


def _pytest_blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for body in blocks(path):
            first = body.splitlines()[0]
            if re.fullmatch(r"# (test_\w+\.py)", first):
                found.append((f"{path.name}:{first[2:]}", body))
    return found


@pytest.mark.parametrize("mode", ["auto", "strict"])
@pytest.mark.parametrize(("where", "body"), _pytest_blocks(),
                         ids=[w for w, _ in _pytest_blocks()])
def test_pytest_examples_pass(pytester: pytest.Pytester, mode: str, where: str,
                              body: str) -> None:
    pytester.makeini(f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
    """)
    name = body.splitlines()[0][2:-3]
    pytester.makepyfile(**{name: body})
    # The plugin loads through its entry point when asyncflow is installed from here.
    plugin = [] if entry_points(group="pytest11", name="asyncflow") else [
        "-p", "asyncflow.pytest_plugin"]
    result = pytester.runpytest(*plugin, "-p", "no:cacheprovider", "-q")
    tests = len(re.findall(r"^(?:async )?def test_", body, re.M))
    result.assert_outcomes(passed=tests)


_CITATION = re.compile(r"DESIGN\.md|DESIGN §|\b[Ii]ssue #?\d+")


def test_nothing_cites_a_design_file_or_an_issue_number() -> None:
    """The repository stands on its own: design reasons are in docs/architecture.md,
    and neither code, docs nor benchmark output points at a tracker's issue."""
    roots = ["asyncflow", "benchmarks", "docs", "examples", "tests"]
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for root in roots:
        files += [p for p in (ROOT / root).rglob("*")
                  if p.suffix in {".py", ".md", ".toml", ".json"} and p.is_file()]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if _CITATION.search(line) and p.name != "test_docs.py"]
    assert not found, "\n".join(found)
    assert (ROOT / "docs" / "architecture.md").is_file()
