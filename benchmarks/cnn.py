"""The small-CNN workload's model, shared by asyncflow's side and TensorFlow's anchor.

An image classifier of the size people run on a CPU in a service: two 3x3 conv +
bias + ReLU + 2x2 max-pool blocks, a dense layer and a softmax, NHWC float32.
Both sides build it from :func:`weights` (one seed), so their outputs are compared
before anything is timed.  :func:`numpy_forward` is the in-process anchor: the same
layers as direct numpy calls (``sliding_window_view`` im2col + one matmul per conv), i.e.
asyncflow's kernels without the graph runtime around them.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

CHANNELS = (3, 16, 32)
CLASSES = 10


def weights(image: int) -> dict[str, np.ndarray]:
    """The model's parameters for ``image`` x ``image`` inputs (a fixed seed)."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for i, (cin, cout) in enumerate(itertools.pairwise(CHANNELS)):
        out[f"w{i}"] = (rng.standard_normal((3, 3, cin, cout)) / np.sqrt(9 * cin)).astype(
            np.float32
        )
        out[f"b{i}"] = (0.01 * rng.standard_normal(cout)).astype(np.float32)
    flat = (image // 4) ** 2 * CHANNELS[-1]
    out["wd"] = (rng.standard_normal((flat, CLASSES)) / np.sqrt(flat)).astype(np.float32)
    out["bd"] = np.zeros(CLASSES, np.float32)
    return out


def images(batch: int, image: int) -> np.ndarray:
    """A batch of input images (a fixed seed)."""
    return np.random.default_rng(1).random((batch, image, image, CHANNELS[0])).astype(np.float32)


def _conv_same(x: np.ndarray, w: np.ndarray) -> Any:
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    win = sliding_window_view(xp, (3, 3), axis=(1, 2))  # N, H, W, C, 3, 3
    cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(-1, 9 * x.shape[3])  # im2col
    return (cols @ w.reshape(-1, w.shape[3])).reshape(*x.shape[:3], w.shape[3])


def _max_pool2(x: np.ndarray) -> Any:
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def numpy_forward(x: np.ndarray, p: dict[str, np.ndarray]) -> Any:
    """The model's class probabilities, computed by numpy directly."""
    h = x
    for i in range(len(CHANNELS) - 1):
        h = _max_pool2(np.maximum(_conv_same(h, p[f"w{i}"]) + p[f"b{i}"], 0))
    logits = h.reshape(h.shape[0], -1) @ p["wd"] + p["bd"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def build(nn: Any, ops: Any, x: Any, p: dict[str, np.ndarray]) -> Any:
    """The model's probabilities in a graph: ``nn`` is ``af.nn`` or ``tf.compat.v1.nn``,
    ``ops`` the module with ``constant``, ``reshape`` and ``matmul``."""
    h = x
    for i in range(len(CHANNELS) - 1):
        h = nn.conv2d(h, ops.constant(p[f"w{i}"]), [1, 1, 1, 1], "SAME")
        h = nn.relu(nn.bias_add(h, ops.constant(p[f"b{i}"])))
        h = nn.max_pool(h, [1, 2, 2, 1], [1, 2, 2, 1], "VALID")
    flat = p["wd"].shape[0]
    logits = nn.bias_add(
        ops.matmul(ops.reshape(h, [-1, flat]), ops.constant(p["wd"])), ops.constant(p["bd"])
    )
    return nn.softmax(logits)
