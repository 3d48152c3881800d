"""The benchmark regression guard (``python -m benchmarks --guard``, run by .ci/run).

The guard compares ratios ours / in-process anchor with a committed baseline and
fails on a regression by more than 2x.  These tests prove that it fails, and with
a message that names the row, the ratio, the baseline and the command that
regenerates the baseline: fed fake measurements (no timing involved), and once end
to end against a baseline no real run can meet.  They assert nothing about speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import guard
from benchmarks.report import Row

REPO_ROOT = Path(__file__).resolve().parent.parent
BASELINE = {"chain": {"ratio": 0.6}, "concurrent": {"ratio": 0.5}}
BETTER = {"chain": "lower", "concurrent": "higher"}


def _row(row_id: str, ours: float, anchor: float) -> Row:
    row = Row(row_id, "m", "us", "a", better=BETTER.get(row_id, "lower"))
    row.ours, row.anchor = ours, anchor
    return row


def test_a_cost_ratio_twice_the_baseline_fails_naming_row_ratio_baseline_and_command() -> None:
    (verdict,) = guard.check({"chain": (1.5, None)}, BASELINE, BETTER)  # 2.5x of 0.6
    assert not verdict.ok
    msg = verdict.message()
    assert msg.startswith(
        "guard: chain REGRESSED: ours/anchor 1.500x, committed baseline "
        "0.600x (fails above 1.200x = 2x the baseline"
    )
    assert "`python -m benchmarks --guard --update-baseline`" in msg
    assert "benchmarks/guard_baseline.json" in msg


def test_a_throughput_ratio_below_half_the_baseline_fails() -> None:
    (verdict,) = guard.check({"concurrent": (0.2, None)}, BASELINE, BETTER)
    assert not verdict.ok
    assert verdict.message().startswith(
        "guard: concurrent REGRESSED: ours/anchor 0.200x, committed baseline 0.500x "
        "(fails below 0.250x = 1/2 of the baseline; higher is better)"
    )


@pytest.mark.parametrize(
    ("row", "ratio"), [("chain", 1.19), ("chain", 0.1), ("concurrent", 0.26), ("concurrent", 3.0)]
)
def test_within_2x_or_better_passes(row: str, ratio: float) -> None:
    (verdict,) = guard.check({row: (ratio, None)}, BASELINE, BETTER)
    assert verdict.ok, verdict.message()
    assert " ok: " in verdict.message()


def test_a_crashed_or_unbaselined_row_fails() -> None:
    crashed, new = guard.check(
        {"chain": (None, "AssertionError: chain computed 3"), "wide": (0.5, None)},
        BASELINE,
        {**BETTER, "wide": "lower"},
    )
    assert not crashed.ok
    assert crashed.message() == "guard: chain failed to run: AssertionError: chain computed 3"
    assert not new.ok
    assert "wide has no committed baseline" in new.message()
    assert "python -m benchmarks --guard --update-baseline" in new.message()


def test_a_failing_row_is_measured_again_and_its_best_ratio_kept() -> None:
    calls: list[list[str]] = []
    figures = iter([{"chain": 2.0, "concurrent": 0.5}, {"chain": 0.7}, {}])

    def measure(row_ids: list[str]) -> dict[str, Row]:
        calls.append(row_ids)
        got = next(figures)
        return {r: _row(r, got[r], 1.0) for r in row_ids}

    verdicts = guard.guard(["chain", "concurrent"], BASELINE, measure)
    assert calls == [["chain", "concurrent"], ["chain"]]  # only the failing row again
    assert [(v.row, v.ratio, v.ok) for v in verdicts] == [
        ("chain", 0.7, True),
        ("concurrent", 0.5, True),
    ]


def test_a_real_regression_fails_after_every_retry() -> None:
    calls: list[list[str]] = []

    def measure(row_ids: list[str]) -> dict[str, Row]:  # a 3x slower chain, every time
        calls.append(row_ids)
        return {r: _row(r, 1.8 if r == "chain" else 0.5, 1.0) for r in row_ids}

    verdicts = guard.guard(["chain", "concurrent"], BASELINE, measure)
    assert len(calls) == 1 + guard.RETRIES
    chain = verdicts[0]
    assert not chain.ok
    assert "chain REGRESSED: ours/anchor 1.800x, committed baseline 0.600x" in chain.message()
    assert verdicts[1].ok


def test_the_committed_baseline_covers_the_guarded_rows_at_the_guard_sizes() -> None:
    rows = guard.load_baseline(guard.BASELINE_PATH)  # ValueError if the sizes changed
    assert set(rows) == set(guard.GUARD_ROWS)
    for row_id, entry in rows.items():
        assert entry["ratio"] > 0, row_id
        assert entry["better"] in ("lower", "higher"), row_id


def test_a_baseline_measured_at_other_sizes_is_refused(tmp_path: Path) -> None:
    data: dict[str, Any] = json.loads(guard.BASELINE_PATH.read_text())
    data["sizes"]["chain_n"] += 1
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=r"other sizes \(chain_n changed since\); "
        r"regenerate it with `python -m benchmarks --guard",
    ):
        guard.load_baseline(path)


def test_the_guard_command_fails_on_a_regressed_ratio(tmp_path: Path) -> None:
    # A baseline 1,000x better than any real chain: the real run must fail it, with the
    # message on stderr and exit status 1.
    data: dict[str, Any] = json.loads(guard.BASELINE_PATH.read_text())
    real = data["rows"]["chain"]["ratio"]
    data["rows"]["chain"]["ratio"] = real / 1000
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(data))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--guard", "--only", "chain", "--baseline", str(path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "guard: chain REGRESSED: ours/anchor " in proc.stderr
    assert f"committed baseline {real / 1000:.3f}x" in proc.stderr
    assert (
        "regenerate the baseline with `python -m benchmarks --guard --update-baseline`"
        in proc.stderr
    )
    assert "guard: 0 of 1 rows within 2x of baseline.json; FAILED: chain" in proc.stdout
