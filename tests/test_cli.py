"""The ``asyncflow`` command: ``run`` and ``demo``, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.cli import main


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 3), name="x")
        w = af.constant(np.array([[1.0], [2.0], [3.0]], np.float32), name="w")
        y = af.matmul(x, w, name="y")
        af.reduce_sum(y, name="total")
        af.constant(np.int32(7), name="seven")
        af.no_op(name="noop")
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(g.as_graph_def()))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def _assert_one_line_error(status: int, err: str, *fragments: str) -> None:
    assert status != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("asyncflow: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_run_prints_fetches(capsys: pytest.CaptureFixture[str], graph_file: Path) -> None:
    status, out, err = _run(
        capsys,
        "run",
        graph_file,
        "--feed",
        "x:0=[[1,2,3],[1,1,1]]",
        "--fetch",
        "total:0",
        "--fetch",
        "y",
    )
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "total:0 = 20.0"
    assert lines[1] == "y:0 = [[14.]"
    assert lines[2].strip() == "[ 6.]]"


def test_run_with_npy_feed_and_target(
    capsys: pytest.CaptureFixture[str], graph_file: Path, tmp_path: Path
) -> None:
    npy = tmp_path / "x.npy"
    np.save(npy, np.ones((2, 3), np.float32))
    status, out, err = _run(
        capsys, "run", graph_file, "--feed", f"x={npy}", "--fetch", "total", "--target", "noop"
    )
    assert status == 0, err
    assert out.strip() == "total:0 = 12.0"


def test_run_without_feeds(capsys: pytest.CaptureFixture[str], graph_file: Path) -> None:
    status, out, _ = _run(capsys, "run", graph_file, "--fetch", "seven")
    assert status == 0
    assert out.strip() == "seven:0 = 7"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["frobnicate"], ["invalid choice"]),
        ([], ["required"]),
        (["run", "{missing}"], ["cannot read graph file", "missing.json"]),
        (["run", "{bad_json}", "--fetch", "y"], ["not valid JSON"]),
        (["run", "{bad_def}", "--fetch", "y"], ["cannot import graph file", "NoSuchOp"]),
        (["run", "{graph}", "--fetch", "y", "--feed", "x:0"], ["bad --feed", "NAME=VALUE"]),
        (["run", "{graph}", "--fetch", "y", "--feed", "x:0=[[1,2"], ["bad --feed", "not JSON"]),
        (["run", "{graph}", "--fetch", "nope:0"], ["bad --fetch", "nope"]),
        (["run", "{graph}", "--fetch", "y", "--feed", "ghost=1"], ["bad --feed", "ghost"]),
        (["run", "{graph}", "--fetch", "y", "--target", "ghost"], ["bad --target", "ghost"]),
        (["run", "{graph}"], ["nothing to run"]),
        (["run", "{graph}", "--fetch", "y"], ["InvalidArgumentError", "You must feed", "'x'"]),
        (["run", "{graph}", "--fetch", "y", "--feed", "x=[1,2]"], ["Cannot feed value of shape"]),
    ],
)
def test_bad_invocations_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
    graph_file: Path,
    tmp_path: Path,
    argv: list[str],
    fragments: list[str],
) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    bad_def = tmp_path / "bad_def.json"
    bad_def.write_text(json.dumps({"node": [{"name": "y", "op": "NoSuchOp"}]}))
    paths = {
        "graph": graph_file,
        "missing": tmp_path / "missing.json",
        "bad_json": bad_json,
        "bad_def": bad_def,
    }
    status, out, err = _run(capsys, *[a.format(**paths) for a in argv])
    _assert_one_line_error(status, err, *fragments)
    assert out == ""


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--help")
    assert status == 0
    assert "demo" in out
    assert "run" in out


def test_demo_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _run(capsys, "demo")
    assert status == 0, err
    assert "probs = " in out
    assert "best = " in out
    table = [line.split() for line in out.splitlines() if line.startswith("fetch_user_")]
    assert len(table) == 4
    assert all(row[1] == "PyFunc" and row[2] == "async" for row in table)
    assert any(line.split()[:3] == ["score_batch", "PyFunc", "thread"] for line in out.splitlines())
    assert "overlapped" in out


def test_python_dash_m_asyncflow_demo() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncflow", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "node" in proc.stdout
    assert "step wall time" in proc.stdout


def test_python_dash_m_asyncflow_error_has_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "asyncflow", "run", "/nonexistent/g.json", "--fetch", "y"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("asyncflow: error: cannot read graph file")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("level", "call_kind", "folded"), [("0", "async", False), ("1", "inline", True)]
)
def test_run_opt_level(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, level: str, call_kind: str, folded: bool
) -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        af.add(af.constant(1.0, name="one"), af.constant(2.0, name="two"), name="k")

        @af.Defun(af.float32, func_name="twice")
        def twice(t: af.Tensor) -> af.Tensor:
            return t * 2.0

        twice(x * g.get_tensor_by_name("k:0"), name="y")
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g.as_graph_def()))
    trace = tmp_path / "trace.json"
    status, out, err = _run(
        capsys, "run", path, "--feed", "x=2", "--fetch", "y", "--opt-level", level, "--trace", trace
    )
    assert status == 0, err
    assert out.splitlines()[0] == "y:0 = 12.0"
    events = json.loads(trace.read_text())["traceEvents"]
    kinds = {e["args"]["name"]: e["args"]["kind"] for e in events if e.get("ph") == "X"}
    assert "y/mul" in kinds  # the body ran under the call's name, inlined or called
    assert kinds["y"] == call_kind  # the call kernel (async) or the inlined call's Identity
    assert ("k" in kinds) is not folded  # a folded k is a Const, computed before the run
