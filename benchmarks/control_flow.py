"""The control-flow family: the executor's cost per ``while_loop`` iteration (frames,
Merge / Switch / NextIteration, dead tensors for the cond) against a plain Python loop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    Af,
    check,
)
from benchmarks.report import Row
from benchmarks.sizes import Sizes, clock, timed

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
        check(
            (int(anchor_value[0]), float(anchor_value[1])) == expected,
            f"the Python {row_id} anchor computed {anchor_value!r}, expected {expected!r}",
        )
        short = 100

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g) as sess:
                value = await sess.run(fetches, feed_dict={n_ph: short})  # compiles
                want = _loop_expected(short, with_cond)
                check(
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
                    check(
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
