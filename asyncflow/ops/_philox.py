"""TensorFlow's stateful random number streams: Philox4x32-10 and its distributions.

This reproduces ``tensorflow/core/lib/random/philox_random.h``,
``random_distributions.h`` and ``kernels/random_op.cc`` (CPU), so a seeded
``RandomUniform`` / ``RandomStandardNormal`` / ``TruncatedNormal`` yields TensorFlow's
numbers, run after run:

* the generator is ``PhiloxRandom(seed, seed2)``: key = the two 32-bit halves of
  ``seed``, counter = ``[0, 0, lo(seed2), hi(seed2)]`` (both 0: random seeds);
* every kernel call reserves ``256 * n`` 128-bit outputs for its ``n`` results
  (``ReserveRandomOutputs(n, 256)``) and fills them from a copy of the generator;
* fixed-size distributions take output group ``g`` from the counter + ``g``; the
  truncated normal (a variable number of samples per output) starts group ``g`` at
  counter + ``256 * g`` and draws Box-Muller pairs until 4 fall inside 2 sigma.

Vectorized with numpy over groups: one Philox block per group, 10 rounds of uint32
multiply-high/low done in uint64.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

__all__ = ["PhiloxStream"]

_W32A, _W32B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_M4A, _M4B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_RESERVED_PER_OUTPUT = 256  # TF's multiplier for ReserveRandomOutputs / variable samples


def _blocks(key: tuple[int, int], counter: int, offsets: np.ndarray) -> np.ndarray:
    """Philox4x32-10 outputs for counters ``counter + offsets``: shape ``(len, 4)`` uint32."""
    total = np.uint64(counter & 0xFFFFFFFFFFFFFFFF) + offsets.astype(np.uint64)
    carry = (total < offsets.astype(np.uint64)).astype(np.uint64)
    high = np.uint64((counter >> 64) & 0xFFFFFFFFFFFFFFFF) + carry
    c0, c1 = total & _MASK32, total >> _SHIFT32
    c2, c3 = high & _MASK32, high >> _SHIFT32
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        p0 = _M4A * c0
        p1 = _M4B * c2
        c0, c1, c2, c3 = (
            (p1 >> _SHIFT32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> _SHIFT32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
        if r < 9:
            k0, k1 = (k0 + _W32A) & _MASK32, (k1 + _W32B) & _MASK32
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _uint32_to_float(x: np.ndarray) -> np.ndarray:
    """TF's ``Uint32ToFloat``: 23 random mantissa bits, exponent of 1.0, minus 1."""
    bits = (x & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)
    return bits.view(np.float32) - np.float32(1.0)


def _uint64_to_double(x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    """TF's ``Uint64ToDouble(x0, x1)``: 52 mantissa bits, x0 the high 20 of them."""
    man = ((x0.astype(np.uint64) & np.uint64(0xFFFFF)) << _SHIFT32) | x1.astype(np.uint64)
    bits = man | np.uint64(0x3FF0000000000000)
    return bits.view(np.float64) - 1.0


def _box_muller_float(x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u1 = np.maximum(_uint32_to_float(x0), np.float32(1.0e-7))
    v1 = np.float32(2.0 * np.pi) * _uint32_to_float(x1)
    u2 = np.sqrt(np.float32(-2.0) * np.log(u1))
    return np.sin(v1) * u2, np.cos(v1) * u2


def _box_muller_double(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u1 = np.maximum(_uint64_to_double(x[:, 0], x[:, 1]), 1.0e-7)
    v1 = 2.0 * np.pi * _uint64_to_double(x[:, 2], x[:, 3])
    u2 = np.sqrt(-2.0 * np.log(u1))
    return np.sin(v1) * u2, np.cos(v1) * u2


class PhiloxStream:
    """One op's random stream in one session (TF's ``GuardedPhiloxRandom``)."""

    def __init__(self, seed: int, seed2: int) -> None:
        if seed == 0 and seed2 == 0:
            seed = int.from_bytes(os.urandom(8), "little")
            seed2 = int.from_bytes(os.urandom(8), "little")
        seed &= 0xFFFFFFFFFFFFFFFF
        seed2 &= 0xFFFFFFFFFFFFFFFF
        self._key = (seed & 0xFFFFFFFF, seed >> 32)
        self._counter = seed2 << 64
        self._lock = threading.Lock()

    def _reserve(self, n: int) -> int:
        """The counter to fill ``n`` outputs from; advances the stream past them."""
        with self._lock:
            counter = self._counter
            self._counter = (counter + n * _RESERVED_PER_OUTPUT) % (1 << 128)
            return counter

    def uniform(self, n: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``n`` values in ``[0, 1)`` (``RandomUniform``)."""
        counter = self._reserve(n)
        if dtype == np.float64:
            blocks = _blocks(self._key, counter, np.arange(-(-n // 2)))
            return _uint64_to_double(blocks[:, 0::2].reshape(-1), blocks[:, 1::2].reshape(-1))[:n]
        blocks = _blocks(self._key, counter, np.arange(-(-n // 4)))
        if dtype == np.float16:
            bits = (blocks.reshape(-1) & np.uint32(0x3FF)).astype(np.uint16) | np.uint16(0x3C00)
            return (bits.view(np.float16) - np.float16(1.0))[:n]
        return _uint32_to_float(blocks.reshape(-1))[:n].astype(dtype, copy=False)

    def uniform_int(self, n: int, lo: int, hi: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``n`` integers in ``[lo, hi)`` (``RandomUniformInt``: ``lo + bits % (hi - lo)``)."""
        counter = self._reserve(n)
        span = hi - lo
        values: np.ndarray
        if dtype == np.int64:
            wide = _blocks(self._key, counter, np.arange(-(-n // 2))).astype(np.uint64)
            bits64 = wide[:, 0::2].reshape(-1) | (wide[:, 1::2].reshape(-1) << _SHIFT32)
            values = bits64 % np.uint64(span)
        else:
            bits32 = _blocks(self._key, counter, np.arange(-(-n // 4))).reshape(-1)
            values = bits32 % np.uint32(span)
        return (values[:n].astype(np.int64) + lo).astype(dtype)

    def normal(self, n: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``n`` standard normal values (``RandomStandardNormal``)."""
        counter = self._reserve(n)
        if dtype == np.float64:
            blocks = _blocks(self._key, counter, np.arange(-(-n // 2)))
            f0, f1 = _box_muller_double(blocks)
            return np.stack([f0, f1], axis=-1).reshape(-1)[:n]
        blocks = _blocks(self._key, counter, np.arange(-(-n // 4)))
        a0, a1 = _box_muller_float(blocks[:, 0], blocks[:, 1])
        b0, b1 = _box_muller_float(blocks[:, 2], blocks[:, 3])
        out = np.stack([a0, a1, b0, b1], axis=-1).reshape(-1)[:n]
        return out.astype(dtype, copy=False)

    def truncated_normal(self, n: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``n`` standard normal values redrawn outside two sigma (``TruncatedNormal``).

        float32 (and float16, computed in float32): each group of 4 outputs reads
        uint32 pairs from its own region; float64: groups of 2, each value from 4 uint32.
        """
        counter = self._reserve(n)
        wide = dtype == np.float64
        group = 2 if wide else 4
        groups = -(-n // group)
        starts = np.arange(groups) * (group * _RESERVED_PER_OUTPUT // 4)
        out = np.empty((groups, group), np.float64 if wide else np.float32)
        filled = np.zeros(groups, np.int64)
        step = 0
        while True:
            todo = np.flatnonzero(filled < group)
            if not todo.size:
                break
            blocks = _blocks(self._key, counter, starts[todo] + step)
            if wide:
                f0, f1 = _box_muller_double(blocks)
                pairs = [(f0, f1)]
            else:
                pairs = [
                    _box_muller_float(blocks[:, 0], blocks[:, 1]),
                    _box_muller_float(blocks[:, 2], blocks[:, 3]),
                ]
            for f0, f1 in pairs:
                for f in (f0, f1):
                    ok = (np.abs(f) < 2.0) & (filled[todo] < group)
                    rows = todo[ok]
                    out[rows, filled[rows]] = f[ok]
                    filled[rows] += 1
            step += 1
        return out.reshape(-1)[:n].astype(dtype, copy=False)
