"""The ``asyncflow`` console script as pip installs it: its ``sys.path`` starts at the
script's directory, not the working directory (unlike ``python -m asyncflow``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import asyncflow as af

# What pip writes for a console script entry point (``asyncflow.cli:main``).
_CONSOLE_SCRIPT = """\
import re
import sys
from asyncflow.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""

_MODULE = """\
def double(v):
    return v * 2


def boom(v):
    raise ValueError("boom")
"""


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """A user's directory with ``mypkg.py`` and a graph file naming its functions, and
    the console script in a ``bin`` directory elsewhere."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "mypkg.py").write_text(_MODULE, encoding="utf-8")
    sys.path.insert(0, str(project))
    try:
        import mypkg  # type: ignore[import-not-found]

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, shape=(), name="x")
            af.py_func(mypkg.double, [x], af.float32, name="y")
            af.py_func(mypkg.boom, [x], af.float32, name="z")
        (project / "g.json").write_text(json.dumps(g.as_graph_def()), encoding="utf-8")
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("mypkg", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "asyncflow"
    script.write_text(_CONSOLE_SCRIPT, encoding="utf-8")
    return project, script


def _asyncflow(script: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_allowed_module_in_the_working_directory_is_found(tmp_path: Path) -> None:
    project, script = _project(tmp_path)
    proc = _asyncflow(
        script, project, "run", "g.json", "--allow-module", "mypkg", "--feed", "x=2", "--fetch", "y"
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "y:0 = 4.0\n"


def test_a_module_not_found_gets_a_hint(tmp_path: Path) -> None:
    _project_dir, script = _project(tmp_path)
    proc = _asyncflow(
        script,
        tmp_path,
        "run",
        "project/g.json",
        "--allow-module",
        "mypkg",
        "--feed",
        "x=2",
        "--fetch",
        "y",
    )
    assert proc.returncode == 2
    assert "No module named 'mypkg'" in proc.stderr
    assert f"working directory {str(tmp_path)!r}: run from the directory that holds" in proc.stderr


def test_errors_of_a_loaded_graph_name_the_graph_file(tmp_path: Path) -> None:
    project, script = _project(tmp_path)
    proc = _asyncflow(
        script, project, "run", "g.json", "--allow-module", "mypkg", "--feed", "x=2", "--fetch", "z"
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        "asyncflow: error: InvalidArgumentError in node 'z': ValueError: "
        "boom [[node z (op PyFunc, defined at g.json)]]\n"
    )
