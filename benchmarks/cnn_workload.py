"""The cnn workload: a small convolutional network's inference, asyncflow against the
same network in plain numpy (:mod:`benchmarks.cnn` builds both)."""

from __future__ import annotations

import asyncio

import numpy as np

from benchmarks import cnn as model
from benchmarks.common import (
    Af,
    atimed,
    check,
)
from benchmarks.report import Row
from benchmarks.sizes import Sizes, timed

# --------------------------------------------------------------------------- cnn


def cnn(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """Inference steps of a small image classifier (conv / bias / relu / pool x2, dense,
    softmax): asyncflow's NN kernels inside the runtime, against the same numpy calls
    made directly.  The big convolutions are expensive kernels (worker threads)."""
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
            check(
                bool(np.allclose(got, expected, rtol=1e-4, atol=1e-6)),
                "the CNN's probabilities differ from numpy's",
            )
            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(timed(plain))
                ours.append(await atimed(lambda: sess.run(probs, feed_dict={x: x_val})))
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["cnn"]
    row.record(ours, anchor, per=lambda t: t * 1e3)
    row.notes.append(
        f"{len(g.get_operations())} ops; the TF anchor runs the same "
        f"model (same weights) with TF's default session config"
    )
