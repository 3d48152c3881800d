"""Every script in examples/ runs quickly and prints what it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_example(name: str, *args: str) -> str:
    # PYTHONPATH: the scripts import this checkout's asyncflow, not an installed one.
    env = {**os.environ, "PYTHONWARNINGS": "error", "PYTHONPATH": str(EXAMPLES.parent)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def test_every_example_is_covered() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == {
        "quickstart_async.py",
        "quickstart_sync.py",
        "async_io_service.py",
        "save_and_load.py",
        "typed_graph.py",
        "distributed_local.py",
        "distributed_ps_recovery.py",
    }


def test_quickstart_async() -> None:
    lines = _run_example("quickstart_async.py").splitlines()
    assert lines == [
        "y = [[3.0, 4.0], [0.0, 0.0]]",
        "concurrent = [[[0.0, 0.0]], [[1.0, 1.0]], [[3.0, 3.0]]]",
    ]


def test_typed_graph() -> None:
    # CI also runs `mypy --strict examples/`, which checks its assert_type lines.
    assert _run_example("typed_graph.py").splitlines() == ["total = 9.0"]


def test_quickstart_sync() -> None:
    lines = _run_example("quickstart_sync.py").splitlines()
    assert lines == ["total = 20.0", "mean = 2.5", "by name = 20.0"]


def test_async_io_service() -> None:
    lines = _run_example("async_io_service.py").splitlines()
    # score = profile . [0.5, 0.25, 1] + mean(arange(4) * uid)
    expected = [
        f"user {u}: score {0.5 * (u % 3) + 0.25 * (u % 5) + 1.0 + 1.5 * u:.2f}" for u in range(1, 9)
    ]
    assert lines[:8] == expected
    assert lines[8].startswith("handled 8 requests in ")
    assert lines[8].endswith("(the same I/O done one call at a time: 800 ms)")


@pytest.mark.parametrize("use_cli", [False, True])
def test_save_and_load(tmp_path: Path, use_cli: bool) -> None:
    path = tmp_path / "graph.json"
    lines = _run_example("save_and_load.py", str(path)).splitlines()
    assert lines[0] == f"saved 4 ops to {path}"
    assert lines[1] == "y = [0. 2.]"
    assert json.loads(path.read_text())["node"]
    if use_cli:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "asyncflow",
                "run",
                str(path),
                "--feed",
                "x=[[1,2],[3,4]]",
                "--fetch",
                "y",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "y:0 = [0. 2.]"


def test_distributed_local() -> None:
    pytest.importorskip("distributed")
    lines = _run_example("distributed_local.py").splitlines()
    # w = 0.5 * (0 + 1 + 2) per element; total = 2 * sum(w)
    assert lines == [
        "devices: 3",
        "w = [1.5, 1.5, 1.5]",
        "total = 9.0",
        "kernel ran in another process: True",
    ]


def test_the_examples_index_lists_every_example() -> None:
    """examples/README.md is the index: every script and example directory is in it."""
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    names = [p.name for p in EXAMPLES.glob("*.py")]
    names += [
        f"{p.name}/" for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    ]
    missing = [name for name in names if f"[`{name}`]({name})" not in index]
    assert not missing, f"examples/README.md does not list {missing}"


def test_distributed_ps_recovery() -> None:
    # Real dask scheduler and worker processes; the script kills ps-0 and restarts it.
    pytest.importorskip("distributed")
    lines = _run_example("distributed_ps_recovery.py").splitlines()
    assert lines == [
        "step 25: killed ps-0, starting it again under the same name",
        "recovered: ps-0 restored from the checkpoint of step 20",
        "loss after 60 steps = 0.0001",
        "recoveries = 1",
    ]
