"""The scale workload: build, first run and second run of a long scalar-add chain.

``python -m benchmarks.scale {asyncflow,asyncflow-cond,tf} N`` runs in a fresh subprocess so its
peak RSS (``ru_maxrss``) is this workload's alone, and prints one JSON object:
µs per node for ``build`` / ``first_run`` (includes compiling the plan) /
``second_run`` (cached plan), and memory, measured the same way for every engine:

- ``start_rss_mb``: the resident set size when the child starts (the interpreter
  and this module: the same baseline for every engine);
- ``imports_rss_mb``: the resident set size after the engine's imports (numpy and
  asyncflow; TensorFlow with ``tf.compat.v1`` graph mode set up), before the graph;
- ``peak_abs_mb``: the peak resident set size (``ru_maxrss``) after the workload;
- ``scale.peak_rss``: ``peak_abs_mb - imports_rss_mb``, the memory the graph, its
  plan and its runs took at their peak: the figure the table compares.
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import sys
import time
from typing import Any

import benchmarks  # noqa: F401  (pins BLAS threads before numpy is imported)
from benchmarks.process import current_rss_mb, peak_rss_mb
from benchmarks.tf_anchor import tf_chain, tf_config, tf_v1

#: The resident set size when this module was first imported (the child's start).
START_RSS_MB = current_rss_mb()


def scale_asyncflow(n: int, with_cond: bool = False) -> dict[str, Any]:
    """The chain; ``with_cond``: the same chain with one ``af.cond`` halfway (its taken
    branch adds 0, the other subtracts 1), which needs dead tensors but no frames."""
    import numpy as np

    import asyncflow as af

    baseline = current_rss_mb()
    start = time.perf_counter()
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        one = af.constant(np.float32(1.0), name="one")
        taken = af.constant(True, name="taken")
        x = x0
        for k in range(n):
            if with_cond and k == n // 2:
                keep, drop = np.float32(0.0), np.float32(1.0)
                x = af.cond(
                    taken,
                    functools.partial(operator.add, x, keep),
                    functools.partial(operator.sub, x, drop),
                )
            x = x + one
    build = time.perf_counter() - start

    async def runs() -> tuple[float, float, Any]:
        async with af.Session(graph=g) as sess:
            t0 = time.perf_counter()
            await sess.run(x, feed_dict={x0: 0.0})
            t1 = time.perf_counter()
            value = await sess.run(x, feed_dict={x0: 0.0})
            t2 = time.perf_counter()
        return t1 - t0, t2 - t1, value

    first, second, value = asyncio.run(runs())
    if float(value) != float(n):
        raise AssertionError(f"chain of {n} adds computed {value!r}")
    return _result(n, build, first, second, baseline)


def scale_tf(n: int) -> dict[str, Any]:
    tf1 = tf_v1()
    baseline = current_rss_mb()
    start = time.perf_counter()
    g, x0, x = tf_chain(tf1, n)
    build = time.perf_counter() - start
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        t0 = time.perf_counter()
        sess.run(x, {x0: 0.0})
        t1 = time.perf_counter()
        sess.run(x, {x0: 0.0})
        t2 = time.perf_counter()
    return _result(n, build, t1 - t0, t2 - t1, baseline)


def _result(n: int, build: float, first: float, second: float, baseline: float) -> dict[str, Any]:
    return {
        "n": n,
        "scale.build": build / n * 1e6,
        "scale.first_run": first / n * 1e6,
        "scale.second_run": second / n * 1e6,
        "scale.peak_rss": peak_rss_mb() - baseline,
        "peak_abs_mb": peak_rss_mb(),
        "imports_rss_mb": baseline,
        "start_rss_mb": START_RSS_MB,
    }


def main(argv: list[str]) -> int:
    engine, n = argv[0], int(argv[1])
    fn = {
        "asyncflow": scale_asyncflow,
        "asyncflow-cond": lambda n: scale_asyncflow(n, True),
        "tf": scale_tf,
    }[engine]
    print(json.dumps(fn(n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
