"""``python -m benchmarks steps_at_scale``: many concurrent steps, each awaiting I/O.

A service's step is a few cheap kernels around one await.  Here ``N`` steps (10,000
and 100,000) are in flight at once, each awaiting one ``async def`` ``py_func`` kernel
that sleeps 50 ms and multiplying its result by 2; the anchor is ``N`` plain
coroutines doing the same (await the same sleeping function, multiply), gathered the
same way.  Per ``N`` it prints, beside each other and with their ratio:

* throughput, steps (or coroutines) per second over the whole gather;
* memory per in-flight step: the peak RSS delta of the gather divided by ``N``.

Each measurement runs in a fresh subprocess (peak RSS is per process), asyncflow
and the anchor alternating repeat by repeat; min and median of the repeats are
shown.  A process as the user has it: no ``gc.freeze``, default GC thresholds; the
anchor's process has asyncflow imported and an idle session open too, so both pay
the cycle collector for the same heap.
Bounded: up to 3 repeats (``--repeats``), fewer when the next one would end past
the time budget (``--budget``, 55 s by default; at least one per ``N``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

#: How long each async kernel sleeps (seconds).
SLEEP_S = 0.05
SIZES = (10_000, 100_000)
QUICK_SIZES = (1_000, 5_000)


def _rss_kib() -> int:
    """The process's resident set now, in KiB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def _sleeper(v: Any) -> Any:
    await asyncio.sleep(SLEEP_S)
    return v


async def _ours(n: int) -> tuple[float, int]:
    import asyncflow as af

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        k = af.py_func(_sleeper, [x], af.float32, name="io")
        y = af.multiply(k, np.float32(2.0), name="y")
    async with af.Session(graph=g) as sess:
        got = await sess.run(y, {x: 1.0})  # compile outside the measurement
        if got != 2.0:
            raise AssertionError(f"step computed {got!r}, expected 2.0")
        gc.collect()
        before = _rss_kib()
        start = time.perf_counter()
        values = await asyncio.gather(*(sess.run(y, {x: 1.0}) for _ in range(n)))
        took = time.perf_counter() - start
        peak = _peak_kib()
    _check(values, n)
    return took, max(0, peak - before)


async def _plain(n: int) -> tuple[float, int]:
    # The same process as asyncflow's: asyncflow imported, the graph built and a
    # session open (idle), so both sides pay the cycle collector for the same heap
    # and the ratio is the per-step cost alone.
    import asyncflow as af

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        af.multiply(af.py_func(_sleeper, [x], af.float32, name="io"), np.float32(2.0))
    async with af.Session(graph=g):
        return await _coroutines(n)


async def _coroutines(n: int) -> tuple[float, int]:
    two = np.float32(2.0)

    async def one(v: Any) -> Any:
        return np.multiply(await _sleeper(v), two)

    got = await one(np.float32(1.0))
    if got != 2.0:
        raise AssertionError(f"coroutine computed {got!r}, expected 2.0")
    gc.collect()
    before = _rss_kib()
    start = time.perf_counter()
    values = await asyncio.gather(*(one(np.float32(1.0)) for _ in range(n)))
    took = time.perf_counter() - start
    peak = _peak_kib()
    _check(values, n)
    return took, max(0, peak - before)


def _check(values: list[Any], n: int) -> None:
    if len(values) != n or any(v != 2.0 for v in values):
        raise AssertionError(f"{len(values)} results, not {n} times 2.0")


def _child(kind: str, n: int) -> None:
    took, delta = asyncio.run(_ours(n) if kind == "ours" else _plain(n))
    print(json.dumps({"seconds": took, "rss_delta_kib": delta}))


def _measure(kind: str, n: int) -> tuple[float, int]:
    """One fresh process: (seconds for the gather, peak RSS delta in KiB)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.steps_at_scale", "--child", kind, str(n)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), int(result["rss_delta_kib"])


def _row(n: int, repeats: int, deadline: float) -> str:
    """One row: ``repeats`` interleaved pairs of processes, fewer when the next pair
    (as long as the first took) would end past ``deadline`` (at least one pair)."""
    ours: list[tuple[float, int]] = []
    plain: list[tuple[float, int]] = []
    took = 0.0
    for _ in range(repeats):  # interleaved: the anchor, then asyncflow, per repeat
        if ours and time.perf_counter() + took > deadline:
            break
        start = time.perf_counter()
        plain.append(_measure("plain", n))
        ours.append(_measure("ours", n))
        took = time.perf_counter() - start
    rate_o = [n / t for t, _ in ours]
    rate_p = [n / t for t, _ in plain]
    mem_o = [d * 1024 / n for _, d in ours]
    mem_p = [max(d, 1) * 1024 / n for _, d in plain]
    best = max(rate_o) / max(rate_p)
    med = statistics.median(rate_o) / statistics.median(rate_p)
    mbest = min(mem_o) / min(mem_p)
    mmed = statistics.median(mem_o) / statistics.median(mem_p)
    return (
        f"{n:>8,} {len(ours):>4} | {max(rate_o):>9,.0f} {statistics.median(rate_o):>9,.0f} | "
        f"{max(rate_p):>9,.0f} {statistics.median(rate_p):>9,.0f} | {best:5.2f}x {med:5.2f}x | "
        f"{min(mem_o):>7,.0f} {statistics.median(mem_o):>7,.0f} | "
        f"{min(mem_p):>7,.0f} {statistics.median(mem_p):>7,.0f} | {mbest:5.2f}x {mmed:5.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks steps_at_scale", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small N: a smoke run")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per engine and N")
    p.add_argument(
        "--budget",
        type=float,
        default=55.0,
        help="seconds: fewer repeats (at least one per N) when the next would end later",
    )
    p.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    started = time.perf_counter()
    print(
        f"steps at scale: N concurrent steps, each awaiting one async kernel "
        f"(sleep {SLEEP_S * 1000:.0f} ms) and multiplying, vs N plain coroutines doing "
        f"the same; {args.repeats} fresh processes each, interleaved; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        "       N reps |  steps/s (max   median) |  coros/s (max   median) | ratio max  med | "
        "B/step (min  median) | B/coro (min  median) | ratio min  med"
    )
    sizes = QUICK_SIZES if args.quick else SIZES
    for k, n in enumerate(sizes):
        # Each N gets its share of what is left of the budget.
        left = args.budget - (time.perf_counter() - started)
        deadline = time.perf_counter() + left / (len(sizes) - k)
        print(_row(n, args.repeats, deadline), flush=True)
    print(
        "targets: throughput ratio >= 0.6x; memory per in-flight step <= 2x a coroutine's; "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
