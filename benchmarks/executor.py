"""The executor family: a long chain, a wide fan-out, tiny runs (``run``, ``run_sync``),
callables, tracing on and off, and overlapping async kernels; asyncflow's side of each,
next to its in-process anchors (plain numpy / plain asyncio), repeats interleaved."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    Af,
    atimed,
    chain_graph,
    check,
    executed_nodes,
    numpy_chain,
)
from benchmarks.report import Row
from benchmarks.sizes import Sizes, timed

# --------------------------------------------------------------------------- chain


def chain(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    n = s.chain_n
    g, x0, y = chain_graph(af, n)
    floor = numpy_chain(n)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x0: 0.0})
            check(value == n, f"chain computed {value!r}, expected {n}")
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(floor))
                ours.append(await atimed(lambda: sess.run(y, feed_dict={x0: 0.0})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    rows["chain"].record(ours, anchor, per=lambda t: t / n * 1e6)


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
            check(value == 2 * n, f"wide computed {value!r}, expected {2 * n}")
            executed = await executed_nodes(af, sess, y, {x: 1.0})
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(numpy_wide))
                ours.append(await atimed(lambda: sess.run(y, feed_dict={x: 1.0})))
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


def tiny_graph(af: Af) -> tuple[Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(af.add(x, 1.0), 2.0)
    return g, x, y


def tiny(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The tiny graph run again and again: awaited (``tiny.run``), from plain code
    (``tiny.run_sync``), and a plan that needs a loop from plain code
    (``tiny.run_sync.async``)."""
    _tiny_run(af, s, rows)
    _tiny_run_sync(af, s, rows)
    _tiny_run_sync_async(af, s, rows)


def _tiny_run(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    g, x, y = tiny_graph(af)
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
            check(value == 4.0, f"tiny graph computed {value!r}, expected 4.0")

            async def ours_calls() -> None:
                for _ in range(calls):
                    await sess.run(y, feed_dict={x: 1.0})

            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await atimed(anchor_calls))
                ours.append(await atimed(ours_calls))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    rows["tiny.run"].record(ours, anchor, per=lambda t: t / calls * 1e6)


def _tiny_run_sync(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """run_sync: from plain code, against one fresh event loop per call."""
    g, x, y = tiny_graph(af)
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


def _tiny_run_sync_async(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """run_sync of a plan that needs a loop: the session's loop for this thread, kept
    across calls, against a fresh loop per call."""
    sync_calls = s.tiny_sync_calls
    ga = af.Graph()
    with ga.as_default():
        xa = af.placeholder(af.float32, shape=(), name="x")

        async def echo(v: Any) -> Any:
            return v

        ya = af.py_func(echo, [xa], af.float32)
    with af.Session(graph=ga) as sess:
        check(sess.run_sync(ya, feed_dict={xa: 1.0}) == 1.0, "async tiny graph: wrong value")

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
            g, x, fetches = tiny_graph(af)
            feed_list, values = [x], (1.0,)
            expected = 4.0
        feed = dict(zip(feed_list, values))

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g) as sess:
                fn = sess.make_callable(fetches, feed_list=feed_list)
                for got in (await sess.run(fetches, feed_dict=feed), await fn(*values)):
                    check(
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
                    anchor.append(await atimed(run_calls))
                    ours.append(await atimed(callable_calls))
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
    g, x0, y = chain_graph(af, n)
    feed = {x0: 0.0}
    full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)

    async def main() -> tuple[list[float], list[float], int, float]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict=feed)
            check(value == n, f"chain computed {value!r}, expected {n}")
            md = af.RunMetadata()
            value = await sess.run(y, feed_dict=feed, options=full, run_metadata=md)
            check(value == n, f"traced chain computed {value!r}, expected {n}")
            recorded = sum(len(d.node_stats) for d in md.step_stats.dev_stats)
            check(recorded >= n, f"a traced run of {n:,} adds recorded {recorded} node stats")
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await atimed(lambda: sess.run(y, feed_dict=feed)))
                ours.append(
                    await atimed(
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
    g, x0, y = chain_graph(af, n)
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
                check(value == n, f"chain computed {value!r}, expected {n}")
            times: dict[str, list[float]] = {"plain": [], "off": [], "off_md": []}
            for _ in range(s.repeats):
                times["plain"].append(await atimed(lambda: sess.run(y, feed_dict=feed)))
                times["off"].append(
                    await atimed(
                        lambda: sess.run(y, feed_dict=feed, options=off, run_metadata=None)
                    )
                )
                times["off_md"].append(
                    await atimed(
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
            check(
                bool(np.isclose(value, expected, rtol=1e-5)),
                f"overlap graph computed {value!r}, expected {expected!r}",
            )
            ours, anchor = [], []
            for _ in range(s.slow_repeats):
                anchor.append(await atimed(plain))
                ours.append(await atimed(lambda: sess.run(b, feed_dict={x: 0.0})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["overlap"]
    row.record(ours, anchor, per=lambda t: t / critical_path)
    row.notes.append(
        f"critical path {critical_path * 1e3:.0f} ms; asyncflow's best step "
        f"{min(ours) * 1e3:.1f} ms"
    )
