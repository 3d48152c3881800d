"""Smoke test of ``python -m benchmarks``: it runs and reports every workload.

Performance is never asserted here: timings on a shared CI machine say nothing about
a change.  The test checks that the harness runs end to end at quick sizes (in a
subprocess, so the BLAS thread pinning happens before numpy is imported, as it does
for a user) and that the table, the target lines and the JSON cover every row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

ROW_IDS = ("chain", "xdev.k1", "xdev.k100", "wide", "tiny.run", "tiny.run_sync",
           "tiny.run_sync.async", "callable", "callable.nested", "trace", "trace.off", "overlap",
           "parallel", "parallel.2dev", "loop", "loop.cond", "queue", "variable", "cnn",
           "scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss",
           "scale.cond.second_run", "scale.cond.peak_rss", "opt.fold.first_run",
           "opt.fold.steady", "opt.cse", "opt.call.inlined", "opt.call.kernel")
TARGETED = ("chain", "wide", "tiny.run", "tiny.run_sync.async", "overlap", "parallel",
            "scale.build", "scale.first_run", "scale.peak_rss", "scale.cond.second_run",
            "scale.cond.peak_rss", "opt.fold.first_run", "opt.fold.steady", "opt.cse")


def _table_ids(stdout: str) -> list[str]:
    """The first cell of each row of the results table (header to first blank line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("workload "))
    ids = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        ids.append(line.split()[0])
    return ids


def _run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH"))
                                        if p)
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_quick_run_reports_every_workload(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks("--quick", "--no-external", "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    lines = proc.stdout.splitlines()
    assert tuple(_table_ids(proc.stdout)) == ROW_IDS, proc.stdout
    for row_id in TARGETED:
        assert any(f"] {row_id}: asyncflow " in line for line in lines), row_id
    assert "ERROR" not in proc.stdout
    assert "OPENBLAS_NUM_THREADS=1" in proc.stdout

    data = json.loads(out_json.read_text())
    rows = {row["id"]: row for row in data["rows"]}
    assert tuple(rows) == ROW_IDS
    for row_id, row in rows.items():
        assert isinstance(row["ours"], float), row_id
        assert row["status"] in ("met", "NOT met", "inconclusive", "-"), row_id
        assert row["tf_note"] == row["dask_note"] == "skipped"


def test_only_runs_the_named_workload() -> None:
    proc = _run_benchmarks("--quick", "--no-external", "--only", "tiny")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["tiny.run", "tiny.run_sync", "tiny.run_sync.async"]


def test_multi_device_rows_are_selectable_and_untargeted() -> None:
    proc = _run_benchmarks("--quick", "--no-external",
                           "--only", "xdev.k1,xdev.k100", "--only", "parallel.2dev")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["xdev.k1", "xdev.k100", "parallel.2dev"]
    for row_id in ("xdev.k1", "xdev.k100", "parallel.2dev"):
        # No target: not listed under "targets:", and the target/status cells are "-".
        assert not any(f"] {row_id}: asyncflow " in line for line in proc.stdout.splitlines())
        row = next(line for line in proc.stdout.splitlines() if line.startswith(row_id + " "))
        assert row.split()[-2:] == ["-", "-"], row
    assert "us per send/recv edge (median over the" in proc.stdout
    assert ">= 1.6 is what the single-device parallel target asks" in proc.stdout
    assert "cores busy" in proc.stdout


def test_loop_rows_are_selectable_and_untargeted() -> None:
    proc = _run_benchmarks("--quick", "--no-external", "--only", "loop,loop.cond")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["loop", "loop.cond"]
    lines = proc.stdout.splitlines()
    for row_id in ("loop", "loop.cond"):
        assert not any(f"] {row_id}: asyncflow " in line for line in lines)
        row = next(line for line in lines if line.startswith(row_id + " "))
        assert " us/iter " in row, row
        assert row.split()[-2:] == ["-", "-"], row
    assert "parallel_iterations=10" in proc.stdout


def test_queue_and_variable_rows_are_throughputs_and_untargeted(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks("--quick", "--no-external", "--only", "queue,variable",
                           "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["queue", "variable"]
    lines = proc.stdout.splitlines()
    for row_id, unit in (("queue", "el/s"), ("variable", "steps/s")):
        assert not any(f"] {row_id}: asyncflow " in line for line in lines)
        row = next(line for line in lines if line.startswith(row_id + " "))
        assert f" {unit} " in row, row
        assert row.split()[-2:] == ["-", "-"], row
    # Higher is better in these rows: the ratio legend says so.
    assert "except in 'el/s' and 'steps/s' rows (higher is better" in proc.stdout
    assert "every element arrived exactly once" in proc.stdout
    assert "the variable ended exactly at 2,000" in proc.stdout
    rows = {row["id"]: row for row in json.loads(out_json.read_text())["rows"]}
    for row_id in ("queue", "variable"):
        assert rows[row_id]["better"] == "higher"
        assert rows[row_id]["ours"] > 0
        assert rows[row_id]["anchor"] > 0
        assert rows[row_id]["target"] is None
        assert rows[row_id]["status"] == "-"


def test_step_control_rows_are_selectable_and_untargeted(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks("--quick", "--no-external",
                           "--only", "callable,callable.nested,trace,trace.off",
                           "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = ["callable", "callable.nested", "trace", "trace.off"]
    assert _table_ids(proc.stdout) == ids
    lines = proc.stdout.splitlines()
    for row_id, unit in (("callable", "us/call"), ("callable.nested", "us/call"),
                         ("trace", "us/node"), ("trace.off", "us/node")):
        assert not any(f"] {row_id}: asyncflow " in line for line in lines)
        row = next(line for line in lines if line.startswith(row_id + " "))
        assert f" {unit} " in row, row
        assert row.split()[-2:] == ["-", "-"], row
    # The notes say what is compared with what.
    assert "fetches {'a': [y, z], 'b': (y,)}, feeds x=1.0, w=3.0" in proc.stdout
    assert "ours/anc = the traced slowdown" in proc.stdout
    assert "tracing off costs nothing" in proc.stdout
    assert "node stats recorded" in proc.stdout
    rows = {row["id"]: row for row in json.loads(out_json.read_text())["rows"]}
    assert list(rows) == ids
    for row_id in ids:
        assert rows[row_id]["better"] == "lower"
        assert rows[row_id]["ours"] > 0
        assert rows[row_id]["anchor"] > 0
        assert rows[row_id]["target"] is None
        assert rows[row_id]["status"] == "-"


def test_unknown_workload_is_a_usage_error() -> None:
    proc = _run_benchmarks("--only", "nope")
    assert proc.returncode == 2
    assert "unknown workload(s) nope" in proc.stderr


@pytest.mark.parametrize("module", ["benchmarks.external", "benchmarks.scale"])
def test_child_modules_import_without_the_anchors(module: str) -> None:
    # TF and Dask are optional anchors: importing the harness must not need them.
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            "assert 'tensorflow' not in sys.modules and 'dask' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_distributed_quick_run_reports_every_row() -> None:
    pytest.importorskip("distributed")
    proc = _run_benchmarks("distributed", "--quick")
    assert proc.returncode == 0, proc.stderr
    assert _table_ids(proc.stdout) == ["dist.step", "dist.bytes", "dist.concurrent",
                                       "dist.kill"]
    assert "Dask's own worker-to-worker pull" in proc.stdout
