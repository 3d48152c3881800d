"""Memory per node of a large graph, its plan and its straight-line program: a size
bound measured with tracemalloc (what each node keeps, not a time).

A 100,000-node chain is the front half's memory workload (its peak RSS is compared
with TensorFlow's in ``benchmarks``); these bounds keep what one node costs at each
phase from growing back: the graph's objects, the compiled and bound plan (IR, plan
tables, bound nodes) and the program its later runs replay.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import numpy as np

import asyncflow as af

N = 20_000


def _chain(n: int) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        one = af.constant(np.float32(1.0), name="one")
        x = x0
        for _ in range(n):
            x = x + one
    return g, x0, x


def _per_node(before: int) -> float:
    gc.collect()
    return (tracemalloc.get_traced_memory()[0] - before) / N


def test_a_chain_node_keeps_bounded_memory_at_every_phase() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        g, x0, x = _chain(N)
        graph = _per_node(start)
        built = tracemalloc.get_traced_memory()[0]

        async def runs() -> tuple[float, float, float]:
            async with af.Session(graph=g) as sess:
                mark = tracemalloc.get_traced_memory()[0]
                assert float(await sess.run(x, feed_dict={x0: 0.0})) == N
                plan = _per_node(mark)  # IR, plan and bound kernels, kept with the session
                mark = tracemalloc.get_traced_memory()[0]
                assert float(await sess.run(x, feed_dict={x0: 0.0})) == N
                program = _per_node(mark)  # the straight-line program of later runs
                return plan, program, _per_node(built)

        plan, program, total = asyncio.run(runs())
    finally:
        tracemalloc.stop()
    # An Operation, its Tensor, its name and the graph's indexes; no dict per op
    # without attributes (64 bytes more each).
    assert graph < 360, f"graph: {graph:.0f} bytes per node"
    # A NodeDef sharing its operand's ref and its input infos with the node before,
    # the plan's tables with one int object per slot, a bound node.
    assert plan < 760, f"compiled and bound plan: {plan:.0f} bytes per node"
    # One bound method over a tuple per node (a closure over cells was 448 bytes).
    assert program < 200, f"straight-line program: {program:.0f} bytes per node"
    assert total < 950, f"plan and program: {total:.0f} bytes per node"
