"""Resize kernels against TF's formulas, pixel by pixel, bit for bit.

The kernels gather and interpolate whole rows at once (and interpolate each source
row once, however many output rows read it); the reference below is TF's
``resize_bilinear_op.cc`` / ``resize_nearest_neighbor_op.cc`` written out one output
pixel at a time in float32, so that any change to the order of the float32
operations (which would change the rounding) shows as a mismatch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import asyncflow as af

CORNERS = [(False, False), (True, False), (False, True)]
F = np.float32


def _scale(in_size: int, out_size: int, align: bool) -> np.float32:
    if align and out_size > 1:
        return F(in_size - 1) / F(out_size - 1)
    return F(in_size) / F(out_size)


def _bilinear_bounds(i: int, in_size: int, out_size: int, align: bool, half: bool) -> Any:
    scale = _scale(in_size, out_size, align)
    src = (F(i) + F(0.5)) * scale - F(0.5) if half else F(i) * scale
    lower = max(math.floor(src), 0)
    upper = min(math.ceil(src), in_size - 1)
    return lower, upper, F(src - F(math.floor(src)))


def reference_bilinear(images: np.ndarray, out_h: int, out_w: int, align: bool, half: bool) -> Any:
    n, in_h, in_w, c = images.shape
    out = np.empty((n, out_h, out_w, c), np.float32)
    for y in range(out_h):
        y0, y1, ly = _bilinear_bounds(y, in_h, out_h, align, half)
        for x in range(out_w):
            x0, x1, lx = _bilinear_bounds(x, in_w, out_w, align, half)
            for b in range(n):
                for ch in range(c):
                    tl, tr = F(images[b, y0, x0, ch]), F(images[b, y0, x1, ch])
                    bl, br = F(images[b, y1, x0, ch]), F(images[b, y1, x1, ch])
                    top = tl + (tr - tl) * lx
                    bottom = bl + (br - bl) * lx
                    out[b, y, x, ch] = top + (bottom - top) * ly
    return out


def _nearest_source(i: int, in_size: int, out_size: int, align: bool, half: bool) -> int:
    scale = _scale(in_size, out_size, align)
    src = (F(i) + F(0.5)) * scale if half else F(i) * scale
    if align:  # roundf: halves away from zero
        index = math.floor(src) + (1 if src - F(math.floor(src)) >= F(0.5) else 0)
    else:
        index = math.floor(src)
    index = min(index, in_size - 1)
    return max(index, 0) if half else index


def reference_nearest(images: np.ndarray, out_h: int, out_w: int, align: bool, half: bool) -> Any:
    ys = [_nearest_source(y, images.shape[1], out_h, align, half) for y in range(out_h)]
    xs = [_nearest_source(x, images.shape[2], out_w, align, half) for x in range(out_w)]
    return images[:, ys][:, :, xs]


def _cases(seed: int, count: int) -> list[tuple[np.ndarray, int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    dtypes = [np.uint8, np.float32, np.float64, np.int32, np.uint16]
    for k in range(count):
        shape = tuple(int(v) for v in rng.integers(1, [3, 12, 12, 5]))
        values = rng.random(shape) * 300 - (0 if k % 2 else 20)
        images = values.astype(dtypes[k % len(dtypes)]) if k % 2 else values.astype(np.float32)
        out.append((images, int(rng.integers(1, 20)), int(rng.integers(1, 20))))
    return out


@pytest.mark.parametrize(("align", "half"), CORNERS)
def test_resizes_are_tfs_formulas_bit_for_bit(align: bool, half: bool) -> None:
    cases = _cases(7, 24)
    with af.Graph().as_default():
        x = af.placeholder(af.float32, name="x")
        size = af.placeholder(af.int32, (2,), name="size")
        bilinear = af.image.resize_bilinear(x, size, align, half)
        nearest = af.image.resize_nearest_neighbor(x, size, align, half)
        with af.Session() as sess:
            for images, out_h, out_w in cases:
                feeds = {x: images.astype(np.float32), size: np.array([out_h, out_w], np.int32)}
                got_bilinear, got_nearest = sess.run_sync([bilinear, nearest], feeds)
                want = reference_bilinear(images.astype(np.float32), out_h, out_w, align, half)
                np.testing.assert_array_equal(got_bilinear, want)
                np.testing.assert_array_equal(
                    got_nearest, reference_nearest(feeds[x], out_h, out_w, align, half)
                )


@pytest.mark.parametrize(("align", "half"), CORNERS)
def test_every_input_dtype_is_read_as_tf_reads_it(align: bool, half: bool) -> None:
    """Bilinear reads each pixel as float32 (whatever the input's dtype), nearest keeps
    the input's dtype and values; images of several rows, read by several output rows."""
    from asyncflow.ops import image_ops

    for images, out_h, out_w in _cases(11, 30):
        got = image_ops._bilinear(images, out_h, out_w, align, half)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(
            got, reference_bilinear(images, out_h, out_w, align, half), err_msg=str(images.dtype)
        )


def test_a_bad_size_is_refused_with_its_shape() -> None:
    with af.Graph().as_default():
        x = af.placeholder(af.float32, (1, 4, 4, 3), name="x")
        size = af.placeholder(af.int32, name="size")
        out = af.image.resize_bilinear(x, size, name="resized")
        with af.Session() as sess:
            images = np.zeros((1, 4, 4, 3), np.float32)
            with pytest.raises(
                af.errors.InvalidArgumentError,
                match=r"size must be a 1-D tensor of 2 elements, got shape \[3\][\s\S]*resized",
            ):
                sess.run_sync(out, {x: images, size: np.array([2, 2, 2], np.int32)})
            assert sess.run_sync(out, {x: images, size: np.array([2, 3], np.int32)}).shape == (
                1,
                2,
                3,
                3,
            )
