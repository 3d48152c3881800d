"""Async quickstart: build a graph once, run it with ``await sess.run(...)``.

Run it with ``python examples/quickstart_async.py``.
"""

from __future__ import annotations

import asyncio

import numpy as np

import asyncflow as af


def build_graph() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 3), name="x")
        w = af.constant(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32), name="w")
        y = af.nn.relu(af.matmul(x, w) - 1.0, name="y")
    return g, x, y


async def main() -> None:
    g, x, y = build_graph()
    async with af.Session(graph=g) as sess:
        out = await sess.run(y, feed_dict={x: [[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]})
        print("y =", out.tolist())
        # Several steps may run concurrently on one session.
        batches = [np.full((1, 3), float(i), np.float32) for i in range(3)]
        results = await asyncio.gather(*(sess.run(y, feed_dict={x: b}) for b in batches))
        print("concurrent =", [r.tolist() for r in results])


if __name__ == "__main__":
    asyncio.run(main())
