"""The ``python -m benchmarks`` command: run the workloads, print the table.

Exit status: 0 when every selected workload ran (targets met or not: performance is
reported, never asserted), 1 when an asyncflow workload crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import benchmarks
from benchmarks import dist, external, guard, models, report, steps_at_scale
from benchmarks.process import importable
from benchmarks.sizes import FULL, QUICK, WORKLOADS, Sizes
from benchmarks.workloads import ROWS_OF, make_rows, progress, run_ours


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one or two repeats: a smoke run, not a measurement",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only this workload (repeatable, or comma-separated): {', '.join(WORKLOADS)}",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument(
        "--no-external",
        action="store_true",
        help="skip the TensorFlow and Dask anchors (their subprocesses)",
    )
    p.add_argument("--repeats", type=int, help="override best-of-N of the microbenchmarks")
    p.add_argument(
        "--profile",
        metavar="N",
        type=int,
        nargs="?",
        const=30,
        help="cProfile the in-process workloads (not the scale subprocess) and "
        "print the top N functions by own time to stderr (default 30); "
        "profiling inflates the figures, read them as a breakdown only",
    )
    p.add_argument(
        "--guard",
        action="store_true",
        help="the CI regression guard: measure a few rows at small sizes of its "
        "own and fail (exit 1) when a ratio ours/anchor regressed by more "
        "than 2x against benchmarks/guard_baseline.json (see "
        "benchmarks.guard); --only restricts it to some of its rows",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="with --guard: measure and write the baseline instead of checking",
    )
    p.add_argument(
        "--baseline",
        metavar="FILE",
        help="with --guard: this baseline file instead of the committed one",
    )
    args = p.parse_args(argv)
    only = [name for item in args.only for name in item.split(",") if name]
    if args.guard:
        args.only = only
        return args
    if args.update_baseline or args.baseline:
        p.error("--update-baseline and --baseline go with --guard")
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.only = only
    return args


def _environment(sizes: Sizes) -> dict[str, Any]:
    import numpy as np

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "blas_threads": {v: os.environ.get(v) for v in benchmarks.BLAS_THREAD_VARS},
        "blas_pinned_before_numpy": benchmarks.BLAS_PINNED_BEFORE_NUMPY,
        "sizes": sizes.to_json(),
    }


def run_external(names: list[str], sizes: Sizes, rows: dict[str, report.Row]) -> None:
    """Fill the TF and Dask columns from their subprocesses."""
    for engine, attr in (("dask", "dask"), ("tf", "tf")):
        start = time.perf_counter()
        progress(f"{engine} anchors ...")
        # TF's scale figures come from the scale workload (subprocesses alternating
        # with asyncflow's): see run_ours.
        results = external.collect(engine, sizes, names)
        progress(f"{engine} anchors done in {time.perf_counter() - start:.1f} s")
        _apply_external(engine, attr, results, rows)


def _apply_external(
    engine: str, attr: str, results: dict[str, Any], rows: dict[str, report.Row]
) -> None:
    note = "n/a"
    if "_unavailable" in results:
        note = "not inst."
        rows[next(iter(rows))].notes.append(f"{engine}: {results['_unavailable']}")
    elif "_error" in results:
        note = "error"
        rows[next(iter(rows))].notes.append(f"{engine} anchors failed: {results['_error']}")
    for key, value in results.items():
        if key.startswith("_error."):
            workload = key.split(".", 1)[1]
            for row_id in ROWS_OF.get(workload, ()):
                rows[row_id].notes.append(f"{engine} anchor failed: {value}")
                setattr(rows[row_id], f"{attr}_note", "error")
        elif key.startswith("_note.") and key[len("_note.") :] in rows:
            rows[key[len("_note.") :]].notes.append(str(value))
        elif key.startswith("_median.") and key[len("_median.") :] in rows:
            setattr(rows[key[len("_median.") :]], f"{attr}_median", float(value))
    for row in rows.values():
        if row.id in results:
            setattr(row, attr, float(results[row.id]))
        elif getattr(row, f"{attr}_note") == "n/a":
            setattr(row, f"{attr}_note", note)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["distributed"]:  # python -m benchmarks distributed [--quick]
        return dist.main(argv[1:])
    if argv[:1] == ["steps_at_scale"]:  # python -m benchmarks steps_at_scale [--quick]
        return steps_at_scale.main(argv[1:])
    if argv[:1] == ["models"]:  # python -m benchmarks models [--quick] [--manifest F]
        return models.main(argv[1:])
    args = parse_args(argv)
    if args.guard:
        return guard.main(
            args.only, args.update_baseline, Path(args.baseline) if args.baseline else None
        )
    sizes = QUICK if args.quick else FULL
    if args.repeats:
        sizes = Sizes.from_json({**sizes.to_json(), "repeats": args.repeats})
    names = [w for w in WORKLOADS if not args.only or w in args.only]
    all_rows = make_rows(sizes)
    rows = {rid: all_rows[rid] for name in names for rid in ROWS_OF[name]}

    with_tf = not args.no_external and importable("tensorflow")
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        ok = profiler.runcall(run_ours, names, sizes, rows, with_tf)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(args.profile)
    else:
        ok = run_ours(names, sizes, rows, with_tf)
    if args.no_external:
        for row in rows.values():
            row.tf_note = row.dask_note = "skipped"
    else:
        run_external(names, sizes, rows)
    elapsed = time.perf_counter() - started

    env = _environment(sizes)
    env["load_average_1min_at_start"] = load_before
    table_rows = list(rows.values())
    _print_report(args, sizes, table_rows, env, elapsed)
    if args.json:
        _write_json(args.json, args.quick, table_rows, env, elapsed)
    return 0 if ok else 1


def _print_report(
    args: argparse.Namespace,
    sizes: Sizes,
    table_rows: list[report.Row],
    env: dict[str, Any],
    elapsed: float,
) -> None:
    """The table, its medians, legends, notes and targets, after a header saying how
    the figures were taken."""
    blas = ", ".join(f"{k}={v}" for k, v in env["blas_threads"].items())
    pinned = (
        ""
        if env["blas_pinned_before_numpy"]
        else ("  WARNING: numpy was imported before benchmarks: the pin may not apply")
    )
    print(
        f"asyncflow benchmarks ({'quick smoke sizes: not a measurement' if args.quick else 'full'})"
        f" - Python {env['python']}, numpy {env['numpy']}, {env['cpus']} CPUs, "
        f"{elapsed:.0f} s; 1-min load average at start {env['load_average_1min_at_start']:.2f}"
    )
    print(f"BLAS pinned to one thread: {blas}.{pinned}")
    print(
        f"Each figure is the best of {sizes.repeats} repeats (overlap, parallel, Dask: "
        f"best of {sizes.slow_repeats}; queue, variable: best of {sizes.state_repeats}; "
        f"scale: {sizes.scale_repeats} fresh subprocesses per engine; service: "
        f"{sizes.service_repeats} per endpoint); anchors alternate with asyncflow repeat "
        f"by repeat; the medians of the repeats follow the table."
    )
    print(
        "TF 1.x: tf.compat.v1 graph mode, graph optimizers off, own subprocess; "
        "Dask: dask.threaded.get on the same task graph, own subprocess."
    )
    print(report.render_ratio_legend(table_rows))
    print()
    print(report.render_table(table_rows))
    print()
    print("medians of the repeats beside the best (TF: where its anchor reports them):")
    print(report.render_medians(table_rows))
    print()
    print(report.render_anchor_legend(table_rows))
    notes = report.render_notes(table_rows)
    if notes:
        print()
        print(notes)
    print()
    print("targets:")
    print(report.render_targets(table_rows))


def _write_json(
    path: str, quick: bool, table_rows: list[report.Row], env: dict[str, Any], elapsed: float
) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "environment": env,
                "quick": quick,
                "seconds": elapsed,
                "rows": [r.to_json() for r in table_rows],
            },
            f,
            indent=2,
        )
        f.write("\n")
