"""Sync quickstart: the same API from plain code, with ``sess.run_sync(...)``.

Run it with ``python examples/quickstart_sync.py``.
"""

from __future__ import annotations

import numpy as np

import asyncflow as af


def main() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float64, shape=(None,), name="a")
        total = af.reduce_sum(a * 2.0, name="total")
        mean = af.reduce_mean(a, name="mean")
    with af.Session(graph=g) as sess:
        # Fetches may be any nesting of lists / tuples / dicts; the result mirrors it.
        out = sess.run_sync(
            {"total": total, "mean": mean}, feed_dict={a: np.array([1.0, 2.0, 3.0, 4.0])}
        )
        print("total =", out["total"])
        print("mean =", out["mean"])
        # Tensors can also be fetched and fed by name.
        print("by name =", sess.run_sync("total:0", feed_dict={"a:0": [10.0]}))


if __name__ == "__main__":
    main()
