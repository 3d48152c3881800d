"""Running a benchmark in a process of its own, and what a process measures of itself.

A figure that depends on the whole process (peak RSS, the first run after import)
or on a foreign engine (TensorFlow, Dask) is measured in a fresh subprocess; it
prints one JSON object on its last line, which :func:`run_child` returns.  This
module imports nothing beyond the standard library, so a child that measures its
own memory pays nothing for it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
from typing import Any

Results = dict[str, Any]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> dict[str, str]:
    """The environment for a benchmark subprocess: ours, with the repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_child(args: list[str], timeout: float) -> Results:
    """Run ``python -m <args>`` and parse the JSON object on its last stdout line."""
    cmd = [sys.executable, "-m", *args]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(),
            cwd=REPO_ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"_error": f"timed out after {timeout:.0f} s: {' '.join(args)}"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"_error": f"exit {proc.returncode}: {tail}"}
    result: Results = json.loads(lines[-1])
    return result


def importable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it here."""
    return importlib.util.find_spec(module) is not None


def current_rss_mb() -> float:
    """This process's resident set size now, in MB (``/proc/self/statm`` on Linux;
    elsewhere the peak so far, the closest figure ``resource`` gives)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return peak_rss_mb()
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``ru_maxrss``: KiB on Linux)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return maxrss * scale / 1e6
