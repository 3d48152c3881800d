"""Smoke test of ``python -m benchmarks``: it runs and reports every workload.

Performance is never asserted here: timings on a shared CI machine say nothing about
a change.  The test checks that the harness runs end to end at quick sizes (in a
subprocess, so the BLAS thread pinning happens before numpy is imported, as it does
for a user) and that the table, the target lines and the JSON cover every row.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

ROW_IDS = (
    "chain",
    "xdev.k1",
    "xdev.k100",
    "wide",
    "tiny.run",
    "tiny.run_sync",
    "tiny.run_sync.async",
    "concurrent",
    "callable",
    "callable.nested",
    "trace",
    "trace.off",
    "overlap",
    "parallel",
    "parallel.2dev",
    "loop",
    "loop.cond",
    "queue",
    "variable",
    "cnn",
    "scale.build",
    "scale.first_run",
    "scale.second_run",
    "scale.peak_rss",
    "scale.cond.second_run",
    "scale.cond.peak_rss",
    "opt.fold.first_run",
    "opt.fold.steady",
    "opt.cse",
    "opt.call.inlined",
    "opt.call.kernel",
    "service.cpu",
    "service.p50",
    "service.p99",
    "service.ops",
)
TARGETED = (
    "chain",
    "wide",
    "tiny.run",
    "tiny.run_sync.async",
    "concurrent",
    "trace",
    "overlap",
    "parallel",
    "scale.build",
    "scale.first_run",
    "scale.peak_rss",
    "scale.cond.second_run",
    "scale.cond.peak_rss",
    "opt.fold.first_run",
    "opt.fold.steady",
    "opt.cse",
    "service.cpu",
    "service.p99",
)
#: The targets against TF 1.x, as the table and the targets section print them.
TF_TARGETED = {
    "chain": "<= 1.00x TF",
    "wide": "<= 1.50x TF",
    "xdev.k1": "<= 1.00x TF",
    "tiny.run": ">= 30.0x faster than TF",
    "loop": "<= 1.00x TF",
    "loop.cond": "<= 1.50x TF",
    "queue": ">= 5.00x TF",
    "scale.build": ">= 50.0x faster than TF",
    "scale.first_run": ">= 8.00x faster than TF",
}
SERVICE_INSTALLED = all(
    importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn", "aiohttp")
)


def _table_ids(stdout: str) -> list[str]:
    """The first cell of each row of the results table (header to first blank line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("workload "))
    ids = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        ids.append(line.split()[0])
    return ids


def _target_cells(stdout: str, row_id: str) -> tuple[str, str, str, str]:
    """A table row's (target, status, target vs TF, TF status) cells, cut at the
    header's column positions."""
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("workload "))
    starts = [header.index(name) for name in ("target", "status", "target vs TF", "TF status")]
    row = next(line for line in lines if line.startswith(row_id + " "))
    a, b, c, d = (row[start:end].strip() for start, end in zip(starts, [*starts[1:], len(row)]))
    return a, b, c, d


def _run_benchmarks(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pythonpath, str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_quick_run_reports_every_workload(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks("--quick", "--no-external", "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    lines = proc.stdout.splitlines()
    assert tuple(_table_ids(proc.stdout)) == ROW_IDS, proc.stdout
    for row_id in TARGETED:
        assert any(f"] {row_id}: asyncflow " in line for line in lines), row_id
    # The targets against TF are listed, and not judged without TF's column.
    for row_id, text in TF_TARGETED.items():
        assert any(
            line.startswith(f"[ no TF ] vs TF: {row_id}: asyncflow ")
            and line.endswith(f"target {text}")
            for line in lines
        ), row_id
    assert "ERROR" not in proc.stdout
    assert "OPENBLAS_NUM_THREADS=1" in proc.stdout
    # The medians table lists every measured row beside its best repeat.
    start = lines.index(next(line for line in lines if line.startswith("medians of the")))
    assert lines[start + 1].split()[:6] == ["workload", "unit", "reps", "ours", "min", "ours"]
    median_ids = [line.split()[0] for line in lines[start + 3 : start + 3 + len(ROW_IDS)]]
    measured = [r for r in ROW_IDS if SERVICE_INSTALLED or not r.startswith("service.")]
    assert median_ids[: len(measured)] == measured

    data = json.loads(out_json.read_text())
    rows = {row["id"]: row for row in data["rows"]}
    assert tuple(rows) == ROW_IDS
    for row_id, row in rows.items():
        if row_id.startswith("service.") and not SERVICE_INSTALLED:
            assert row["skipped"].startswith("not installed"), row
            continue
        assert isinstance(row["ours"], float), row_id
        if not row_id.startswith("xdev."):  # (xdev's difference of two runs: no median)
            assert isinstance(row["ours_median"], float), row_id
        assert row["status"] in ("met", "NOT met", "inconclusive", "-"), row_id
        assert row["tf_note"] == row["dask_note"] == "skipped"
        assert row["tf_status"] == ("no TF" if row_id in TF_TARGETED else "-"), row_id
        assert row["tf_target"] == TF_TARGETED.get(row_id), row_id

    # The concurrency and service rows: ratios against their gather anchors.
    assert rows["concurrent"]["better"] == "higher"
    assert "asyncio.gather of 1,000 `await sess.run(y, feed_dict={x: 1.0})`" in proc.stdout
    if SERVICE_INSTALLED:  # (the test extra brings the bench extra)
        for row_id in ("service.cpu", "service.p50", "service.p99", "service.ops"):
            assert rows[row_id]["anchor"] > 0, row_id
        assert "Starlette on uvicorn" in proc.stdout
        # The bytecode census: counted, asyncflow's share among /run's.
        assert "bytecodes counted with sys.settrace over 20 requests" in proc.stdout
        assert "asyncflow's own" in proc.stdout
        assert "server GC collections" in proc.stdout
    for row_id, limit in (("concurrent", 0.5), ("service.cpu", 1.1), ("service.p99", 1.5)):
        if rows[row_id]["ours"] is None:
            continue  # (service without the bench extra: checked above as skipped)
        # (The service's CPU is judged on the medians of its repeats.)
        of = "_median" if row_id == "service.cpu" else ""
        ratio = rows[row_id]["ours" + of] / rows[row_id]["anchor" + of]
        met = ratio >= limit if row_id == "concurrent" else ratio <= limit
        assert rows[row_id]["status"] == ("met" if met else "NOT met"), row_id


def test_only_runs_the_named_workload() -> None:
    proc = _run_benchmarks("--quick", "--no-external", "--only", "tiny")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["tiny.run", "tiny.run_sync", "tiny.run_sync.async"]


def test_multi_device_rows_are_selectable_and_untargeted() -> None:
    proc = _run_benchmarks(
        "--quick", "--no-external", "--only", "xdev.k1,xdev.k100", "--only", "parallel.2dev"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["xdev.k1", "xdev.k100", "parallel.2dev"]
    for row_id in ("xdev.k1", "xdev.k100", "parallel.2dev"):
        # No target: not listed under "targets:", and the target/status cells are "-".
        assert not any(f"] {row_id}: asyncflow " in line for line in proc.stdout.splitlines())
        assert _target_cells(proc.stdout, row_id)[:2] == ("-", "-")
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
        assert _target_cells(proc.stdout, row_id) == ("-", "-", TF_TARGETED[row_id], "no TF")
    assert "parallel_iterations=10" in proc.stdout


def test_queue_and_variable_rows_are_throughputs_and_untargeted(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks(
        "--quick", "--no-external", "--only", "queue,variable", "--json", str(out_json)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _table_ids(proc.stdout) == ["queue", "variable"]
    lines = proc.stdout.splitlines()
    for row_id, unit in (("queue", "el/s"), ("variable", "steps/s")):
        assert not any(f"] {row_id}: asyncflow " in line for line in lines)
        row = next(line for line in lines if line.startswith(row_id + " "))
        assert f" {unit} " in row, row
        assert _target_cells(proc.stdout, row_id)[:2] == ("-", "-")
    assert _target_cells(proc.stdout, "queue")[2:] == (">= 5.00x TF", "no TF")
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


def test_step_control_rows_are_selectable(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks(
        "--quick",
        "--no-external",
        "--only",
        "callable,callable.nested,trace,trace.off",
        "--json",
        str(out_json),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = ["callable", "callable.nested", "trace", "trace.off"]
    assert _table_ids(proc.stdout) == ids
    lines = proc.stdout.splitlines()
    for row_id, unit in (
        ("callable", "us/call"),
        ("callable.nested", "us/call"),
        ("trace", "us/node"),
        ("trace.off", "us/node"),
    ):
        targeted = row_id == "trace"  # the FULL_TRACE slowdown target: <= 4x
        assert any(f"] {row_id}: asyncflow " in line for line in lines) == targeted
        row = next(line for line in lines if line.startswith(row_id + " "))
        assert f" {unit} " in row, row
        assert _target_cells(proc.stdout, row_id)[0] == ("<= 4.00x anchor" if targeted else "-")
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
        if row_id == "trace":
            slowdown = rows[row_id]["ours"] / rows[row_id]["anchor"]
            assert rows[row_id]["status"] == ("met" if slowdown <= 4.0 else "NOT met")
        else:
            assert rows[row_id]["target"] is None
            assert rows[row_id]["status"] == "-"


def test_unknown_workload_is_a_usage_error() -> None:
    proc = _run_benchmarks("--only", "nope")
    assert proc.returncode == 2
    assert "unknown workload(s) nope" in proc.stderr


@pytest.mark.parametrize("module", ["benchmarks.external", "benchmarks.scale"])
def test_child_modules_import_without_the_anchors(module: str) -> None:
    # TF and Dask are optional anchors: importing the harness must not need them.
    code = (
        f"import importlib, sys; importlib.import_module({module!r}); "
        "assert 'tensorflow' not in sys.modules and 'dask' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def test_distributed_quick_run_reports_every_row() -> None:
    pytest.importorskip("distributed")
    proc = _run_benchmarks("distributed", "--quick")
    assert proc.returncode == 0, proc.stderr
    assert _table_ids(proc.stdout) == ["dist.step", "dist.bytes", "dist.concurrent", "dist.kill"]
    assert "Dask's own worker-to-worker pull" in proc.stdout


def test_service_is_skipped_without_the_bench_extra(tmp_path: Path) -> None:
    # A uvicorn that fails to import stands for the bench extra not being installed.
    fake = tmp_path / "uvicorn"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no uvicorn here')\n")
    out_json = tmp_path / "results.json"
    proc = _run_benchmarks(
        "--quick",
        "--no-external",
        "--only",
        "service",
        "--json",
        str(out_json),
        pythonpath=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row_id in ("service.cpu", "service.p50", "service.p99", "service.ops"):
        row = next(line for line in proc.stdout.splitlines() if line.startswith(row_id + " "))
        assert " skipped " in row, row
    assert (
        'service.cpu: skipped: not installed: uvicorn (the bench extra: pip install -e ".[bench]")'
    ) in proc.stdout
    assert "[skipped] service.cpu: asyncflow skipped us/req" in proc.stdout
    rows = {row["id"]: row for row in json.loads(out_json.read_text())["rows"]}
    assert all(rows[r]["ours"] is None and rows[r]["status"] in ("skipped", "-") for r in rows)


def _models_rows(stdout: str) -> list[tuple[str, str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("model "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = line.split()
        rows.append((cells[0], cells[2]))
    return rows


def test_models_quick_run_serves_the_saved_models_and_a_manifest(tmp_path: Path) -> None:
    # A frozen graph listed by a manifest, as the model zoo lists its graphs.
    import numpy as np

    import asyncflow as af
    from asyncflow.compat import export_tf_graph_def

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, [None, 6, 6, 2], name="input")
        w = af.constant(np.random.default_rng(0).standard_normal((3, 3, 2, 4)).astype(np.float32))
        y = af.identity(af.nn.relu(af.nn.conv2d(x, w, 1, "SAME")), name="Identity")
    (tmp_path / "tiny.pb").write_bytes(export_tf_graph_def(g))
    feed = np.random.default_rng(1).standard_normal((2, 6, 6, 2)).astype(np.float32)
    with af.Session(graph=g) as sess:
        out = sess.run_sync(y, {x: feed})
    np.savez(tmp_path / "tiny.npz", **{"feed/input:0": feed, "fetch/Identity:0": out})
    manifest = {
        "models": {
            "tiny": {
                "graph": "tiny.pb",
                "values": "tiny.npz",
                "inputs": [{"name": "input:0", "dtype": "float32", "shape": [None, 6, 6, 2]}],
                "outputs": ["Identity:0"],
                "op_types": ["Conv2D"],
            }
        }
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    proc = _run_benchmarks(
        "models",
        "--quick",
        "--no-external",
        "--rounds",
        "1",
        "--manifest",
        str(tmp_path / "manifest.json"),
        "--only",
        "conv",
        "--only",
        "transformer",
        "--only",
        "tiny",
        "--json",
        str(tmp_path / "models.json"),
    )
    assert proc.returncode == 0, proc.stderr
    assert _models_rows(proc.stdout) == [
        ("conv", "1"),
        ("conv", "8"),
        ("transformer", "1"),
        ("transformer", "8"),
        ("tiny", "1"),
        ("tiny", "8"),
    ]
    assert "notes:" not in proc.stdout  # every model matched its recorded outputs
    rows = json.loads((tmp_path / "models.json").read_text())
    assert all(r["times"]["asyncflow"] for r in rows)
