"""The regression guard: ``python -m benchmarks --guard`` (CI runs it; ~10 s).

It measures a few rows at small sizes of its own (:data:`GUARD`) and compares each
row's ratio to its in-process anchor (ours / anchor, as the table's ``ours/anc``
column: never an absolute time, so the machine's speed cancels out) with the ratio
committed in ``benchmarks/guard_baseline.json``.  A row fails when its ratio
regressed by more than :data:`FACTOR` (2x): above twice the baseline for a cost
(``better == "lower"``), below half of it for a throughput (``better == "higher"``).

Each repeat is timed in this process's CPU time (``time.process_time``), not wall
time: the guarded rows run on one thread, where the two are the same on an idle
machine, but on a shared CI runner a busy neighbour stalls the wall clock of
whichever side it preempts (with wall time and two other busy processes on this
2-core machine, a ratio moved by up to 4x).  Small sizes are noisy too, so: the rows are the ones whose ratio stays within ~1.3x
from run to run at these sizes on a busy 2-core machine (chain, wide, tiny.run,
concurrent, loop, variable; trace, loop.cond, queue, the opt rows and the sync
runners moved by 2x or more and are left out); each figure is already the best of
several interleaved repeats; and a row that fails is measured again (up to
:data:`RETRIES` more times, its best ratio kept) before the guard reports it:
a real 2x regression fails every time, a noisy neighbour rarely does.

When a change moves a ratio on purpose (a faster executor makes the baseline
loose: regenerate it to protect the new speed; a deliberate trade-off makes it
fail), regenerate the baseline with :data:`REGENERATE` and commit the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import Row
from benchmarks.sizes import QUICK, Sizes, using_clock
from benchmarks.workloads import ROWS_OF, make_rows, run_ours

#: The guarded rows and the workload that measures each.
GUARD_ROWS = {
    "chain": "chain",
    "wide": "wide",
    "tiny.run": "tiny",
    "concurrent": "concurrent",
    "loop": "loop",
    "variable": "variable",
}
#: The guard's sizes: quick's, but every timed block of the guarded rows (the
#: anchor's too) long enough, >= ~5 ms, that on a machine whose cores are shared with
#: other busy processes, ours and the anchor get the same share of a core: with
#: blocks shorter than the scheduler's time slice, the best of the anchor's repeats
#: ran unpreempted more often than ours and a ratio moved by 4x or more.
GUARD = dataclasses.replace(
    QUICK,
    chain_n=10_000,
    wide_n=5_000,
    tiny_calls=10_000,
    tiny_sync_calls=50,
    loop_n=10_000,
    variable_n=20_000,
    state_repeats=3,
    concurrent_batches=5,
    repeats=5,
)
#: The sizes the guarded workloads read: a baseline measured with others is refused.
GUARD_FIELDS = (
    "chain_n",
    "wide_n",
    "tiny_calls",
    "tiny_sync_calls",
    "concurrent_runs",
    "concurrent_batches",
    "loop_n",
    "loop_parallel_iterations",
    "variable_n",
    "variable_tasks",
    "state_repeats",
    "repeats",
)
FACTOR = 2.0
RETRIES = 2
BASELINE_PATH = Path(__file__).with_name("guard_baseline.json")
REGENERATE = "python -m benchmarks --guard --update-baseline"

Measure = Callable[[list[str]], dict[str, Row]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One guarded row against its committed baseline."""

    row: str
    ratio: float | None  # ours / anchor now (None: not measured)
    baseline: float | None  # the committed ratio (None: no baseline for the row)
    better: str  # "lower" or "higher"
    error: str | None = None

    @property
    def limit(self) -> float | None:
        if self.baseline is None:
            return None
        return self.baseline * FACTOR if self.better == "lower" else self.baseline / FACTOR

    @property
    def ok(self) -> bool:
        if self.error is not None or self.ratio is None or self.limit is None:
            return False
        return self.ratio <= self.limit if self.better == "lower" else self.ratio >= self.limit

    def message(self) -> str:
        if self.error is not None:
            return f"guard: {self.row} failed to run: {self.error}"
        if self.ratio is None:
            return f"guard: {self.row} was not measured"
        if self.baseline is None or self.limit is None:
            return (
                f"guard: {self.row} has no committed baseline ratio in "
                f"{BASELINE_PATH.name}; regenerate it with `{REGENERATE}`"
            )
        word = "above" if self.better == "lower" else "below"
        state = "ok" if self.ok else "REGRESSED"
        return (
            f"guard: {self.row} {state}: ours/anchor {self.ratio:.3f}x, committed "
            f"baseline {self.baseline:.3f}x (fails {word} {self.limit:.3f}x = "
            f"{'2x' if self.better == 'lower' else '1/2 of'} the baseline; "
            f"{self.better} is better)"
            + (
                ""
                if self.ok
                else f"; if the change is intended, regenerate the "
                f"baseline with `{REGENERATE}` and commit "
                f"benchmarks/{BASELINE_PATH.name}"
            )
        )


def ratios(rows: dict[str, Row]) -> dict[str, tuple[float | None, str | None]]:
    """Each row's (ours / anchor, error)."""
    out: dict[str, tuple[float | None, str | None]] = {}
    for row_id, row in rows.items():
        if row.error is not None or row.ours is None or not row.anchor:
            out[row_id] = (None, row.error or "no figure")
        else:
            out[row_id] = (row.ours / row.anchor, None)
    return out


def check(
    measured: dict[str, tuple[float | None, str | None]],
    baseline: dict[str, Any],
    better: dict[str, str],
) -> list[Verdict]:
    """The verdict of every measured row against ``baseline`` (row -> {"ratio": x})."""
    out = []
    for row_id, (ratio, error) in measured.items():
        entry = baseline.get(row_id)
        out.append(
            Verdict(
                row_id,
                ratio,
                None if entry is None else float(entry["ratio"]),
                better[row_id],
                error,
            )
        )
    return out


def _best(a: Verdict, b: Verdict) -> Verdict:
    """Of two measurements of one row, the one in the better direction."""
    if a.ratio is None:
        return b
    if b.ratio is None:
        return a
    if a.better == "lower":
        return a if a.ratio <= b.ratio else b
    return a if a.ratio >= b.ratio else b


def measure_rows(row_ids: list[str], sizes: Sizes = GUARD) -> dict[str, Row]:
    """Run the workloads of ``row_ids`` (in this process, no external anchors)."""
    names = list(dict.fromkeys(GUARD_ROWS[r] for r in row_ids))
    all_rows = make_rows(sizes)
    rows = {r: all_rows[r] for name in names for r in ROWS_OF[name]}
    # CPU time, not wall time: see the module docstring.
    with contextlib.redirect_stderr(io.StringIO()), using_clock(time.process_time):
        run_ours(names, sizes, rows)
    return {r: rows[r] for r in row_ids}


def guard(
    row_ids: list[str], baseline: dict[str, Any], measure: Measure = measure_rows
) -> list[Verdict]:
    """Measure, compare, and measure the failing rows again (up to RETRIES times)."""
    rows = measure(row_ids)
    better = {r: rows[r].better for r in row_ids}
    verdicts = {v.row: v for v in check(ratios(rows), baseline, better)}
    for _ in range(RETRIES):
        failing = [
            r
            for r, v in verdicts.items()
            if not v.ok and v.baseline is not None and v.error is None
        ]
        if not failing:
            break
        again = check(ratios(measure(failing)), baseline, better)
        for v in again:
            verdicts[v.row] = _best(verdicts[v.row], v)
    return [verdicts[r] for r in row_ids]


def load_baseline(path: Path) -> dict[str, Any]:
    """The baseline's rows (row -> {"ratio": ..., ...}); ValueError when it was measured
    at other sizes than :data:`GUARD`'s (those of :data:`GUARD_FIELDS`)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    now, then = GUARD.to_json(), data.get("sizes", {})
    changed = [k for k in GUARD_FIELDS if then.get(k) != now[k]]
    if changed:
        raise ValueError(
            f"{path.name} was measured at other sizes ({', '.join(changed)} "
            f"changed since); regenerate it with `{REGENERATE}`"
        )
    rows: dict[str, Any] = data["rows"]
    return rows


def write_baseline(path: Path, rows: dict[str, Row]) -> None:
    import numpy as np

    data = {
        "about": f"ours/anchor ratios of the rows `python -m benchmarks --guard` checks; "
        f"a row fails when its ratio regresses by more than {FACTOR:g}x. "
        f"Regenerate with `{REGENERATE}`.",
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        },
        "sizes": {k: getattr(GUARD, k) for k in GUARD_FIELDS},
        "rows": {
            r: {
                "ratio": round(row.ours / row.anchor, 4),
                "better": row.better,
                "ours": row.ours,
                "anchor": row.anchor,
                "unit": row.unit,
            }
            for r, row in rows.items()
            if row.ours is not None and row.anchor
        },
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def main(only: list[str], update: bool, baseline_path: Path | None) -> int:
    """``python -m benchmarks --guard [--update-baseline] [--baseline FILE] [--only ...]``."""
    path = baseline_path or BASELINE_PATH
    unknown = sorted(set(only) - set(GUARD_ROWS) - set(GUARD_ROWS.values()))
    if unknown:
        print(
            f"guard: not guarded: {', '.join(unknown)} (guarded rows: {', '.join(GUARD_ROWS)})",
            file=sys.stderr,
        )
        return 2
    row_ids = [r for r, w in GUARD_ROWS.items() if not only or r in only or w in only]
    if update:
        rows = measure_rows(row_ids)
        failed = [r for r, row in rows.items() if row.ours is None or not row.anchor]
        if failed:
            print(
                f"guard: {', '.join(failed)} failed to run; baseline not written: "
                f"{rows[failed[0]].error}",
                file=sys.stderr,
            )
            return 1
        write_baseline(path, rows)
        for r, row in rows.items():
            assert row.ours is not None
            assert row.anchor is not None
            print(
                f"guard: {r} baseline ours/anchor {row.ours / row.anchor:.3f}x "
                f"({row.ours:.3g} / {row.anchor:.3g} {row.unit}; CPU time)"
            )
        print(f"guard: wrote {path}")
        return 0
    try:
        baseline = load_baseline(path)
    except FileNotFoundError:
        print(f"guard: no baseline at {path}; create it with `{REGENERATE}`", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"guard: {exc}", file=sys.stderr)
        return 1
    verdicts = guard(row_ids, baseline)
    for v in verdicts:
        print(v.message(), file=sys.stdout if v.ok else sys.stderr)
    bad = [v for v in verdicts if not v.ok]
    print(
        f"guard: {len(verdicts) - len(bad)} of {len(verdicts)} rows within "
        f"{FACTOR:g}x of {path.name}"
        + (f"; FAILED: {', '.join(v.row for v in bad)}" if bad else "")
    )
    return 1 if bad else 0
