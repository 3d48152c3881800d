"""Type-checked user code: tensor operators, variables and py_func as mypy sees them.

CI runs ``mypy --strict examples/``; every ``assert_type`` below is a check that a
user's code gets precise types from asyncflow (no ``Any`` leaking out of ``x * 2.0``).
Run it with ``python examples/typed_graph.py``.
"""

from __future__ import annotations

import asyncio
from typing import assert_type

import numpy as np

import asyncflow as af


def double(v: np.ndarray) -> np.ndarray:
    """A plain Python kernel."""
    return v * 2


def build() -> tuple[af.Graph, af.Tensor, af.Tensor, af.Variable]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 3), name="x")
        w = af.Variable(np.ones((3, 1), np.float32), name="w")
        y = assert_type(x @ w, af.Tensor)
        y = assert_type(2.0 * y - 1.0, af.Tensor)
        y = assert_type(-abs(y) / 3 + y**2 // 1 % 7, af.Tensor)
        big = assert_type((y > 1.0) & ~(y < 0.0) | (y >= 5.0), af.Tensor)
        picked = assert_type(af.where(big, y, y * 0.0), af.Tensor)
        doubled = assert_type(af.py_func(double, [picked], af.float32, name="double"), af.Tensor)
        doubled.set_shape((None, 1))
        assert_type(doubled.get_shape(), af.TensorShape)
        first = assert_type(doubled[0], af.Tensor)
        bumped = assert_type(w + 1.0, af.Tensor)
        bumped = assert_type(np.zeros((3, 1), np.float32) + bumped + w, af.Tensor)
        assert_type(w.assign_add(np.ones((3, 1), np.float32)), af.Tensor)
        total = af.reduce_sum(first) + af.reduce_sum(bumped)
    return g, x, total, w


async def main() -> None:
    g, x, total, w = build()
    async with af.Session(graph=g) as sess:
        await w.initializer.run(session=sess)
        value = await total.eval({x: [[1.0, 2.0, 3.0]]}, session=sess)
        print("total =", float(value))


if __name__ == "__main__":
    asyncio.run(main())
