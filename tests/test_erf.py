"""Erf / Erfc kernels: vectorised, against Python's math.erf / math.erfc.

float64 within one ulp (erf) and a few ulps relative (erfc, tails included, up to its
underflow near 26.5); float32 / float16 as math's value rounded to the dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import asyncflow as af
from asyncflow.framework import registry
from asyncflow.ops import special_math as _erf
from asyncflow.testing import reference_run as run

# A dense grid over every interval of the method, the interval edges, and both tails.
_EDGES = np.array([0.84375, 1.25, 1 / 0.35, 6.0, 26.0, 27.0, 28.0, 30.0])
GRID = np.concatenate(
    [
        np.linspace(-30.0, 30.0, 120_001),
        np.geomspace(1e-308, 30.0, 20_000),
        -np.geomspace(1e-308, 30.0, 20_000),
        np.nextafter(_EDGES, 0.0),
        _EDGES,
        np.nextafter(_EDGES, 99.0),
        -_EDGES,
        5e-324 * np.arange(1, 5),
    ]
)


def _math(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    return np.array([fn(float(v)) for v in x], np.float64)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(want))
    ulps: np.ndarray = np.abs(got.astype(np.float64) - want) / spacing
    return ulps


def test_erf_float64_within_one_ulp() -> None:
    got = _erf.erf(GRID)
    assert got.dtype == np.float64
    assert _ulps(got, _math(math.erf, GRID)).max() <= 1.0


def test_erfc_float64_relative_accuracy_into_the_tails() -> None:
    want = _math(math.erfc, GRID)
    got = _erf.erfc(GRID)
    normal = want > np.finfo(np.float64).tiny  # x < ~26.5: erfc not subnormal
    assert GRID[normal].max() > 26.0
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() < 1e-15, GRID[normal][np.argmax(rel)]
    # Where erfc is subnormal or 0, it stays within a few of the smallest steps.
    assert np.abs(got[~normal] - want[~normal]).max() < 1e-320


@pytest.mark.parametrize(("dtype", "tail"), [(np.float32, 10.0), (np.float16, 4.0)])
def test_erf_erfc_low_precision_dtypes_round_math(dtype: type, tail: float) -> None:
    x = np.concatenate([np.linspace(-tail, tail, 40_001), np.geomspace(1e-7, tail, 2000)])
    x = x.astype(dtype)
    for kernel, ref in ((_erf.erf, math.erf), (_erf.erfc, math.erfc)):
        got = kernel(x)
        assert got.dtype == dtype
        want: np.ndarray = _math(ref, x.astype(np.float64)).astype(dtype)
        finite = want != 0
        step = np.abs(
            got[finite].view(_int_of(dtype)).astype(np.int64)
            - want[finite].view(_int_of(dtype)).astype(np.int64)
        )
        assert step.max() <= 1, (kernel.__name__, x[finite][np.argmax(step)])


def _int_of(dtype: type) -> type:
    return np.int32 if dtype is np.float32 else np.int16


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_special_values(dtype: type) -> None:
    x: np.ndarray = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)
    e, c = _erf.erf(x), _erf.erfc(x)
    np.testing.assert_array_equal(e, np.array([0.0, -0.0, 1.0, -1.0, np.nan], dtype))
    np.testing.assert_array_equal(c, np.array([1.0, 1.0, 0.0, 2.0, np.nan], dtype))
    assert np.signbit(e[1])
    assert not np.signbit(e[0])


def test_scalars_shapes_and_blocks() -> None:
    assert isinstance(_erf.erf(np.float32(0.5)), np.float32)
    assert _erf.erfc(np.float64(1.0)) == pytest.approx(math.erfc(1.0), rel=1e-16)
    # More elements than one block, non-contiguous, 3-D: elementwise all the same.
    x = np.linspace(-8, 8, 3 * 40_000).reshape(3, 200, 200)[:, ::2, :]
    got = _erf.erfc(x)
    assert got.shape == x.shape
    np.testing.assert_allclose(got.ravel(), _math(math.erfc, x.ravel()), rtol=1e-15)
    assert _erf.erf(np.zeros((0, 3))).shape == (0, 3)


def test_input_left_unchanged() -> None:
    x = np.array([0.1, 1.0, 3.0, -5.0])
    before = x.copy()
    _erf.erf(x)
    _erf.erfc(x)
    np.testing.assert_array_equal(x, before)


def test_erf_erfc_ops_run_the_vectorised_kernels() -> None:
    x64 = np.array([-3.0, -0.5, 0.0, 0.7, 1.1, 2.0, 5.0, 27.0])
    with af.Graph().as_default():
        x = af.placeholder(af.float64, [None])
        e, c = af.erf(x), af.erfc(x)
        h = af.erfc(af.constant(x64.astype(np.float32)))
        got_e, got_c, got_h = run([e, c, h], {x: x64})
    for op, kernel in ((e.op, _erf.erf), (c.op, _erf.erfc)):
        assert registry.get_kernel(op.type).instantiate(op)[0] is kernel
    np.testing.assert_array_equal(got_e, _erf.erf(x64))
    np.testing.assert_allclose(got_e, _math(math.erf, x64), rtol=2e-16, atol=0)
    np.testing.assert_allclose(got_c, _math(math.erfc, x64), rtol=1e-15, atol=0)
    assert got_h.dtype == np.float32
    np.testing.assert_array_equal(
        got_h, _math(math.erfc, x64.astype(np.float32).astype(np.float64)).astype(np.float32)
    )
