"""What every workload family shares: the asyncflow module type, the checks a
workload makes of its own results, an awaited timer, and the scalar chain graph
(with its numpy anchor) several families measure."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.sizes import clock

Af = Any  # the asyncflow module, imported lazily so a broken build fails one row


def check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


async def atimed(fn: Callable[[], Awaitable[object]]) -> float:
    gc.collect()
    start = clock()
    await fn()
    return clock() - start


def numpy_chain(n: int) -> Callable[[], object]:
    one = np.float32(1.0)

    def run() -> object:
        x = np.float32(0.0)
        for _ in range(n):
            x = np.add(x, one)
        return x

    return run


def chain_graph(af: Af, n: int) -> tuple[Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        one = af.constant(np.float32(1.0), name="one")
        x = x0
        for _ in range(n):
            x = x + one
    return g, x0, x


async def executed_nodes(af: Af, sess: Any, fetch: Any, feed: dict[Any, Any]) -> int | None:
    """How many nodes a traced run executed (None when tracing is unavailable)."""
    try:
        md = af.RunMetadata()
        opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        await sess.run(fetch, feed_dict=feed, options=opts, run_metadata=md)
        return sum(len(d.node_stats) for d in md.step_stats.dev_stats)
    except Exception:
        return None
