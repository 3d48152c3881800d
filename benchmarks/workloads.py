"""asyncflow's side of each workload, next to its in-process anchors.

Every workload function takes the :class:`~benchmarks.sizes.Sizes` and fills the
rows it owns (see :func:`make_rows`).  Anchors and asyncflow alternate repeat by
repeat so that a noisy neighbour on the shared machine hits both, and each side
reports its best repeat.  The first asyncflow run of a session (plan compilation,
thread pool start) is never part of a steady-state figure; the scale workload times
it on purpose.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.report import Row, Target
from benchmarks.sizes import Sizes, timed

Af = Any  # the asyncflow module, imported lazily so a broken build fails one row


def make_rows(s: Sizes) -> dict[str, Row]:
    """Every row of the table, keyed by id, before anything is measured."""
    rows = [
        Row("chain", f"{s.chain_n:,} chained adds", "us/node",
            "np.add loop over np.float32 scalars (the numpy floor)",
            Target("<=", 2.0, relative=True)),
        Row("wide", f"{s.wide_n:,} adds + add_n", "us/node",
            "list of np.add on np.float32 scalars + np.sum",
            Target("<=", 2.5)),
        Row("tiny.run", "await sess.run (3 ops)", "us/run",
            "await of a coroutine doing the same numpy ops",
            Target("<=", 20.0)),
        Row("tiny.run_sync", "sess.run_sync (3 ops)", "us/run",
            "asyncio.run of an empty coroutine"),
        Row("overlap", f"{s.overlap_layers}x{s.overlap_width} async kernels",
            "total/cp",
            "asyncio.gather of each layer's coroutines, layer after layer",
            Target("<=", 1.1, anchor_must_meet=True)),
        Row("parallel", f"2x{s.matmul_chain} matmul {s.matmul_dim}^2", "speedup",
            "the two chains on a 2-thread executor vs one after the other",
            Target(">=", 1.6, anchor_must_meet=True), better="higher"),
        Row("scale.build", f"build {s.scale_n:,} nodes", "us/node", "",
            Target("<=", 10.0)),
        Row("scale.first_run", "first run (compiles)", "us/node",
            "np.add loop (numpy floor) at the same length", Target("<=", 20.0)),
        Row("scale.second_run", "second run (cached)", "us/node",
            "np.add loop (numpy floor) at the same length"),
        Row("scale.peak_rss", "peak RSS (subprocess)", "MB",
            "the same subprocess's peak RSS after its imports",
            Target("<=", 400.0)),
    ]
    return {r.id: r for r in rows}


async def _atimed(fn: Callable[[], Awaitable[object]]) -> float:
    gc.collect()
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


def _numpy_chain(n: int) -> Callable[[], object]:
    one = np.float32(1.0)

    def run() -> object:
        x = np.float32(0.0)
        for _ in range(n):
            x = np.add(x, one)
        return x

    return run


def _chain_graph(af: Af, n: int) -> tuple[Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        one = af.constant(np.float32(1.0), name="one")
        x = x0
        for _ in range(n):
            x = x + one
    return g, x0, x


async def _executed_nodes(af: Af, sess: Any, fetch: Any, feed: dict[Any, Any]) -> int | None:
    """How many nodes a traced run executed (None when tracing is unavailable)."""
    try:
        md = af.RunMetadata()
        opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        await sess.run(fetch, feed_dict=feed, options=opts, run_metadata=md)
        return sum(len(d.node_stats) for d in md.step_stats.dev_stats)
    except Exception:
        return None


# --------------------------------------------------------------------------- chain


def chain(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    n = s.chain_n
    g, x0, y = _chain_graph(af, n)
    floor = _numpy_chain(n)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x0: 0.0})
            _check(value == n, f"chain computed {value!r}, expected {n}")
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(floor))
                ours.append(await _atimed(lambda: sess.run(y, feed_dict={x0: 0.0})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["chain"]
    row.ours, row.anchor = min(ours) / n * 1e6, min(anchor) / n * 1e6


# --------------------------------------------------------------------------- wide


def wide(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    n = s.wide_n
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        one = af.constant(np.float32(1.0), name="one")
        y = af.add_n([af.add(x, one) for _ in range(n)])
    xv, onev = np.float32(1.0), np.float32(1.0)

    def numpy_wide() -> object:
        return np.sum([np.add(xv, onev) for _ in range(n)], dtype=np.float32)

    async def main() -> tuple[list[float], list[float], int | None]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x: 1.0})
            _check(value == 2 * n, f"wide computed {value!r}, expected {2 * n}")
            executed = await _executed_nodes(af, sess, y, {x: 1.0})
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(numpy_wide))
                ours.append(await _atimed(lambda: sess.run(y, feed_dict={x: 1.0})))
            return ours, anchor, executed

    ours, anchor, executed = asyncio.run(main())
    row = rows["wide"]
    row.ours, row.anchor = min(ours) / n * 1e6, min(anchor) / n * 1e6
    if executed is not None:
        row.notes.append(f"a traced run executed {executed:,} nodes for {n:,} adds")
        if executed < n:
            row.notes.append("WARNING: the optimizer merged the identical adds (CSE); "
                             "the figure is not the cost of n executed nodes")


# --------------------------------------------------------------------------- tiny


def _tiny_graph(af: Af) -> tuple[Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(af.add(x, 1.0), 2.0)
    return g, x, y


def tiny(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    g, x, y = _tiny_graph(af)
    calls = s.tiny_calls
    one, two = np.float32(1.0), np.float32(2.0)

    async def plain(v: Any) -> Any:
        return np.multiply(np.add(v, one), two)

    async def anchor_calls() -> None:
        v = np.float32(1.0)
        for _ in range(calls):
            await plain(v)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x: 1.0})
            _check(value == 4.0, f"tiny graph computed {value!r}, expected 4.0")

            async def ours_calls() -> None:
                for _ in range(calls):
                    await sess.run(y, feed_dict={x: 1.0})

            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await _atimed(anchor_calls))
                ours.append(await _atimed(ours_calls))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["tiny.run"]
    row.ours, row.anchor = min(ours) / calls * 1e6, min(anchor) / calls * 1e6

    # run_sync: from plain code, one fresh event loop per call.
    sync_calls = s.tiny_sync_calls

    async def empty() -> None:
        pass

    def anchor_sync() -> None:
        for _ in range(sync_calls):
            asyncio.run(empty())

    with af.Session(graph=g) as sess:
        sess.run_sync(y, feed_dict={x: 1.0})

        def ours_sync() -> None:
            for _ in range(sync_calls):
                sess.run_sync(y, feed_dict={x: 1.0})

        ours, anchor = [], []
        for _ in range(s.repeats):
            anchor.append(timed(anchor_sync))
            ours.append(timed(ours_sync))
    row = rows["tiny.run_sync"]
    row.ours, row.anchor = min(ours) / sync_calls * 1e6, min(anchor) / sync_calls * 1e6
    if row.ours < row.anchor:
        row.notes.append("faster than asyncio.run itself: run_sync of a plan made only of "
                         "inline kernels never creates an event loop")


# --------------------------------------------------------------------------- overlap


def overlap(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    layers, width, delay = s.overlap_layers, s.overlap_width, s.overlap_sleep
    critical_path = layers * delay

    async def sleeper(v: Any) -> Any:
        await asyncio.sleep(delay)
        return np.float32(v + 1)

    # Layer k+1's kernels all consume the add_n of layer k: a barrier per layer, as
    # in the gather anchor.
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        b = x
        for _ in range(layers):
            b = af.add_n([af.py_func(sleeper, [b], af.float32) for _ in range(width)])
    expected = np.float32(0.0)
    for _ in range(layers):
        expected = np.float32(width * (expected + 1))

    async def plain() -> Any:
        v = np.float32(0.0)
        for _ in range(layers):
            v = np.sum(await asyncio.gather(*(sleeper(v) for _ in range(width))),
                       dtype=np.float32)
        return v

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(b, feed_dict={x: 0.0})
            _check(bool(np.isclose(value, expected, rtol=1e-5)),
                   f"overlap graph computed {value!r}, expected {expected!r}")
            ours, anchor = [], []
            for _ in range(s.slow_repeats):
                anchor.append(await _atimed(plain))
                ours.append(await _atimed(lambda: sess.run(b, feed_dict={x: 0.0})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["overlap"]
    row.ours, row.anchor = min(ours) / critical_path, min(anchor) / critical_path
    row.notes.append(f"critical path {critical_path * 1e3:.0f} ms; asyncflow's best step "
                     f"{min(ours) * 1e3:.1f} ms")


# --------------------------------------------------------------------------- parallel


def _matmul(a: Any, w: Any) -> Any:
    return np.matmul(a, w)


def parallel(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    d, k = s.matmul_dim, s.matmul_chain
    rng = np.random.default_rng(0)
    w_val = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    a_val = rng.standard_normal((d, d)).astype(np.float32)

    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, shape=(d, d), name="a")
        w = af.constant(w_val, name="w")
        heads = []
        for _ in range(2):
            h = a
            for _ in range(k):
                h = af.py_func(_matmul, [h, w], af.float32, expensive=True)
            heads.append(h)

    def plain_chain() -> Any:
        h = a_val
        for _ in range(k):
            h = _matmul(h, w_val)
        return h

    def plain_serial() -> None:
        plain_chain()
        plain_chain()

    pool = concurrent.futures.ThreadPoolExecutor(2)

    def plain_threads() -> None:
        for f in [pool.submit(plain_chain), pool.submit(plain_chain)]:
            f.result()

    expected = plain_chain()

    cores_used: dict[str, float] = {}

    def note_cores(key: str, wall: float, cpu: float) -> float:
        # CPU seconds per wall second of the best repeat: how many cores the process
        # really got.  Below ~1.6 with two threads means a busy machine (or a
        # serialised executor, if the plain-threads anchor did get two cores).
        if wall <= min(times[key], default=float("inf")):
            cores_used[key] = cpu / wall
        return wall

    def cpu_timed(key: str, fn: Callable[[], object]) -> float:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        return note_cores(key, time.perf_counter() - t0, time.process_time() - c0)

    async def acpu_timed(key: str, fn: Callable[[], Awaitable[object]]) -> float:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        await fn()
        return note_cores(key, time.perf_counter() - t0, time.process_time() - c0)

    times: dict[str, list[float]] = {"1": [], "2": [], "0": [], "serial": [], "threads": []}

    async def main() -> None:
        configs = {key: af.SessionConfig(inter_op_parallelism_threads=int(key))
                   for key in ("1", "2", "0")}
        async with (af.Session(graph=g, config=configs["1"]) as s1,
                    af.Session(graph=g, config=configs["2"]) as s2,
                    af.Session(graph=g, config=configs["0"]) as s0):
            sessions = {"1": s1, "2": s2, "0": s0}
            for sess in sessions.values():
                out = await sess.run(heads, feed_dict={a: a_val})
                _check(all(np.allclose(o, expected, rtol=1e-4, atol=1e-4) for o in out),
                       "parallel graph computed a wrong product")
            plain_threads()
            for _ in range(s.slow_repeats):
                times["serial"].append(cpu_timed("serial", plain_serial))
                times["threads"].append(cpu_timed("threads", plain_threads))
                for key, sess in sessions.items():
                    times[key].append(await acpu_timed(
                        key, lambda sess=sess: sess.run(heads, feed_dict={a: a_val})))

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    best = {key: min(v) for key, v in times.items()}
    row = rows["parallel"]
    row.ours = best["1"] / best["2"]
    row.anchor = best["serial"] / best["threads"]
    row.notes.append(
        f"best step: 1 thread {best['1'] * 1e3:.1f} ms, 2 threads {best['2'] * 1e3:.1f} ms, "
        f"default config (0 = one per core) {best['0'] * 1e3:.1f} ms "
        f"(speedup {best['1'] / best['0']:.2f}); plain numpy serial "
        f"{best['serial'] * 1e3:.1f} ms")
    row.notes.append(
        f"cores busy (process CPU s / wall s) in those steps: asyncflow 1 thread "
        f"{cores_used['1']:.2f}, 2 threads {cores_used['2']:.2f}; plain threads "
        f"{cores_used['threads']:.2f}")


# --------------------------------------------------------------------------- scale


def scale(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    from benchmarks.external import run_child

    del af  # measured in a clean subprocess
    result = run_child(["benchmarks.scale", "asyncflow", str(s.scale_n)], timeout=600)
    if "_error" in result:
        raise RuntimeError(f"scale subprocess failed: {result['_error']}")
    floor = _numpy_chain(s.scale_n)
    floor_us = min(timed(floor) for _ in range(s.repeats)) / s.scale_n * 1e6
    for key in ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"):
        rows[key].ours = result[key]
    rows["scale.first_run"].anchor = rows["scale.second_run"].anchor = floor_us
    rows["scale.peak_rss"].anchor = result["baseline_rss_mb"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


WORKLOAD_FUNCS: dict[str, Callable[[Af, Sizes, dict[str, Row]], None]] = {
    "chain": chain,
    "wide": wide,
    "tiny": tiny,
    "overlap": overlap,
    "parallel": parallel,
    "scale": scale,
}

ROWS_OF: dict[str, tuple[str, ...]] = {
    "chain": ("chain",),
    "wide": ("wide",),
    "tiny": ("tiny.run", "tiny.run_sync"),
    "overlap": ("overlap",),
    "parallel": ("parallel",),
    "scale": ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"),
}
