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
import contextlib
import functools
import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.optimizer import OPT_ROWS_OF, OPT_WORKLOADS, opt_rows
from benchmarks.report import Row, Target, TfTarget
from benchmarks.sizes import Sizes, clock, timed

Af = Any  # the asyncflow module, imported lazily so a broken build fails one row

#: The xdev workloads' chains change device every k nodes (one row per k).
XDEV_KS = (1, 100)

#: The targets against TensorFlow 1.x, by row: judged when TF's column is
#: filled in the same run ("no TF" otherwise).  Its targets against in-process anchors
#: (trace's slowdown, concurrent tiny runs, the service) are the rows' own targets.
TF_TARGETS: dict[str, TfTarget] = {
    "chain": TfTarget("<=", 1.0),
    "wide": TfTarget("<=", 1.5),
    "xdev.k1": TfTarget("<=", 1.0),
    "tiny.run": TfTarget(">=", 30.0, faster=True),
    "loop": TfTarget("<=", 1.0),
    "loop.cond": TfTarget("<=", 1.5),
    "queue": TfTarget(">=", 5.0),
    "scale.build": TfTarget(">=", 50.0, faster=True),
    "scale.first_run": TfTarget(">=", 8.0, faster=True),
}


def make_rows(s: Sizes) -> dict[str, Row]:
    """Every row of the table, keyed by id, before anything is measured."""
    rows = [
        Row(
            "chain",
            f"{s.chain_n:,} chained adds",
            "us/node",
            "np.add loop over np.float32 scalars (the numpy floor)",
            Target("<=", 2.0, relative=True),
        ),
        *(
            Row(
                f"xdev.k{k}",
                f"{s.chain_n:,} adds, 2dev, k={k}",
                "us/op",
                f"the same chain on one device, us/op, interleaved with the 2-device "
                f"runs (xdev.k{k})",
            )
            for k in XDEV_KS
        ),
        Row(
            "wide",
            f"{s.wide_n:,} adds + add_n",
            "us/node",
            "list of np.add on np.float32 scalars + np.sum",
            Target("<=", 2.5),
        ),
        Row(
            "tiny.run",
            "await sess.run (3 ops)",
            "us/run",
            "await of a coroutine doing the same numpy ops",
            Target("<=", 20.0),
        ),
        Row(
            "concurrent",
            f"gather of {s.concurrent_runs:,} tiny runs",
            "runs/s",
            f"asyncio.gather of {s.concurrent_runs:,} coroutines doing the same numpy ops",
            Target(">=", 0.5, relative=True),
            better="higher",
        ),
        Row(
            "tiny.run_sync", "sess.run_sync (3 ops)", "us/run", "asyncio.run of an empty coroutine"
        ),
        Row(
            "tiny.run_sync.async",
            "run_sync, 1 async py_func",
            "us/run",
            "asyncio.run(sess.run(...)) of the same graph (a fresh loop per call)",
            Target("<=", 1 / 3, relative=True),
        ),
        Row(
            "callable",
            "make_callable (3 ops)",
            "us/call",
            "await sess.run of the same graph, fetch and feed (tiny.run's call)",
        ),
        Row(
            "callable.nested",
            "nested fetches, 2 feeds",
            "us/call",
            "await sess.run of the same nested fetches and 2-entry feed_dict",
        ),
        Row(
            "trace",
            f"{s.chain_n:,} adds, FULL_TRACE",
            "us/node",
            "the same chain untraced (sess.run(y, feed)), same session",
            Target("<=", 4.0, relative=True),
        ),
        Row(
            "trace.off",
            f"{s.chain_n:,} adds, trace off",
            "us/node",
            "sess.run(y, feed) without options / run_metadata, same session",
        ),
        Row(
            "overlap",
            f"{s.overlap_layers}x{s.overlap_width} async kernels",
            "total/cp",
            "asyncio.gather of each layer's coroutines, layer after layer",
            Target("<=", 1.1, anchor_must_meet=True),
        ),
        Row(
            "parallel",
            f"2x{s.matmul_chain} matmul {s.matmul_dim}^2",
            "speedup",
            "the two chains on a 2-thread executor vs one after the other",
            Target(">=", 1.6, anchor_must_meet=True),
            better="higher",
        ),
        Row(
            "parallel.2dev",
            f"2x{s.matmul_chain} matmul, 2dev x 1thr",
            "speedup",
            "the two chains on a 2-thread executor vs one after the other",
            better="higher",
        ),
        Row(
            "loop",
            f"{s.loop_n:,}-iter while_loop",
            "us/iter",
            "Python while loop: np.less, np.add on np.int32 / np.float32 scalars",
        ),
        Row(
            "loop.cond",
            f"{s.loop_cond_n:,} iters, cond body",
            "us/iter",
            "the same Python loop with np.mod, np.equal and an if/else add/subtract",
        ),
        Row(
            "queue",
            f"{s.queue_n:,} el, {s.queue_producers}+{s.queue_consumers} tasks",
            "el/s",
            f"asyncio.Queue({s.queue_capacity}), the same producer / consumer tasks",
            better="higher",
        ),
        Row(
            "variable",
            f"assign_add, {s.variable_tasks} tasks",
            "steps/s",
            f"{s.variable_tasks} tasks: int += 1, then await asyncio.sleep(0)",
            better="higher",
        ),
        Row(
            "cnn",
            f"CNN, {s.cnn_batch}x{s.cnn_image}x{s.cnn_image}x3",
            "ms/batch",
            "numpy calls of the same layers (the kernels without the runtime)",
        ),
        Row("scale.build", f"build {s.scale_n:,} nodes", "us/node", "", Target("<=", 10.0)),
        Row(
            "scale.first_run",
            "first run (compiles)",
            "us/node",
            "np.add loop (numpy floor) at the same length",
            Target("<=", 20.0),
        ),
        Row(
            "scale.second_run",
            "second run (cached)",
            "us/node",
            "np.add loop (numpy floor) at the same length",
        ),
        Row("scale.peak_rss", "peak RSS - RSS after imports", "MB", "", Target("<=", 400.0)),
        Row(
            "scale.cond.second_run",
            f"{s.scale_n:,} chain + one cond, run",
            "us/node",
            "the same chain without the cond (its own subprocess)",
            Target("<=", 1.2, relative=True),
        ),
        Row(
            "scale.cond.peak_rss",
            f"{s.scale_n:,} chain + one cond, RSS",
            "MB",
            "the same chain without the cond (peak RSS)",
            Target("<=", 1.2, relative=True),
        ),
        *opt_rows(s),
        Row(
            "service.cpu",
            f"ASGI, c={s.service_concurrency}, sess.run",
            "us/req",
            "the same app's asyncio.gather endpoint (same coroutines)",
            Target("<=", 1.2, relative=True),
        ),
        Row(
            "service.p50",
            "ASGI, p50 latency",
            "ms",
            "the same app's asyncio.gather endpoint (same coroutines)",
        ),
        Row(
            "service.p99",
            "ASGI, p99 latency",
            "ms",
            "the same app's asyncio.gather endpoint (same coroutines)",
            Target("<=", 1.5, relative=True),
        ),
    ]
    for row in rows:
        row.tf_target = TF_TARGETS.get(row.id)
    return {r.id: r for r in rows}


async def _atimed(fn: Callable[[], Awaitable[object]]) -> float:
    gc.collect()
    start = clock()
    await fn()
    return clock() - start


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
    rows["chain"].record(ours, anchor, per=lambda t: t / n * 1e6)


# --------------------------------------------------------------------------- xdev


def _xdev_chain_graph(af: Af, n: int, k: int) -> tuple[Any, Any, Any, int]:
    """The chain workload's graph on two devices, switching device every ``k`` adds.

    Each device has its own constant ``one``, and the placeholder is fed to the
    first add, on /cpu:0 with the client (as TF places feeds and fetches), so the
    cross-device edges are the chain's own device changes, and the fetch's way back
    to /cpu:0 when the chain ends on /cpu:1 (one more, as in TF's partition graphs):
    returned as the 4th item.
    """
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        ones = []
        for d in range(2):
            with af.device(f"/cpu:{d}"):
                ones.append(af.constant(np.float32(1.0), name=f"one{d}"))
        x = x0
        for i in range(n):
            d = (i // k) % 2
            with af.device(f"/cpu:{d}"):
                x = x + ones[d]
    edges = sum(1 for i in range(1, n) if (i // k) % 2 != ((i - 1) // k) % 2)
    return g, x0, x, edges + ((n - 1) // k) % 2


async def _send_ops(af: Af, sess: Any, fetch: Any, feed: dict[Any, Any]) -> int:
    """How many ``_Send`` ops the run's partition graphs hold (its cross-device edges)."""
    md = af.RunMetadata()
    await sess.run(
        fetch, feed_dict=feed, options=af.RunOptions(output_partition_graphs=True), run_metadata=md
    )
    return sum(node["op"] == "_Send" for pg in md.partition_graphs for node in pg["node"])


def xdev(k: int) -> Callable[[Af, Sizes, dict[str, Row]], None]:
    """The ``xdev.k{k}`` workload: the scalar chain switching device every ``k`` adds,
    in us per op, beside the same chain on one device.

    The two chains run interleaved, repeat by repeat in one event loop, so a noisy
    neighbour hits both; each figure is the best repeat (medians in the notes).  The
    cost of one edge is derived in a note only, from the paired repeats: it is a
    difference of two timings and never the row's figure.
    """

    def workload(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
        n = s.chain_n
        g1, x1, y1 = _chain_graph(af, n)
        g2, x2, y2, edges = _xdev_chain_graph(af, n, k)
        two = af.SessionConfig(device_count={"CPU": 2})

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g1) as one_dev, af.Session(graph=g2, config=two) as two_dev:
                for sess, x, y in ((one_dev, x1, y1), (two_dev, x2, y2)):
                    value = await sess.run(y, feed_dict={x: 0.0})
                    _check(value == n, f"xdev chain computed {value!r}, expected {n}")
                sends = await _send_ops(af, two_dev, y2, {x2: 0.0})
                _check(
                    sends == edges,
                    f"the 2-device chain has {sends} _Send ops, "
                    f"expected {edges} cross-device edges",
                )
                two_times, one_times = [], []
                for _ in range(s.repeats):
                    one_times.append(await _atimed(lambda: one_dev.run(y1, feed_dict={x1: 0.0})))
                    two_times.append(await _atimed(lambda: two_dev.run(y2, feed_dict={x2: 0.0})))
                return two_times, one_times

        two_times, one_times = asyncio.run(main())
        row = rows[f"xdev.k{k}"]
        row.ours, row.anchor = min(two_times) / n * 1e6, min(one_times) / n * 1e6
        row.notes.append(xdev_note(n, edges, two_times, one_times))

    workload.__name__ = f"xdev_k{k}"
    return workload


def xdev_note(
    n: int, edges: int, two_times: list[float], one_times: list[float], who: str = ""
) -> str:
    """The xdev row's note: medians, and the per-edge cost derived from paired repeats
    (shared with TF's anchor, which is measured the same way)."""
    from statistics import median

    per_edge = median(t2 - t1 for t2, t1 in zip(two_times, one_times, strict=True))
    return (
        f"{who}median {median(two_times) / n * 1e6:.2f} us/op on 2 devices, "
        f"{median(one_times) / n * 1e6:.2f} on 1 device (best "
        f"{min(two_times) / n * 1e6:.2f} / {min(one_times) / n * 1e6:.2f}); derived: "
        f"{per_edge / max(edges, 1) * 1e6:.2f} us per send/recv edge (median over the "
        f"{len(two_times)} paired repeats of (2-device run - 1-device run) / {edges:,} "
        f"edges)"
    )


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

    # Optimizer off (as TF's anchor): CSE would merge the n identical adds into one.
    config = af.SessionConfig(
        graph_options=af.GraphOptions(
            optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
        )
    )

    async def main() -> tuple[list[float], list[float], int | None]:
        async with af.Session(graph=g, config=config) as sess:
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
    row.record(ours, anchor, per=lambda t: t / n * 1e6)
    if executed is not None:
        row.notes.append(f"a traced run executed {executed:,} nodes for {n:,} adds")
        if executed < n:
            row.notes.append(
                "WARNING: the optimizer merged the identical adds (CSE); "
                "the figure is not the cost of n executed nodes"
            )


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
    rows["tiny.run"].record(ours, anchor, per=lambda t: t / calls * 1e6)

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
    row.record(ours, anchor, per=lambda t: t / sync_calls * 1e6)
    if row.ours is not None and row.anchor is not None and row.ours < row.anchor:
        row.notes.append(
            "faster than asyncio.run itself: run_sync of a plan made only of "
            "inline kernels never creates an event loop"
        )

    # run_sync of a plan that needs a loop: the session's loop for this thread, kept
    # across calls, against a fresh loop per call.
    ga = af.Graph()
    with ga.as_default():
        xa = af.placeholder(af.float32, shape=(), name="x")

        async def echo(v: Any) -> Any:
            return v

        ya = af.py_func(echo, [xa], af.float32)
    with af.Session(graph=ga) as sess:
        _check(sess.run_sync(ya, feed_dict={xa: 1.0}) == 1.0, "async tiny graph: wrong value")

        def ours_async() -> None:
            for _ in range(sync_calls):
                sess.run_sync(ya, feed_dict={xa: 1.0})

        def anchor_async() -> None:
            for _ in range(sync_calls):
                asyncio.run(sess.run(ya, feed_dict={xa: 1.0}))

        ours, anchor = [], []
        for _ in range(s.repeats):
            anchor.append(timed(anchor_async))
            ours.append(timed(ours_async))
    rows["tiny.run_sync.async"].record(ours, anchor, per=lambda t: t / sync_calls * 1e6)


# --------------------------------------------------------------------------- concurrent


def concurrent_runs(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """``asyncio.gather`` of ``concurrent_runs`` ``await sess.run(...)`` of the tiny
    graph against ``asyncio.gather`` of as many coroutines doing the same numpy ops:
    runs per second of each (``concurrent_batches`` gathers per timed repeat)."""
    g, x, y = _tiny_graph(af)
    runs, batches = s.concurrent_runs, s.concurrent_batches
    one, two = np.float32(1.0), np.float32(2.0)

    async def plain(v: Any) -> Any:
        return np.multiply(np.add(v, one), two)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x: 1.0})
            _check(value == 4.0, f"tiny graph computed {value!r}, expected 4.0")
            results: dict[str, list[Any]] = {}

            async def ours_batches() -> None:
                for _ in range(batches):
                    results["ours"] = await asyncio.gather(
                        *(sess.run(y, feed_dict={x: 1.0}) for _ in range(runs))
                    )

            async def anchor_batches() -> None:
                v = np.float32(1.0)
                for _ in range(batches):
                    results["anchor"] = await asyncio.gather(*(plain(v) for _ in range(runs)))

            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await _atimed(anchor_batches))
                ours.append(await _atimed(ours_batches))
                for key, got in results.items():
                    _check(
                        len(got) == runs and all(v == 4.0 for v in got),
                        f"concurrent ({key}): {len(got)} results, not {runs} times 4.0",
                    )
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["concurrent"]
    row.record(ours, anchor, per=lambda t: runs * batches / t)
    assert row.ours is not None
    assert row.anchor is not None
    row.notes.append(
        f"{batches} x asyncio.gather of {runs:,} `await sess.run(y, feed_dict={{x: 1.0}})` "
        f"per repeat (one session); {1e6 / row.ours:.2f} us per run vs "
        f"{1e6 / row.anchor:.2f} us per gathered coroutine"
    )


# --------------------------------------------------------------------------- callable


def _nested_graph(af: Af) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(graph, x, w, fetches): tiny's ``y = (x + 1) * 2`` and ``z = y * w``, fetched as
    ``{"a": [y, z], "b": (y,)}``: a nested structure, two feeds."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        w = af.placeholder(af.float32, shape=(), name="w")
        y = af.multiply(af.add(x, 1.0), 2.0)
        z = af.multiply(y, w)
    return g, x, w, {"a": [y, z], "b": (y,)}


def _shape_of(value: Any) -> Any:
    """A fetch result's structure: its containers' types, leaves as None."""
    if isinstance(value, dict):
        return dict, {k: _shape_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value), [_shape_of(v) for v in value]
    return None


def callable_(nested: bool) -> Callable[[Af, Sizes, dict[str, Row]], None]:
    """The ``callable`` / ``callable.nested`` workload: ``await fn(*values)`` of
    ``sess.make_callable(fetches, feed_list)`` against ``await sess.run(fetches,
    feed_dict)`` of the same fetches and feeds, repeats interleaved."""
    row_id = "callable.nested" if nested else "callable"

    def workload(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
        calls = s.tiny_calls
        values: tuple[float, ...]
        if nested:
            g, x, w, fetches = _nested_graph(af)
            feed_list, values = [x, w], (1.0, 3.0)
            expected: Any = {"a": [4.0, 12.0], "b": (4.0,)}
        else:
            g, x, fetches = _tiny_graph(af)
            feed_list, values = [x], (1.0,)
            expected = 4.0
        feed = dict(zip(feed_list, values))

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g) as sess:
                fn = sess.make_callable(fetches, feed_list=feed_list)
                for got in (await sess.run(fetches, feed_dict=feed), await fn(*values)):
                    _check(
                        got == expected and _shape_of(got) == _shape_of(expected),
                        f"{row_id} computed {got!r}, expected {expected!r}",
                    )

                async def run_calls() -> None:
                    for _ in range(calls):
                        await sess.run(fetches, feed_dict=feed)

                async def callable_calls() -> None:
                    for _ in range(calls):
                        await fn(*values)

                ours, anchor = [], []
                for _ in range(s.repeats):
                    anchor.append(await _atimed(run_calls))
                    ours.append(await _atimed(callable_calls))
                return ours, anchor

        ours, anchor = asyncio.run(main())
        row = rows[row_id]
        row.record(ours, anchor, per=lambda t: t / calls * 1e6)
        assert row.ours is not None
        assert row.anchor is not None
        what = (
            "fetches {'a': [y, z], 'b': (y,)}, feeds x=1.0, w=3.0"
            if nested
            else "tiny.run's graph, fetch y, feed x=1.0"
        )
        row.notes.append(
            f"{what} (Python floats, converted on every call by both); best of "
            f"{s.repeats} x {calls:,} calls each; the callable saves "
            f"{row.anchor - row.ours:.2f} us per call"
        )

    workload.__name__ = row_id.replace(".", "_")
    return workload


# --------------------------------------------------------------------------- trace


def _read_node_stats(md: Any) -> list[int]:
    return [len(d.node_stats) for d in md.step_stats.dev_stats]


def trace(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The chain workload traced (``RunOptions(trace_level=FULL_TRACE)`` with a
    ``RunMetadata``) against the same chain untraced, in the same session."""
    n = s.chain_n
    g, x0, y = _chain_graph(af, n)
    feed = {x0: 0.0}
    full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)

    async def main() -> tuple[list[float], list[float], int, float]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict=feed)
            _check(value == n, f"chain computed {value!r}, expected {n}")
            md = af.RunMetadata()
            value = await sess.run(y, feed_dict=feed, options=full, run_metadata=md)
            _check(value == n, f"traced chain computed {value!r}, expected {n}")
            recorded = sum(len(d.node_stats) for d in md.step_stats.dev_stats)
            _check(recorded >= n, f"a traced run of {n:,} adds recorded {recorded} node stats")
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await _atimed(lambda: sess.run(y, feed_dict=feed)))
                ours.append(
                    await _atimed(
                        lambda: sess.run(
                            y, feed_dict=feed, options=full, run_metadata=af.RunMetadata()
                        )
                    )
                )
            # Reading the stats makes the NodeExecStats (lazily, once): timed apart.
            reads = []
            for _ in range(s.repeats):
                md = af.RunMetadata()
                await sess.run(y, feed_dict=feed, options=full, run_metadata=md)
                reads.append(timed(functools.partial(_read_node_stats, md)))
            return ours, anchor, recorded, min(reads)

    ours, anchor, recorded, read = asyncio.run(main())
    row = rows["trace"]
    row.record(ours, anchor, per=lambda t: t / n * 1e6)
    row.notes.append(
        f"reading the stats of a traced run (md.step_stats...node_stats, made on first "
        f"read) costs another {read / n * 1e6:.2f} us/node, not in this row: a traced "
        f"run whose stats are read costs {(min(ours) + read) / n * 1e6:.2f} us/node "
        f"({(min(ours) + read) / min(anchor):.1f}x the untraced run)"
    )
    row.notes.append(
        f"traced: sess.run(y, feed, options=RunOptions(trace_level=FULL_TRACE), "
        f"run_metadata=RunMetadata()) (a fresh RunMetadata each run; {recorded:,} node "
        f"stats recorded; no Chrome timeline built) vs untraced sess.run(y, feed); "
        f"ours/anc = the traced slowdown"
    )
    row.notes.append(
        "both runs take the synchronous fast path and replay the plan's static "
        "schedule (traced: with the traced kernels, one clock read per node; the "
        "node stats are made when step_stats is read: see the next note)"
    )


def trace_off(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """What tracing costs when it is off: the chain run with ``options=RunOptions()``
    (trace_level NO_TRACE) and ``run_metadata=None`` against plain ``sess.run(y,
    feed)``.  Also timed, for the notes: NO_TRACE with a RunMetadata passed."""
    n = s.chain_n
    g, x0, y = _chain_graph(af, n)
    feed = {x0: 0.0}
    off = af.RunOptions()

    async def main() -> dict[str, list[float]]:
        async with af.Session(graph=g) as sess:
            for kw in (
                {},
                {"options": off, "run_metadata": None},
                {"options": off, "run_metadata": af.RunMetadata()},
            ):
                value = await sess.run(y, feed_dict=feed, **kw)
                _check(value == n, f"chain computed {value!r}, expected {n}")
            times: dict[str, list[float]] = {"plain": [], "off": [], "off_md": []}
            for _ in range(s.repeats):
                times["plain"].append(await _atimed(lambda: sess.run(y, feed_dict=feed)))
                times["off"].append(
                    await _atimed(
                        lambda: sess.run(y, feed_dict=feed, options=off, run_metadata=None)
                    )
                )
                times["off_md"].append(
                    await _atimed(
                        lambda: sess.run(
                            y, feed_dict=feed, options=off, run_metadata=af.RunMetadata()
                        )
                    )
                )
            return times

    times = asyncio.run(main())
    best = {key: min(v) / n * 1e6 for key, v in times.items()}
    row = rows["trace.off"]
    row.record(times["off"], times["plain"], per=lambda t: t / n * 1e6)
    row.notes.append(
        f"sess.run(y, feed, options=RunOptions(), run_metadata=None) vs sess.run(y, feed), "
        f"interleaved in one session: ours/anc ~1.00x means tracing off costs nothing; "
        f"also timed: RunOptions() with a RunMetadata {best['off_md']:.3f} us/node "
        f"({best['off_md'] / best['plain']:.2f}x)"
    )
    chain_row = rows.get("chain")
    if chain_row is not None and chain_row.ours is not None:
        row.notes.append(
            f"the chain row, measured earlier in this process (its own session): "
            f"{chain_row.ours:.3f} us/node; this row's untraced anchor is "
            f"{best['plain'] / chain_row.ours:.2f}x that"
        )


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
            v = np.sum(await asyncio.gather(*(sleeper(v) for _ in range(width))), dtype=np.float32)
        return v

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(b, feed_dict={x: 0.0})
            _check(
                bool(np.isclose(value, expected, rtol=1e-5)),
                f"overlap graph computed {value!r}, expected {expected!r}",
            )
            ours, anchor = [], []
            for _ in range(s.slow_repeats):
                anchor.append(await _atimed(plain))
                ours.append(await _atimed(lambda: sess.run(b, feed_dict={x: 0.0})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["overlap"]
    row.record(ours, anchor, per=lambda t: t / critical_path)
    row.notes.append(
        f"critical path {critical_path * 1e3:.0f} ms; asyncflow's best step "
        f"{min(ours) * 1e3:.1f} ms"
    )


# --------------------------------------------------------------------------- parallel


def _matmul(a: Any, w: Any) -> Any:
    return np.matmul(a, w)


def _matmul_operands(d: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    w_val = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    a_val = rng.standard_normal((d, d)).astype(np.float32)
    return w_val, a_val


def _matmul_graph(af: Af, w_val: Any, k: int, two_devices: bool) -> tuple[Any, Any, list[Any]]:
    """(graph, placeholder a, heads) of two independent chains of ``k`` expensive
    matmuls; with ``two_devices`` chain c (and its own copy of w) is on /cpu:c."""
    d = w_val.shape[0]
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, shape=(d, d), name="a")
        w = None if two_devices else af.constant(w_val, name="w")
        heads = []
        for c in range(2):
            with af.device(f"/cpu:{c}") if two_devices else contextlib.nullcontext():
                wc = af.constant(w_val, name=f"w{c}") if w is None else w
                h = a
                for _ in range(k):
                    h = af.py_func(_matmul, [h, wc], af.float32, expensive=True)
                heads.append(h)
    return g, a, heads


class _CoresTimer:
    """Wall times per key and, for each key's best repeat, the cores the process got
    (process CPU seconds per wall second).  Below ~1.6 with two threads means a busy
    machine (or a serialised executor, if the plain-threads anchor did get two cores)."""

    def __init__(self, *keys: str) -> None:
        self.times: dict[str, list[float]] = {key: [] for key in keys}
        self.cores: dict[str, float] = {}

    def _note(self, key: str, wall: float, cpu: float) -> None:
        if wall <= min(self.times[key], default=float("inf")):
            self.cores[key] = cpu / wall
        self.times[key].append(wall)

    def run(self, key: str, fn: Callable[[], object]) -> None:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        self._note(key, time.perf_counter() - t0, time.process_time() - c0)

    async def arun(self, key: str, fn: Callable[[], Awaitable[object]]) -> None:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        await fn()
        self._note(key, time.perf_counter() - t0, time.process_time() - c0)

    def best(self) -> dict[str, float]:
        return {key: min(v) for key, v in self.times.items()}

    def median(self) -> dict[str, float]:
        return {key: statistics.median(v) for key, v in self.times.items()}


def _record_speedups(
    row: Row, timer: _CoresTimer, ours: tuple[str, str], anchor: tuple[str, str]
) -> None:
    """A speedup row: the best time of ``ours[0]`` over the best of ``ours[1]`` (the
    anchor likewise), and the same ratio of the medians."""
    best, median = timer.best(), timer.median()
    row.ours, row.ours_median = best[ours[0]] / best[ours[1]], median[ours[0]] / median[ours[1]]
    row.anchor = best[anchor[0]] / best[anchor[1]]
    row.anchor_median = median[anchor[0]] / median[anchor[1]]
    row.repeats = len(timer.times[ours[0]])


def _plain_chains(
    w_val: Any, a_val: Any, k: int, pool: concurrent.futures.ThreadPoolExecutor
) -> dict[str, Callable[[], object]]:
    """The numpy anchor: both chains one after the other, and on two threads."""

    def plain_chain() -> Any:
        h = a_val
        for _ in range(k):
            h = _matmul(h, w_val)
        return h

    def plain_serial() -> None:
        plain_chain()
        plain_chain()

    def plain_threads() -> None:
        for f in [pool.submit(plain_chain), pool.submit(plain_chain)]:
            f.result()

    return {"chain": plain_chain, "serial": plain_serial, "threads": plain_threads}


async def _time_sessions(
    timer: _CoresTimer,
    sessions: dict[str, Any],
    plain: dict[str, Any],
    heads: dict[str, tuple[Any, Any]],
    a_val: Any,
    repeats: int,
) -> None:
    """Check every session's result, then alternate the anchor and the sessions
    repeat by repeat.  ``heads`` maps a session's key to its (placeholder, fetches)."""
    expected = plain["chain"]()
    for key, sess in sessions.items():
        a, fetches = heads[key]
        out = await sess.run(fetches, feed_dict={a: a_val})
        _check(
            all(np.allclose(o, expected, rtol=1e-4, atol=1e-4) for o in out),
            f"parallel graph ({key}) computed a wrong product",
        )
    plain["threads"]()
    for _ in range(repeats):
        timer.run("serial", plain["serial"])
        timer.run("threads", plain["threads"])
        for key, sess in sessions.items():
            a, fetches = heads[key]
            await timer.arun(key, functools.partial(sess.run, fetches, feed_dict={a: a_val}))


def parallel(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    k = s.matmul_chain
    w_val, a_val = _matmul_operands(s.matmul_dim)
    g, a, heads = _matmul_graph(af, w_val, k, two_devices=False)
    timer = _CoresTimer("1", "2", "0", "serial", "threads")
    pool = concurrent.futures.ThreadPoolExecutor(2)

    async def main() -> None:
        configs = {
            key: af.SessionConfig(inter_op_parallelism_threads=int(key)) for key in ("1", "2", "0")
        }
        async with (
            af.Session(graph=g, config=configs["1"]) as s1,
            af.Session(graph=g, config=configs["2"]) as s2,
            af.Session(graph=g, config=configs["0"]) as s0,
        ):
            sessions = {"1": s1, "2": s2, "0": s0}
            await _time_sessions(
                timer,
                sessions,
                _plain_chains(w_val, a_val, k, pool),
                dict.fromkeys(sessions, (a, heads)),
                a_val,
                s.slow_repeats,
            )

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    best, cores_used = timer.best(), timer.cores
    row = rows["parallel"]
    _record_speedups(row, timer, ("1", "2"), ("serial", "threads"))
    row.notes.append(
        f"best step: 1 thread {best['1'] * 1e3:.1f} ms, 2 threads {best['2'] * 1e3:.1f} ms, "
        f"default config (0 = one per core) {best['0'] * 1e3:.1f} ms "
        f"(speedup {best['1'] / best['0']:.2f}); plain numpy serial "
        f"{best['serial'] * 1e3:.1f} ms"
    )
    row.notes.append(
        f"cores busy (process CPU s / wall s) in those steps: asyncflow 1 thread "
        f"{cores_used['1']:.2f}, 2 threads {cores_used['2']:.2f}; plain threads "
        f"{cores_used['threads']:.2f}"
    )


def parallel_2dev(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The parallel workload's chains on /cpu:0 and /cpu:1, one thread per device,
    against the same graph on one device with one thread."""
    k = s.matmul_chain
    w_val, a_val = _matmul_operands(s.matmul_dim)
    g1, a1, heads1 = _matmul_graph(af, w_val, k, two_devices=False)
    g2, a2, heads2 = _matmul_graph(af, w_val, k, two_devices=True)
    timer = _CoresTimer("1dev", "2dev", "serial", "threads")
    pool = concurrent.futures.ThreadPoolExecutor(2)

    async def main() -> None:
        one = af.SessionConfig(inter_op_parallelism_threads=1)
        two = af.SessionConfig(device_count={"CPU": 2}, inter_op_parallelism_threads=1)
        async with af.Session(graph=g1, config=one) as s1, af.Session(graph=g2, config=two) as s2:
            # The feed a crosses to /cpu:1's chain and that chain's head back to the
            # client on /cpu:0, as TF places feeds and fetches.
            sends = await _send_ops(af, s2, heads2, {a2: a_val})
            _check(sends == 2, f"the 2-device matmul graph has {sends} _Send ops, expected 2")
            await _time_sessions(
                timer,
                {"1dev": s1, "2dev": s2},
                _plain_chains(w_val, a_val, k, pool),
                {"1dev": (a1, heads1), "2dev": (a2, heads2)},
                a_val,
                s.slow_repeats,
            )

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    best, cores_used = timer.best(), timer.cores
    row = rows["parallel.2dev"]
    _record_speedups(row, timer, ("1dev", "2dev"), ("serial", "threads"))
    row.notes.append(
        f"best step: 1 device x 1 thread {best['1dev'] * 1e3:.1f} ms, 2 devices x 1 thread "
        f"{best['2dev'] * 1e3:.1f} ms; plain numpy serial {best['serial'] * 1e3:.1f} ms; "
        f"no target given: >= 1.6 is what the single-device parallel target asks"
    )
    row.notes.append(
        f"cores busy (process CPU s / wall s) in those steps: asyncflow 1 device "
        f"{cores_used['1dev']:.2f}, 2 devices {cores_used['2dev']:.2f}; plain threads "
        f"{cores_used['threads']:.2f}"
    )


# --------------------------------------------------------------------------- loop


def _loop_body(af: Af, with_cond: bool) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The while_loop's body: ``i + 1`` and ``s + 1.0`` (with ``with_cond``:
    ``s + 1.0`` if ``i`` is even else ``s - 1.0``, through an ``af.cond``)."""

    def body(i: Any, acc: Any) -> tuple[Any, Any]:
        if not with_cond:
            return i + 1, acc + 1.0
        even = af.equal(i % 2, 0)
        return i + 1, af.cond(even, lambda: acc + 1.0, lambda: acc - 1.0)

    return body


def _loop_graph(af: Af, with_cond: bool, parallel_iterations: int) -> tuple[Any, Any, Any]:
    """(graph, placeholder n, fetches (i, s)) of ``while i < n``; n is fed, so that a
    short run compiles the plan without paying for a long loop."""
    g = af.Graph()
    with g.as_default():
        n = af.placeholder(af.int32, shape=(), name="n")
        fetches = af.while_loop(
            lambda i, acc: i < n,
            _loop_body(af, with_cond),
            (af.constant(0), af.constant(np.float32(0.0))),
            parallel_iterations=parallel_iterations,
        )
    return g, n, fetches


def _loop_expected(n: int, with_cond: bool) -> tuple[int, float]:
    return n, float(n % 2 if with_cond else n)


def _python_loop(n: int, with_cond: bool) -> Callable[[], tuple[Any, Any]]:
    """The anchor: the loop written as a plain Python ``while`` on numpy scalars."""
    limit, one_i, two_i, zero_i = np.int32(n), np.int32(1), np.int32(2), np.int32(0)
    one_f = np.float32(1.0)

    def run() -> tuple[Any, Any]:
        i, acc = np.int32(0), np.float32(0.0)
        while np.less(i, limit):
            if with_cond:
                if np.equal(np.mod(i, two_i), zero_i):
                    acc = np.add(acc, one_f)
                else:
                    acc = np.subtract(acc, one_f)
            else:
                acc = np.add(acc, one_f)
            i = np.add(i, one_i)
        return i, acc

    return run


def loop(with_cond: bool) -> Callable[[Af, Sizes, dict[str, Row]], None]:
    """The ``loop`` / ``loop.cond`` workload: the executor's cost per while_loop
    iteration (frames, Merge / Switch / NextIteration, dead tensors for the cond)."""
    row_id = "loop.cond" if with_cond else "loop"

    def workload(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
        n = s.loop_cond_n if with_cond else s.loop_n
        pi = s.loop_parallel_iterations
        g, n_ph, fetches = _loop_graph(af, with_cond, pi)
        expected = _loop_expected(n, with_cond)
        plain = _python_loop(n, with_cond)
        anchor_value = plain()
        _check(
            (int(anchor_value[0]), float(anchor_value[1])) == expected,
            f"the Python {row_id} anchor computed {anchor_value!r}, expected {expected!r}",
        )
        short = 100

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g) as sess:
                value = await sess.run(fetches, feed_dict={n_ph: short})  # compiles
                want = _loop_expected(short, with_cond)
                _check(
                    (int(value[0]), float(value[1])) == want,
                    f"{row_id} computed {value!r} for n={short}, expected {want!r}",
                )
                ours, anchor = [], []
                for _ in range(s.repeats):
                    anchor.append(timed(plain))
                    gc.collect()
                    start = clock()
                    value = await sess.run(fetches, feed_dict={n_ph: n})
                    ours.append(clock() - start)
                    _check(
                        (int(value[0]), float(value[1])) == expected,
                        f"{row_id} computed {value!r}, expected {expected!r}",
                    )
                return ours, anchor

        ours, anchor = asyncio.run(main())
        row = rows[row_id]
        row.record(ours, anchor, per=lambda t: t / n * 1e6)
        assert row.ours is not None
        # The nodes an iteration executes, live or dead: every op of the loop frame but
        # its Enters, which run once per loop (the Exits run dead until the last one;
        # the untaken branch of the cond runs dead).
        per_iter = sum(
            1 for op in g.get_operations() if op.name.startswith("while/") and op.type != "Enter"
        )
        row.notes.append(
            f"parallel_iterations={pi}; asyncflow's best run {min(ours):.2f} s; an "
            f"iteration executes {per_iter} nodes, live or dead ({row.ours / per_iter:.2f} "
            f"us per node)"
        )

    workload.__name__ = row_id.replace(".", "_")
    return workload


# --------------------------------------------------------------------------- queue


def _spread(total: int, workers: int) -> list[int]:
    """``total`` split into ``workers`` near-equal shares."""
    return [total // workers + (1 if k < total % workers else 0) for k in range(workers)]


def _check_exactly_once(what: str, received: list[list[int]], total: int) -> None:
    got = sorted(v for part in received for v in part)
    if got != list(range(total)):
        missing = len(set(range(total)) - set(got))
        _check(
            False,
            f"{what}: {len(got):,} elements received for {total:,} sent "
            f"({missing:,} missing, {len(got) - len(set(got)):,} duplicated)",
        )


def queue(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """Elements per second through a FIFOQueue, one element per enqueue step and per
    dequeue step, with producer and consumer tasks running their steps concurrently on
    one loop; the anchor moves the same integers through an ``asyncio.Queue``."""
    total, producers, consumers = s.queue_n, s.queue_producers, s.queue_consumers
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.int32, shape=(), name="x")
        q = af.FIFOQueue(s.queue_capacity, af.int32, shapes=[()])
        enq = q.enqueue(x)
        deq = q.dequeue()
        size = q.size()
    shares = _spread(total, consumers)
    timeout = 60.0  # a lost element must fail the row, not hang it

    async def plain() -> list[list[int]]:
        aq: asyncio.Queue[int] = asyncio.Queue(s.queue_capacity)
        received: list[list[int]] = [[] for _ in range(consumers)]

        async def produce(k: int) -> None:
            for i in range(k, total, producers):
                await aq.put(i)

        async def consume(k: int) -> None:
            out = received[k]
            for _ in range(shares[k]):
                out.append(await aq.get())

        await asyncio.gather(
            *(produce(k) for k in range(producers)), *(consume(k) for k in range(consumers))
        )
        return received

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            await sess.run(enq, feed_dict={x: 7})  # compiles both plans
            value = await sess.run(deq)
            _check(value == 7, f"queue: dequeued {value!r} after enqueueing 7")

            async def ours_steps() -> list[list[int]]:
                received: list[list[int]] = [[] for _ in range(consumers)]

                async def produce(k: int) -> None:
                    for i in range(k, total, producers):
                        await sess.run(enq, feed_dict={x: i})

                async def consume(k: int) -> None:
                    out = received[k]
                    for _ in range(shares[k]):
                        out.append(int(await sess.run(deq)))

                await asyncio.wait_for(
                    asyncio.gather(
                        *(produce(k) for k in range(producers)),
                        *(consume(k) for k in range(consumers)),
                    ),
                    timeout,
                )
                return received

            ours, anchor = [], []
            for _ in range(s.state_repeats):
                gc.collect()
                start = clock()
                received = await plain()
                anchor.append(clock() - start)
                _check_exactly_once("asyncio.Queue anchor", received, total)
                gc.collect()
                start = clock()
                received = await ours_steps()
                ours.append(clock() - start)
                _check_exactly_once("queue", received, total)
                left = await sess.run(size)
                _check(left == 0, f"queue: {left} elements left after the run")
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["queue"]
    row.record(ours, anchor, per=lambda t: total / t)
    assert row.ours is not None
    row.notes.append(
        f"capacity {s.queue_capacity}, {producers} producer + {consumers} consumer tasks; "
        f"every element arrived exactly once; {1e6 / row.ours:.1f} us per element = two "
        f"steps (an enqueue, a dequeue), best run {min(ours):.2f} s"
    )


# --------------------------------------------------------------------------- variable


def variable(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """``assign_add`` steps per second with ``variable_tasks`` tasks each awaiting
    ``sess.run(inc)`` in a loop; the anchor: the same tasks bumping a Python int,
    each update followed by ``await asyncio.sleep(0)``."""
    total, tasks = s.variable_n, s.variable_tasks
    shares = _spread(total, tasks)
    g = af.Graph()
    with g.as_default():
        v = af.Variable(0, name="v")
        inc = v.assign_add(1)

    async def plain() -> int:
        counter = 0

        async def bump(n: int) -> None:
            nonlocal counter
            for _ in range(n):
                counter += 1
                await asyncio.sleep(0)

        await asyncio.gather(*(bump(n) for n in shares))
        return counter

    async def main() -> tuple[list[float], list[float], int]:
        async with af.Session(graph=g) as sess:
            await sess.run(v.initializer)
            await sess.run(inc)  # compiles
            # Untimed: how often consecutive steps came from different tasks.
            await sess.run(v.initializer)
            order: list[int] = []

            async def traced(k: int) -> None:
                for _ in range(3):
                    await sess.run(inc)
                    order.append(k)

            await asyncio.gather(*(traced(k) for k in range(tasks)))
            switches = sum(a != b for a, b in itertools.pairwise(order))

            async def steps(n: int) -> None:
                for _ in range(n):
                    await sess.run(inc)

            ours, anchor = [], []
            for _ in range(s.state_repeats):
                gc.collect()
                start = clock()
                counted = await plain()
                anchor.append(clock() - start)
                _check(counted == total, f"variable anchor counted {counted}, not {total}")
                await sess.run(v.initializer)
                gc.collect()
                start = clock()
                await asyncio.gather(*(steps(n) for n in shares))
                ours.append(clock() - start)
                value = await sess.run(v)
                _check(value == total, f"variable ended at {value!r}, expected {total}")
            return ours, anchor, switches

    ours, anchor, switches = asyncio.run(main())
    row = rows["variable"]
    row.record(ours, anchor, per=lambda t: total / t)
    assert row.ours is not None
    row.notes.append(
        f"{tasks} tasks x {total // tasks:,} steps; the variable ended exactly at {total:,} "
        f"every run; {1e6 / row.ours:.2f} us per step, best run {min(ours):.2f} s"
    )
    sequential = switches < tasks
    row.notes.append(
        f"untimed check ({tasks} tasks x 3 steps): consecutive steps changed task "
        f"{switches} times"
        + (
            ": an all-inline plan's `await sess.run` never yields to the loop, so "
            "each task's steps run back to back (the anchor's sleep(0) switches "
            "task on every update)"
            if sequential
            else ""
        )
    )


# --------------------------------------------------------------------------- cnn


def cnn(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """Inference steps of a small image classifier (conv / bias / relu / pool x2, dense,
    softmax): asyncflow's NN kernels inside the runtime, against the same numpy calls
    made directly.  The big convolutions are expensive kernels (worker threads)."""
    from benchmarks import cnn as model

    p = model.weights(s.cnn_image)
    x_val = model.images(s.cnn_batch, s.cnn_image)
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (None, s.cnn_image, s.cnn_image, 3), name="images")
        probs = model.build(af.nn, af, x, p)
    expected = model.numpy_forward(x_val, p)

    def plain() -> object:
        return model.numpy_forward(x_val, p)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            got = await sess.run(probs, feed_dict={x: x_val})  # compiles
            _check(
                bool(np.allclose(got, expected, rtol=1e-4, atol=1e-6)),
                "the CNN's probabilities differ from numpy's",
            )
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(plain))
                ours.append(await _atimed(lambda: sess.run(probs, feed_dict={x: x_val})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["cnn"]
    row.record(ours, anchor, per=lambda t: t * 1e3)
    row.notes.append(
        f"{len(g.get_operations())} ops; the TF anchor runs the same "
        f"model (same weights) with TF's default session config"
    )


# --------------------------------------------------------------------------- scale


def scale(af: Af, s: Sizes, rows: dict[str, Row], with_tf: bool = False) -> None:
    """Build, first run, second run and memory of a 100k-node chain, each repeat in a
    fresh subprocess; with ``with_tf`` TensorFlow's subprocess alternates with
    asyncflow's repeat by repeat and fills the TF column (see :mod:`benchmarks.scale`
    for how memory is measured, the same way for both)."""
    from benchmarks.external import run_child

    del af  # measured in clean subprocesses
    engines = {"asyncflow": s.scale_n, **({"tf": s.tf_scale_n} if with_tf else {})}
    results: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    tf_error = None
    for _ in range(s.scale_repeats):
        for engine, n in engines.items():
            if engine == "tf" and tf_error is not None:
                continue
            result = run_child(["benchmarks.scale", engine, str(n)], timeout=900)
            if "_error" in result:
                if engine == "asyncflow":
                    raise RuntimeError(f"scale subprocess failed: {result['_error']}")
                tf_error = result["_error"]
                continue
            results[engine].append(result)
    floor = _numpy_chain(s.scale_n)
    floor_times = [timed(floor) for _ in range(s.repeats)]
    for key in ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"):
        row = rows[key]
        ours = [r[key] for r in results["asyncflow"]]
        row.ours, row.ours_median = min(ours), statistics.median(ours)
        row.repeats = len(ours)
        if results.get("tf"):
            theirs = [r[key] for r in results["tf"]]
            row.tf, row.tf_median = min(theirs), statistics.median(theirs)
    for key in ("scale.first_run", "scale.second_run"):
        rows[key].anchor = min(floor_times) / s.scale_n * 1e6
        rows[key].anchor_median = statistics.median(floor_times) / s.scale_n * 1e6
    rows["scale.build"].notes.append(
        f"best of {s.scale_repeats} fresh subprocesses per engine"
        + (", asyncflow's and TF's alternating" if with_tf else "")
    )
    if with_tf and tf_error is not None:
        for key in ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"):
            rows[key].tf_note = "error"
        rows["scale.build"].notes.append(f"TF scale subprocess failed: {tf_error}")
    if with_tf and s.tf_scale_n != s.scale_n:
        rows["scale.build"].notes.append(
            f"TF's scale figures are for a {s.tf_scale_n:,}-node chain"
        )

    def memory(engine: str, what: str) -> str:
        r = min(results[engine], key=lambda r: r["scale.peak_rss"])
        return (
            f"{what}: peak {r['peak_abs_mb']:.0f} MB - {r['imports_rss_mb']:.0f} MB after "
            f"its imports = {r['scale.peak_rss']:.0f} MB (the child started at "
            f"{r['start_rss_mb']:.0f} MB)"
        )

    rows["scale.peak_rss"].notes.append(
        "each engine in a fresh subprocess: (peak RSS after the workload) - (RSS after "
        "the engine's imports), both measured the same way; absolute figures from the "
        "same interpreter start: "
        + memory("asyncflow", "asyncflow")
        + ("; " + memory("tf", "TF 1.x") if results.get("tf") else "")
    )


def scale_cond(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The 100k chain with one cond against the same chain, each in a fresh subprocess,
    alternating (best of ``repeats`` for time; peak RSS is the same each time)."""
    from benchmarks.external import run_child

    del af
    plain: list[dict[str, Any]] = []
    cond: list[dict[str, Any]] = []
    for _ in range(max(2, min(s.repeats, 3))):
        for engine, out in (("asyncflow", plain), ("asyncflow-cond", cond)):
            result = run_child(["benchmarks.scale", engine, str(s.scale_n)], timeout=600)
            if "_error" in result:
                raise RuntimeError(f"scale subprocess failed: {result['_error']}")
            out.append(result)
    for row_id, key in (
        ("scale.cond.second_run", "scale.second_run"),
        ("scale.cond.peak_rss", "scale.peak_rss"),
    ):
        rows[row_id].record([r[key] for r in cond], [r[key] for r in plain])
    rows["scale.cond.peak_rss"].notes.append(
        "peak RSS - RSS after the imports, each in its own subprocess (as scale.peak_rss)"
    )


# --------------------------------------------------------------------------- service


def service(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """An ASGI app under load: ``await sess.run`` vs ``asyncio.gather`` of the same
    coroutines, endpoint beside endpoint in one server (see :mod:`benchmarks.service`)."""
    from benchmarks import service as svc

    del af  # served from a child process
    ids = ("service.cpu", "service.p50", "service.p99")
    missing = svc.missing_modules()
    if missing:
        for row_id in ids:
            rows[
                row_id
            ].skipped = (
                f'not installed: {", ".join(missing)} (the bench extra: pip install -e ".[bench]")'
            )
        return
    reps = svc.measure(
        s.service_requests, s.service_concurrency, s.service_sleep, s.service_repeats
    )
    by = {ep: [r for r in reps if r.endpoint == ep] for ep in svc.ENDPOINTS}
    n = s.service_requests
    rows["service.cpu"].record(
        [r.server_cpu / n for r in by["run"]],
        [r.server_cpu / n for r in by["gather"]],
        per=lambda t: t * 1e6,
    )
    rows["service.p50"].record(
        [r.percentile(0.5) for r in by["run"]],
        [r.percentile(0.5) for r in by["gather"]],
        per=lambda t: t * 1e3,
    )
    rows["service.p99"].record(
        [r.percentile(0.99) for r in by["run"]],
        [r.percentile(0.99) for r in by["gather"]],
        per=lambda t: t * 1e3,
    )

    def summary(ep: str) -> str:
        best = min(by[ep], key=lambda r: r.wall)
        gc_counts = "/".join(str(c) for c in best.gc_collections)
        return (
            f"/{ep} {n / best.wall:,.0f} req/s, load generator "
            f"{best.client_cpu / n * 1e6:.0f} us CPU/req, server GC collections "
            f"(gen 0/1/2) {gc_counts}"
        )

    import uvicorn

    rows["service.cpu"].notes.append(
        f"Starlette on uvicorn {uvicorn.__version__} (asyncio loop, {svc.http_impl()}) in a "
        f"child process on a local port; load: aiohttp client in this process, "
        f"{s.service_concurrency} requests in flight, {n:,} requests per repeat, endpoints "
        f"alternating; each request awaits two {s.service_sleep * 1e3:g} ms sleeps (I/O "
        f"stand-ins) and 3 numpy ops: /run as sess.run of a graph with 2 async py_funcs, "
        f"/gather as asyncio.gather of the same coroutines (the anchor); CPU = server "
        f"process CPU time / requests; latency at the client"
    )
    rows["service.cpu"].notes.append(f"best repeats: {summary('run')}; {summary('gather')}")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


WORKLOAD_FUNCS: dict[str, Callable[[Af, Sizes, dict[str, Row]], None]] = {
    "chain": chain,
    **{f"xdev.k{k}": xdev(k) for k in XDEV_KS},
    "wide": wide,
    "tiny": tiny,
    "concurrent": concurrent_runs,
    "callable": callable_(nested=False),
    "callable.nested": callable_(nested=True),
    "trace": trace,
    "trace.off": trace_off,
    "overlap": overlap,
    "parallel": parallel,
    "parallel.2dev": parallel_2dev,
    "loop": loop(with_cond=False),
    "loop.cond": loop(with_cond=True),
    "queue": queue,
    "variable": variable,
    "cnn": cnn,
    "scale": scale,
    "scale.cond": scale_cond,
    **OPT_WORKLOADS,
    "service": service,
}

ROWS_OF: dict[str, tuple[str, ...]] = {
    "chain": ("chain",),
    **{f"xdev.k{k}": (f"xdev.k{k}",) for k in XDEV_KS},
    "wide": ("wide",),
    "tiny": ("tiny.run", "tiny.run_sync", "tiny.run_sync.async"),
    "concurrent": ("concurrent",),
    "callable": ("callable",),
    "callable.nested": ("callable.nested",),
    "trace": ("trace",),
    "trace.off": ("trace.off",),
    "overlap": ("overlap",),
    "parallel": ("parallel",),
    "parallel.2dev": ("parallel.2dev",),
    "loop": ("loop",),
    "loop.cond": ("loop.cond",),
    "queue": ("queue",),
    "variable": ("variable",),
    "cnn": ("cnn",),
    "scale": ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"),
    "scale.cond": ("scale.cond.second_run", "scale.cond.peak_rss"),
    **OPT_ROWS_OF,
    "service": ("service.cpu", "service.p50", "service.p99"),
}
