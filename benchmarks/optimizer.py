"""The graph optimizer's workloads: what folding, CSE and inlining buy, at L1 vs L0.

* ``opt.fold`` — ``fold_n`` constant subexpressions (``c * 2 + 1`` each, summed)
  feeding a small live computation (``x * sum``): the first run (compile, folding
  included, and run) and the steady-state run at L1, each against the same at L0.
* ``opt.cse`` — ``cse_n`` ops of which 30 % duplicate an earlier one (same op, same
  inputs), all summed: steady-state run at L1 against L0.
* ``opt.call`` — a function (``af.Defun``: ``x * 2 + 1``) called ``call_n`` times in a
  chain: µs per call inlined (L1) and through the call kernel (inlining off), each
  against the other; TF 1.x's ``function.Defun`` call is the TF column (inlining on
  and off, in :mod:`benchmarks.external`).

Every workload checks that the levels compute the same value before timing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.report import Row, Target
from benchmarks.sizes import Sizes

Af = Any

__all__ = ["OPT_ROWS_OF", "OPT_WORKLOADS", "opt_rows"]


def opt_rows(s: Sizes) -> list[Row]:
    """The optimizer's rows of the table."""
    return [
        Row(
            "opt.fold.first_run",
            f"{s.fold_n:,} const subexprs, 1st run, L1",
            "ms",
            "the same first run at L0 (no optimizer)",
            Target("<=", 2.0, relative=True),
        ),
        Row(
            "opt.fold.steady",
            f"{s.fold_n:,} const subexprs, steady, L1",
            "us/run",
            "the same steady-state run at L0",
            Target("<=", 0.1, relative=True),
        ),
        Row(
            "opt.cse",
            f"{s.cse_n:,} ops, 30% duplicated, L1",
            "us/run",
            "the same steady-state run at L0",
            Target("<=", 0.9, relative=True),
        ),
        Row(
            "opt.call.inlined",
            f"fn called {s.call_n:,}x, inlined",
            "us/call",
            "the same calls through the call kernel (inlining off)",
        ),
        Row(
            "opt.call.kernel",
            f"fn called {s.call_n:,}x, call kernel",
            "us/call",
            "the same calls inlined",
        ),
    ]


def _config(af: Af, level: str) -> Any:
    if level == "L0":
        options = af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
    elif level == "call":
        options = af.OptimizerOptions(do_function_inlining=False)
    else:
        options = af.OptimizerOptions()
    return af.SessionConfig(graph_options=af.GraphOptions(optimizer_options=options))


def fold_graph(af: Af, n: int) -> tuple[Any, Any, Any]:
    """``x * sum(c_k * 2 + 1)`` over ``n`` constants ``c_k``."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        terms = [af.constant(np.float32(k % 7)) * 2.0 + 1.0 for k in range(n)]
        y = x * af.add_n(terms)
    return g, x, y


def cse_graph(af: Af, n: int, seed: int = 0) -> tuple[Any, Any, Any]:
    """``n`` ops over a placeholder, 30 % of them exact duplicates of earlier ones."""
    rng = random.Random(seed)
    fns = [af.maximum, af.minimum, lambda a, b: af.tanh(a - b)]
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        tensors = [x, x * 0.5]
        made: list[tuple[Any, Any, Any]] = []
        for _ in range(n):
            if made and rng.random() < 0.3:
                fn, a, b = made[rng.randrange(len(made))]
            else:
                fn, a, b = rng.choice(fns), rng.choice(tensors), rng.choice(tensors)
                made.append((fn, a, b))
            tensors.append(fn(a, b))
        y = af.add_n(tensors[2:])
    return g, x, y


def call_graph(af: Af, n: int) -> tuple[Any, Any, Any]:
    """``n`` chained calls of ``f(x) = x * 0.5 + 1``."""
    g = af.Graph()
    with g.as_default():

        def body(t: Any) -> Any:
            return t * 0.5 + 1.0

        f: Callable[[Any], Any] = af.Defun(af.float32, func_name="bench_f")(body)

        x = af.placeholder(af.float32, shape=(), name="x")
        y = x
        for _ in range(n):
            y = f(y)
    return g, x, y


async def _first_and_steady(
    af: Af, graph: Any, x: Any, y: Any, level: str, repeats: int, runs: int
) -> tuple[float, float, Any, Any]:
    """(first run seconds, best steady seconds per run, value, optimizer stats)."""
    async with af.Session(graph=graph, config=_config(af, level)) as sess:
        start = time.perf_counter()
        value = await sess.run(y, {x: 1.0})
        first = time.perf_counter() - start
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(runs):
                await sess.run(y, {x: 1.0})
            best = min(best, (time.perf_counter() - start) / runs)
        (stats,) = sess.statistics().optimizer
    return first, best, value, stats


def _same(a: Any, b: Any, what: str) -> None:
    if not np.allclose(a, b, rtol=1e-5, equal_nan=True):
        raise RuntimeError(f"{what}: L1 computed {a!r}, L0 {b!r}")


def fold(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    async def main() -> None:
        firsts: dict[str, list[float]] = {"L1": [], "L0": []}
        steady: dict[str, list[float]] = {"L1": [], "L0": []}
        values, stats = {}, {}
        for _ in range(s.slow_repeats):
            for level in ("L1", "L0"):
                g, x, y = fold_graph(af, s.fold_n)  # a fresh graph: nothing cached
                first, best, values[level], stats[level] = await _first_and_steady(
                    af, g, x, y, level, s.repeats, 20
                )
                firsts[level].append(first)
                steady[level].append(best)
        _same(values["L1"], values["L0"], "opt.fold")
        rows["opt.fold.first_run"].record(firsts["L1"], firsts["L0"], per=lambda t: t * 1e3)
        rows["opt.fold.steady"].record(steady["L1"], steady["L0"], per=lambda t: t * 1e6)
        st = stats["L1"]
        rows["opt.fold.steady"].notes.append(
            f"L1 runs {st.nodes_after:,} of {st.nodes_before:,} nodes "
            f"(folding removed {st.folded:,}, CSE {st.cse:,})"
        )

    asyncio.run(main())


def cse(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    async def main() -> None:
        g, x, y = cse_graph(af, s.cse_n)
        times: dict[str, list[float]] = {"L1": [], "L0": []}
        values, stats = {}, {}
        for _ in range(s.slow_repeats):
            for level in ("L1", "L0"):
                _, best, values[level], stats[level] = await _first_and_steady(
                    af, g, x, y, level, s.repeats, 10
                )
                times[level].append(best)
        _same(values["L1"], values["L0"], "opt.cse")
        row = rows["opt.cse"]
        row.record(times["L1"], times["L0"], per=lambda t: t * 1e6)
        st = stats["L1"]
        row.notes.append(
            f"L1 runs {st.nodes_after:,} of {st.nodes_before:,} nodes "
            f"(CSE removed {st.cse:,}, folding {st.folded:,})"
        )

    asyncio.run(main())


def call(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    async def main() -> None:
        g, x, y = call_graph(af, s.call_n)
        times: dict[str, list[float]] = {"L1": [], "call": []}
        values = {}
        for _ in range(s.slow_repeats):
            for level in ("L1", "call"):
                _, best, values[level], _ = await _first_and_steady(
                    af, g, x, y, level, s.repeats, 3
                )
                times[level].append(best)
        _same(values["L1"], values["call"], "opt.call")

        def per(t: float) -> float:
            return t / s.call_n * 1e6

        rows["opt.call.inlined"].record(times["L1"], times["call"], per=per)
        rows["opt.call.kernel"].record(times["call"], times["L1"], per=per)

    asyncio.run(main())


OPT_WORKLOADS = {"opt.fold": fold, "opt.cse": cse, "opt.call": call}
OPT_ROWS_OF = {
    "opt.fold": ("opt.fold.first_run", "opt.fold.steady"),
    "opt.cse": ("opt.cse",),
    "opt.call": ("opt.call.inlined", "opt.call.kernel"),
}


def tf_call(tf1: Any, s: Sizes, inline: bool) -> float:
    """TF 1.x: µs per ``function.Defun`` call in the same chain (inlining on or off)."""
    from tensorflow.python.framework import function

    g = tf1.Graph()
    with g.as_default():

        def body(t: Any) -> Any:
            return t * 0.5 + 1.0

        f: Callable[[Any], Any] = function.Defun(tf1.float32, func_name="bench_f")(body)

        x = tf1.placeholder(tf1.float32, shape=(), name="x")
        y = x
        for _ in range(s.call_n):
            y = f(y)
    config = tf1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.do_function_inlining = inline
    with tf1.Session(graph=g, config=config) as sess:
        sess.run(y, {x: 1.0})
        best = float("inf")
        for _ in range(s.repeats):
            start = time.perf_counter()
            for _ in range(3):
                sess.run(y, {x: 1.0})
            best = min(best, (time.perf_counter() - start) / 3)
    return best / s.call_n * 1e6
