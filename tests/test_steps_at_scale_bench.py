"""``python -m benchmarks steps_at_scale`` runs, bounded, and prints both figures with
their ratios (a smoke run at small N: not a measurement)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_steps_at_scale_prints_throughput_and_memory_beside_plain_coroutines() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "steps_at_scale", "--quick", "--repeats", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if re.match(r"\s+[\d,]+\s+1 \|", line)]
    assert [row.split()[0] for row in rows] == ["1,000", "5,000"], proc.stdout
    for row in rows:
        # steps/s max, median | coros/s max, median | 2 ratios | B/step | B/coro | 2 ratios
        assert len(re.findall(r"\d+\.\d\dx", row)) == 4, row
    assert "targets: throughput ratio >= 0.6x" in proc.stdout
