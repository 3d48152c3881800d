"""``asyncflow run`` never imports a module a graph file names unless allowed; --version; graph; --trace."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncflow as af
from asyncflow.cli import callable_references, main
from asyncflow.framework.graph_def import allowed_reference_modules

EVIL_MODULE = "af_test_evil_module"


@pytest.fixture
def evil_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A graph file whose py_func names a module that, once imported, writes a marker file."""
    marker = tmp_path / "pwned"
    (tmp_path / f"{EVIL_MODULE}.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('imported')\n"
        "def run(x):\n"
        "    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, EVIL_MODULE, raising=False)
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        af.py_func(math.fabs, [x], af.float64, name="innocent")
        af.identity(x, name="y")
    text = json.dumps(g.as_graph_def()).replace('"math:fabs"', f'"{EVIL_MODULE}:run"')
    path = tmp_path / "evil.json"
    path.write_text(text)
    return path, marker


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_run_refuses_unlisted_module(
    capsys: pytest.CaptureFixture[str], evil_graph: tuple[Path, Path]
) -> None:
    path, marker = evil_graph
    status, out, err = _run(capsys, "run", path, "--feed", "x=1.5", "--fetch", "y")
    assert status == 2
    assert out == ""
    line = err.strip()
    assert "\n" not in line
    assert f"'{EVIL_MODULE}:run' (in 'innocent')" in line
    assert f"--allow-module {EVIL_MODULE}" in line
    assert "--trust" in line
    assert not marker.exists()
    assert EVIL_MODULE not in sys.modules


def test_os_system_reference_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = af.Graph()
    with g.as_default():
        cmd = af.constant("echo hacked", name="cmd")
        af.py_func(math.fabs, [cmd], af.int32, name="shell")
    path = tmp_path / "shell.json"
    path.write_text(json.dumps(g.as_graph_def()).replace('"math:fabs"', '"os:system"'))
    status, _, err = _run(capsys, "run", path, "--fetch", "shell")
    assert status == 2
    assert "'os:system' (in 'shell')" in err
    # Allowing another module does not allow this one.
    status, _, err = _run(capsys, "run", path, "--fetch", "shell", "--allow-module", "math")
    assert status == 2
    assert "refusing to import 'os'" in err


def test_allow_module_and_trust_load_the_function(
    capsys: pytest.CaptureFixture[str], evil_graph: tuple[Path, Path]
) -> None:
    path, marker = evil_graph
    status, out, err = _run(
        capsys,
        "run",
        path,
        "--feed",
        "x=-1.5",
        "--fetch",
        "innocent",
        "--allow-module",
        EVIL_MODULE,
    )
    assert (status, err) == (0, "")
    assert out == "innocent:0 = -1.5\n"
    assert marker.read_text() == "imported"
    del sys.modules[EVIL_MODULE]
    marker.unlink()
    status, out, err = _run(capsys, "run", path, "--feed", "x=2", "--fetch", "innocent", "--trust")
    assert (status, err, out) == (0, "", "innocent:0 = 2.0\n")
    assert marker.exists()


def test_allow_module_covers_submodules_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        af.py_func(math.fabs, [x], af.float64, name="f")
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g.as_graph_def()))
    status, _, err = _run(
        capsys, "run", path, "--feed", "x=-4", "--fetch", "f", "--allow-module", "mat"
    )  # a prefix of the name, not a package
    assert status == 2, err
    status, out, err = _run(
        capsys, "run", path, "--feed", "x=-4", "--fetch", "f", "--allow-module", "math"
    )
    assert (status, out) == (0, "f:0 = 4.0\n"), err


def test_importer_checks_the_policy_itself() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        af.py_func(math.fabs, [x], af.float64, name="f")
    graph_def = g.as_graph_def()
    token = allowed_reference_modules.set(frozenset({"json"}))
    try:
        with af.Graph().as_default(), pytest.raises(ValueError, match=r"'math' is not allowed"):
            af.import_graph_def(graph_def)
    finally:
        allowed_reference_modules.reset(token)


def test_references_are_found_anywhere_in_the_file() -> None:
    graph_def = {
        "node": [
            {"name": "a", "attr": {"x": {"list": [{"func": "m1:f"}]}}},
            {"name": "b", "attr": {"y": {"func": "m1:f"}}},
        ],
        "library": {"function": [{"node": [{"attr": {"z": {"func": "m2:g"}}}]}]},
    }
    assert callable_references(graph_def) == {"m1:f": ["a", "b"], "m2:g": ["library"]}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--version")
    assert status == 0
    assert out.strip() == f"asyncflow {af.__version__}"


def test_graph_command_draws_without_importing(
    capsys: pytest.CaptureFixture[str], evil_graph: tuple[Path, Path]
) -> None:
    path, marker = evil_graph
    status, out, err = _run(capsys, "graph", path, "--format", "mermaid")
    assert (status, err) == (0, "")
    assert out.startswith("flowchart TD\n")
    assert '["innocent<br/>PyFunc"]' in out
    status, out, err = _run(capsys, "graph", path)
    assert status == 0
    assert out.startswith("digraph asyncflow {")
    assert not marker.exists()


def test_run_trace_writes_chrome_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(2,), name="x")
        af.reduce_sum(x * 2.0, name="y")
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g.as_graph_def()))
    trace = tmp_path / "trace.json"
    status, out, err = _run(
        capsys, "run", path, "--feed", "x=[1,2]", "--fetch", "y", "--trace", trace
    )
    assert (status, err) == (0, "")
    assert out.splitlines() == ["y:0 = 6.0", f"Chrome trace written to {trace}"]
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "X"}
    assert {"mul", "y"} <= names  # the fed placeholder does not run


def test_py_func_from_main_is_an_error_at_as_graph_def(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import asyncflow as af\n"
        "def double(v):\n"
        "    return v * 2\n"
        "g = af.Graph()\n"
        "with g.as_default():\n"
        "    af.py_func(double, [af.constant(1.0)], af.float32, name='twice')\n"
        "try:\n"
        "    g.as_graph_def()\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert "'__main__:double' is defined in __main__" in proc.stdout
    assert "'twice'" in proc.stdout
