"""Every ```python block of README.md and docs/*.md runs as written, and prints what it says.

Blocks run the way a reader runs them: saved to a file and run as a script
(``python file.py``), never through ``python -c``.  The blocks of one document form
one program, in order, as a reader would paste them into one file.  Three kinds of
block stand on their own instead:

* a block whose first line names a file, ``# name.py``, is a complete program saved
  under that name and run by itself (``python name.py``; also ``python -m name`` when
  the document says so) — what Dask's spawned worker processes need, for example,
  is only visible this way (they import the main file again);
* a block whose first line is ``# test_*.py`` is a pytest file, run under pytest
  with the plugin (``test_pytest_examples_pass``).

A ``print(...)  # text`` line promises ``text`` in the output: the promises must
appear in the output in order (whitespace-insensitive).
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
_FILE_NAME = re.compile(r"# (\w+)\.py")


def blocks(path: Path, language: str = "python") -> list[str]:
    """The fenced code blocks of ``path`` in ``language``, in order."""
    return [
        body for lang, body in _FENCE.findall(path.read_text(encoding="utf-8")) if lang == language
    ]


def _file_name(body: str) -> str | None:
    """``name`` when the block's first line is ``# name.py``."""
    match = _FILE_NAME.fullmatch(body.splitlines()[0]) if body.strip() else None
    return match.group(1) if match else None


def programs(path: Path) -> list[tuple[str, str, bool]]:
    """``(file name, code, also as a module)`` of each program of a document: each
    standalone block (``# name.py``), then the remaining blocks as one program."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[str, str, bool]] = []
    rest: list[str] = []
    for body in blocks(path):
        name = _file_name(body)
        if name is None:
            rest.append(body)
        elif not name.startswith("test_"):  # (pytest files run under pytest)
            found.append((name, body, f"python -m {name}" in text))
    if rest:
        stem = re.sub(r"\W", "_", path.stem.lower())
        found.append((f"{stem}_blocks", "\n\n".join(rest), False))
    return found


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_docs_exist() -> None:
    names = {p.name for p in DOCS}
    core = {
        "README.md",
        "concepts.md",
        "coming-from-tf1.md",
        "async-services.md",
        "testing.md",
        "performance.md",
    }
    assert core | {"index.md", "architecture.md", "logging.md"} <= names
    for path in DOCS:
        if path.name in core:
            assert blocks(path), f"{path.name} has no python blocks"


_RUNS = [(path, name, code, module) for path in DOCS for name, code, module in programs(path)]


def _check_promises(where: str, code: str, stdout: str) -> None:
    out = _squash(stdout)
    promises = [m.group(1) for line in code.splitlines() if (m := _PROMISE.match(line))]
    position = 0
    for promise in promises:
        found = out.find(_squash(promise), position)
        assert found >= 0, f"{where}: output lacks {promise!r} (after what came before)"
        position = found + len(_squash(promise))


@pytest.mark.parametrize(
    ("path", "name", "code", "module"), _RUNS, ids=[f"{p.name}:{n}.py" for p, n, _, _ in _RUNS]
)
def test_python_blocks_run_as_scripts_and_print_what_they_promise(
    path: Path, name: str, code: str, module: bool, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error", "PYTHONPATH": str(ROOT)}
    # The programs run as a reader runs them from a checkout (files they read, like the
    # TF fixtures, are under tests/), writing only into a scratch directory.
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
    commands = [[sys.executable, f"{name}.py"]]
    if module:
        commands.append([sys.executable, "-m", name])
    for command in commands:
        proc = subprocess.run(
            command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180, check=False
        )
        where = f"{path.name}: {' '.join(command[1:])}"
        assert proc.returncode == 0, f"{where}\n{proc.stderr}"
        assert proc.stderr == "", where
        _check_promises(where, code, proc.stdout)
        if path.name == "README.md" and name == "readme_blocks":
            # The picture README shows is what its code prints.
            (picture,) = blocks(path, "mermaid")
            assert picture in proc.stdout


def test_readme_promises_enough() -> None:
    """README's programs promise what they print (at least seven lines of output)."""
    code = "\n".join(code for _, code, _ in programs(ROOT / "README.md"))
    assert len([line for line in code.splitlines() if _PROMISE.match(line)]) >= 7


def _pytest_blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for body in blocks(path):
            first = body.splitlines()[0]
            if re.fullmatch(r"# (test_\w+\.py)", first):
                found.append((f"{path.name}:{first[2:]}", body))
    return found


@pytest.mark.parametrize("mode", ["auto", "strict"])
@pytest.mark.parametrize(("where", "body"), _pytest_blocks(), ids=[w for w, _ in _pytest_blocks()])
def test_pytest_examples_pass(pytester: pytest.Pytester, mode: str, where: str, body: str) -> None:
    pytester.makeini(f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
    """)
    name = body.splitlines()[0][2:-3]
    pytester.makepyfile(**{name: body})
    # The plugin loads through its entry point when asyncflow is installed from here.
    plugin = (
        []
        if entry_points(group="pytest11", name="asyncflow")
        else ["-p", "asyncflow.pytest_plugin"]
    )
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
        files += [
            p
            for p in (ROOT / root).rglob("*")
            if p.suffix in {".py", ".md", ".toml", ".json"} and p.is_file()
        ]
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _CITATION.search(line) and p.name != "test_docs.py"
    ]
    assert not found, "\n".join(found)
    assert (ROOT / "docs" / "architecture.md").is_file()


def test_testing_md_config_runs_a_user_project_under_warnings_as_errors(tmp_path: Path) -> None:
    """docs/testing.md's pytest configuration, in a user's project outside this
    repository, with its example test file, under ``pytest -W error``."""
    testing = ROOT / "docs" / "testing.md"
    (config,) = blocks(testing, "toml")
    (tmp_path / "pyproject.toml").write_text(config, encoding="utf-8")
    (name, body), *_ = [
        (b.splitlines()[0][2:], b) for b in blocks(testing) if b.startswith("# test_")
    ]
    (tmp_path / name).write_text(body, encoding="utf-8")
    plugin = (
        []
        if entry_points(group="pytest11", name="asyncflow")
        else ["-p", "asyncflow.pytest_plugin"]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def pytest_in(project: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-W",
                "error",
                "-q",
                "-p",
                "no:cacheprovider",
                *plugin,
            ],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    proc = pytest_in(tmp_path)
    tests = len(re.findall(r"^(?:async )?def test_", body, re.M))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{tests} passed" in proc.stdout
    assert "warning" not in proc.stdout.lower()
    # Without the loop-scope line, the same project does not even start.
    (tmp_path / "pyproject.toml").write_text(
        config.replace('asyncio_default_fixture_loop_scope = "function"\n', ""), encoding="utf-8"
    )
    proc = pytest_in(tmp_path)
    assert proc.returncode != 0
    assert "asyncio_default_fixture_loop_scope" in proc.stdout + proc.stderr


def test_programs_split_standalone_files_from_pasted_blocks(tmp_path: Path) -> None:
    """How the runner above reads a document: ``# name.py`` blocks stand alone (and run
    as a module too when the text says ``python -m name``), pytest files are left to
    pytest, and the rest is one program in order."""
    doc = tmp_path / "Guide.md"
    doc.write_text(
        "Run it with `python -m hello`.\n\n"
        "```python\n# hello.py\nprint('hi')\n```\n\n"
        "```python\nx = 1\n```\n\n"
        "```python\n# test_it.py\ndef test_x(): pass\n```\n\n"
        "```python\n# other.py\nprint('other')\n```\n\n"
        "```python\nprint(x)  # 1\n```\n",
        encoding="utf-8",
    )
    assert programs(doc) == [
        ("hello", "# hello.py\nprint('hi')\n", True),
        ("other", "# other.py\nprint('other')\n", False),
        ("guide_blocks", "x = 1\n\n\nprint(x)  # 1\n", False),
    ]
