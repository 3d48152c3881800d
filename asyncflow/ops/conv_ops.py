"""Convolution and pooling: Conv2D, DepthwiseConv2dNative, MaxPool, AvgPool (``af.nn``).

The kernels are numpy vectorized: the padded input is viewed as strided, dilated
windows (a strided view, no copy), then copied into columns (im2col) and multiplied
by the filter in one BLAS matmul, or reduced (pooling).  Everything runs in NHWC;
NCHW inputs are transposed in and out.

Geometry follows TensorFlow exactly: ``VALID`` uses no padding; ``SAME`` gives
``ceil(in / stride)`` outputs with the padding split as ``(total // 2, total - total // 2)``
(the extra row/column at the bottom/right); ``EXPLICIT`` takes TF's
``explicit_paddings`` (8 ints, ``[before, after]`` per dimension in data format order).

A convolution worth a thread hop (``_EXPENSIVE_MACS`` multiply-adds or more) runs on a
worker thread of its device; numpy's BLAS releases the GIL meanwhile.  Smaller ones
run inline.  On a worker thread, a GEMM of ``_BOOST_MACS`` or more gets more BLAS
threads when its kernel runs alone (:func:`_gemm_threads`).  The static shapes decide
when they are known; a graph with an unknown batch (every exported model) is sized by
its fed input at run time instead (:class:`_RunTimeSized`), so the same graph runs
batch 1 inline and batch 8 threaded.
A 1x1 convolution is a plain GEMM of the pixels; a depthwise convolution one
``einsum`` over the window view; ``_FusedConv2D`` (made by the optimizer, see
``asyncflow.compiler.fold_batchnorm``) adds the bias and clamps in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape
from asyncflow.ops import onednn
from asyncflow.ops._base import define_op, make_op
from asyncflow.ops.nn_ops import channel_rows
from asyncflow.runtime.cancellation import running
from asyncflow.runtime.devices import LocalDevice, available_cores, blas_governor, ready_now
from asyncflow.runtime.resources import WOULD_BLOCK

__all__ = ["avg_pool", "conv2d", "conv2d_transpose", "depthwise_conv2d", "max_pool"]

Specs = list[tuple[dtypes.DType, Any]]

#: GEMMs with at least this many multiply-adds (~0.3 ms on one core) of a kernel on a
#: worker thread get more than one BLAS thread when it runs alone; smaller ones lose
#: more waiting for BLAS helper threads on a busy machine.
_BOOST_MACS = 1 << 24

#: Convolutions with at least this many multiply-adds run on a worker thread (where a
#: large GEMM can get BLAS threads).  Smaller ones run inline: on real models (ResNet50,
#: MobileNetV2, a v1 ResNet block) a thread hop per convolution cost more than the
#: convolution (batch-1 latency 0.76 -> 0.41 ms, batch-8 time 68 -> 18 ms measured
#: against 2**20), and under load each hop may wait for a core.
_EXPENSIVE_MACS = _BOOST_MACS
#: From how many multiply-adds a k x k (a 1x1) convolution runs on oneDNN (see _onednn).
_ONEDNN_MACS = 1 << 17
_ONEDNN_1X1_MACS = 1 << 20

#: A convolution with a free batch is sized at run time only when this batch of its
#: images would reach ``_EXPENSIVE_MACS``; smaller ones stay inline whatever the batch.
#: The run-time decision makes the kernel an async one, and a plan with an async node
#: loses the executor's all-inline path: the 32x32 zoo models' batch-1 steps took
#: 0.05-0.1 ms (15-20%) longer, and their batch-8 convolutions (resnet_v1_block's 2.4M
#: multiply-adds per image) were no faster on threads.
_SIZED_BATCH = 4

_FLOATS = (dtypes.float16, dtypes.float32, dtypes.float64)


# -- geometry ---------------------------------------------------------------------------


def _out_and_pads(
    size: int | None,
    k: int | None,
    stride: int,
    dilation: int,
    padding: str,
    explicit: tuple[int, int],
) -> tuple[int | None, tuple[int, int] | None]:
    """Output length and ``(before, after)`` padding of one spatial dimension."""
    if size is None or k is None:
        return None, None
    ek = (k - 1) * dilation + 1
    if padding == "VALID":
        return max(-(-(size - ek + 1) // stride), 0), (0, 0)
    if padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + ek - size, 0)
        return out, (total // 2, total - total // 2)
    before, after = explicit
    return max((size + before + after - ek) // stride + 1, 0), (before, after)


def _check_format(attrs: Mapping[str, Any]) -> bool:
    """True for NCHW; ``ValueError`` for formats that are neither."""
    fmt = attrs["data_format"]
    if fmt not in ("NHWC", "NCHW"):
        raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got {fmt!r}")
    return bool(fmt == "NCHW")


def _spatial(values: Sequence[int], nchw: bool, what: str) -> tuple[int, int]:
    if len(values) != 4:
        raise ValueError(f"{what} must have 4 elements, got {list(values)}")
    n, a, b, c = (values[0], values[2], values[3], values[1]) if nchw else values
    if n != 1 or c != 1:
        raise ValueError(f"{what} on the batch and depth dimensions must be 1, got {list(values)}")
    if a < 1 or b < 1:
        raise ValueError(f"{what} must be >= 1, got {list(values)}")
    return a, b


def _explicit(attrs: Mapping[str, Any], nchw: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    if attrs["padding"] != "EXPLICIT":
        return (0, 0), (0, 0)
    pads = list(attrs.get("explicit_paddings") or [])
    if len(pads) != 8 or any(p < 0 for p in pads):
        raise ValueError(f"explicit_paddings must be 8 non-negative ints, got {pads}")
    if nchw:
        return (pads[4], pads[5]), (pads[6], pads[7])
    if pads[0] or pads[1] or pads[6] or pads[7]:
        raise ValueError(
            f"explicit_paddings on the batch and depth dimensions must be 0, got {pads}"
        )
    return (pads[2], pads[3]), (pads[4], pads[5])


def _check_padding(attrs: Mapping[str, Any], allow_explicit: bool) -> None:
    allowed = ("SAME", "VALID", "EXPLICIT") if allow_explicit else ("SAME", "VALID")
    if attrs["padding"] not in allowed:
        raise ValueError(f"padding must be one of {', '.join(allowed)}, got {attrs['padding']!r}")


def _nhwc_dims(x: Tensor, nchw: bool, what: str) -> list[int | None]:
    if x._shape.rank is None:
        return [None, None, None, None]
    if x._shape.rank != 4:
        raise ValueError(f"{what} must be rank 4, got shape {x._shape} ({x.name})")
    d = x._shape.as_list()
    return [d[0], d[2], d[3], d[1]] if nchw else d


def _from_nhwc(dims: list[int | None], nchw: bool) -> TensorShape:
    n, h, w, c = dims
    return TensorShape([n, c, h, w] if nchw else [n, h, w, c])


def _float_input(t: Tensor) -> None:
    if t._dtype not in _FLOATS:
        raise TypeError(
            f"input {t.name!r} has dtype {t._dtype.name}, expected float16, float32 or float64"
        )


# -- shape functions ----------------------------------------------------------------------


def _conv_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any], depthwise: bool) -> Specs:
    x, f = inputs
    _float_input(x)
    if f._dtype is not x._dtype:
        raise TypeError(
            f"filter {f.name!r} has dtype {f._dtype.name}, input {x.name!r} has {x._dtype.name}"
        )
    nchw = _check_format(attrs)
    _check_padding(attrs, allow_explicit=True)
    sh, sw = _spatial(attrs["strides"], nchw, "strides")
    dh, dw = _spatial(attrs["dilations"], nchw, "dilations")
    ph, pw = _explicit(attrs, nchw)
    n, h, w, c = _nhwc_dims(x, nchw, "input")
    if f._shape.rank is not None and f._shape.rank != 4:
        raise ValueError(f"filter must be rank 4, got shape {f._shape} ({f.name})")
    kh, kw, fc, fo = f._shape.as_list() if f._shape.rank == 4 else [None] * 4
    if c is not None and fc is not None and c != fc:
        raise ValueError(
            f"input depth {c} does not match the filter's in_channels {fc} "
            f"(input {x.name!r} shape {x._shape}, filter {f.name!r} shape "
            f"{f._shape})"
        )
    oh, _ = _out_and_pads(h, kh, sh, dh, attrs["padding"], ph)
    ow, _ = _out_and_pads(w, kw, sw, dw, attrs["padding"], pw)
    if depthwise:
        cin = c if c is not None else fc
        out_c = cin * fo if cin is not None and fo is not None else None
    else:
        out_c = fo
    return [(x._dtype, _from_nhwc([n, oh, ow, out_c], nchw))]


def _pool_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not (x._dtype.is_floating or x._dtype.is_integer):
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a real dtype")
    nchw = _check_format(attrs)
    _check_padding(attrs, allow_explicit=False)
    kh, kw = _spatial(attrs["ksize"], nchw, "ksize")
    sh, sw = _spatial(attrs["strides"], nchw, "strides")
    n, h, w, c = _nhwc_dims(x, nchw, "input")
    oh, _ = _out_and_pads(h, kh, sh, 1, attrs["padding"], (0, 0))
    ow, _ = _out_and_pads(w, kw, sw, 1, attrs["padding"], (0, 0))
    return [(x._dtype, _from_nhwc([n, oh, ow, c], nchw))]


define_op("Conv2D", lambda inputs, attrs: _conv_shape(inputs, attrs, depthwise=False))
define_op("DepthwiseConv2dNative", lambda inputs, attrs: _conv_shape(inputs, attrs, depthwise=True))


def _conv_backprop_input_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    sizes, f, dy = inputs
    _float_input(dy)
    if f._dtype is not dy._dtype:
        raise TypeError(
            f"filter {f.name!r} has dtype {f._dtype.name}, out_backprop "
            f"{dy.name!r} has {dy._dtype.name}"
        )
    if sizes._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"input_sizes {sizes.name!r} must be int32 or int64")
    nchw = _check_format(attrs)
    _check_padding(attrs, allow_explicit=True)
    _spatial(attrs["strides"], nchw, "strides")
    _spatial(attrs["dilations"], nchw, "dilations")
    _nhwc_dims(dy, nchw, "out_backprop")
    if f._shape.rank not in (4, None):
        raise ValueError(f"filter must be rank 4, got shape {f._shape} ({f.name})")
    o = _nhwc_dims(dy, nchw, "out_backprop")[3]
    if f._shape.rank == 4 and o is not None and f._shape[3] not in (None, o):
        raise ValueError(
            f"out_backprop depth {o} does not match the filter's out_channels "
            f"{f._shape[3]} (filter {f.name!r} shape {f._shape})"
        )
    value = sizes._op._attrs.get("value") if sizes._op._type == "Const" else None
    if value is None:
        return [(dy._dtype, TensorShape([None] * 4))]
    dims = [int(d) for d in np.asarray(value).reshape(-1)]
    if len(dims) != 4:
        raise ValueError(f"input_sizes must have 4 elements, got {dims}")
    c = dims[1] if nchw else dims[3]
    if f._shape.rank == 4 and f._shape[2] not in (None, c):
        raise ValueError(
            f"input_sizes depth {c} does not match the filter's in_channels {f._shape[2]}"
        )
    return [(dy._dtype, TensorShape(dims))]


define_op("Conv2DBackpropInput", _conv_backprop_input_shape)
define_op("MaxPool", _pool_shape)
define_op("AvgPool", _pool_shape)


# -- kernels ---------------------------------------------------------------------------


def _pad(x: np.ndarray, ph: tuple[int, int], pw: tuple[int, int], value: Any) -> np.ndarray:
    """``x`` (NHWC) padded spatially with ``value``: the border filled, the inside copied
    once (``np.pad`` costs tens of microseconds of Python per call on top, and filling
    the whole buffer first writes the inside twice: a batch-8 MobileNet step spent 6%
    of its time there)."""
    if not (ph[0] or ph[1] or pw[0] or pw[1]):
        return x
    n, h, w, c = x.shape
    top, left = ph[0], pw[0]
    bottom, right = top + h, left + w
    out = np.empty((n, bottom + ph[1], right + pw[1], c), x.dtype)
    out[:, :top] = value
    out[:, bottom:] = value
    out[:, top:bottom, :left] = value
    out[:, top:bottom, right:] = value
    out[:, top:bottom, left:right] = x
    return out


def _padded(
    x: np.ndarray,
    k: tuple[int, int],
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
    pad_value: Any,
) -> tuple[np.ndarray, int, int]:
    """``x`` (NHWC) padded as the geometry says, and the output height and width."""
    oh, ph = _out_and_pads(x.shape[1], k[0], s[0], d[0], padding, explicit[0])
    ow, pw = _out_and_pads(x.shape[2], k[1], s[1], d[1], padding, explicit[1])
    assert oh is not None
    assert ow is not None
    assert ph is not None
    assert pw is not None
    return _pad(x, ph, pw, pad_value), oh, ow


def _onednn(
    cache: dict[Any, Any],
    x: np.ndarray,
    f: np.ndarray,
    b: np.ndarray | None,
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
    activation: str | None,
    residual: np.ndarray | None = None,
) -> np.ndarray | None:
    """The ``Conv2D`` through oneDNN (:mod:`asyncflow.ops.onednn`), or None: oneDNN is
    not there, does not take these inputs, or would not be faster (numpy's kernel runs).

    Measured per call on this project's 2-core machine, bias and ``Relu`` included: a
    oneDNN call costs ~8 us before any work (its ``ctypes`` calls), so a k x k
    convolution goes to oneDNN from ``_ONEDNN_MACS`` multiply-adds (at 147K 8.4 us
    against numpy's 12.3, at 0.6M 11-13 against 17-22), a 1x1 one, which numpy runs as
    one GEMM without a window copy, from ``_ONEDNN_1X1_MACS`` (at 0.5-0.6M 15-16 us
    against 12-16, at 1M 35 against 43; a 1x1 to few outputs is numpy's GEMM's at any
    size: 4.7M to 24 outputs 75 us against 72).  Depthwise convolutions stay numpy's (their kernels do not
    call this): with the filter as numpy holds it oneDNN runs one as a small GEMM per
    channel (MobileNetV2 at batch 8: 3.7 ms of depthwise layers against numpy's ~1)."""
    if not onednn.available() or x.ndim != 4 or f.ndim != 4:
        return None
    taps = f.shape[0] * f.shape[1]
    macs = x.size * taps * f.shape[3] // (s[0] * s[1])
    if macs < (_ONEDNN_MACS if taps > 1 else _ONEDNN_1X1_MACS):
        return None
    oh, ph = _out_and_pads(x.shape[1], f.shape[0], s[0], d[0], padding, explicit[0])
    ow, pw = _out_and_pads(x.shape[2], f.shape[1], s[1], d[1], padding, explicit[1])
    if not oh or not ow or ph is None or pw is None or not x.size:
        return None  # (an empty output: numpy's kernel shapes it)
    return onednn.convolution(cache, x, f, b, s, d, (ph, pw), (oh, ow), activation, residual)


def _tap(x: np.ndarray, i: int, j: int, oh: int, ow: int, s: tuple[int, int]) -> np.ndarray:
    """The strided view of padded ``x`` that window offset ``(i, j)`` reads (no copy)."""
    return x[:, i : i + (oh - 1) * s[0] + 1 : s[0], j : j + (ow - 1) * s[1] + 1 : s[1], :]


def _gemm(a: np.ndarray, b: np.ndarray) -> Any:
    """``a @ b``, with BLAS threads as :func:`_gemm_threads` says."""
    with _gemm_threads(a.shape[0] * a.shape[1] * b.shape[1]) as ready:
        ready()
        return a @ b


def _gemm_threads(macs: int) -> contextlib.AbstractContextManager[Callable[[], object]]:
    """A product of ``macs`` multiply-adds large enough to gain from BLAS threads gets
    its share of the cores inside the block (see
    :class:`asyncflow.runtime.devices.BlasGovernor`); the block calls what it is given
    right before its BLAS call."""
    if macs < _BOOST_MACS or getattr(_part, "active", False):
        return contextlib.nullcontext(ready_now)
    return blas_governor().boost()


def _windows(
    x: np.ndarray,
    k: tuple[int, int],
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
    pad_value: Any,
) -> np.ndarray:
    """``x`` (NHWC) as a ``(N, OH, OW, C, KH, KW)`` view of its (padded) windows."""
    x, oh, ow = _padded(x, k, s, d, padding, explicit, pad_value)
    ek = ((k[0] - 1) * d[0] + 1, (k[1] - 1) * d[1] + 1)
    if oh == 0 or ow == 0:  # (the other spatial dimension keeps its size, as TF's)
        return np.zeros((x.shape[0], oh, ow, x.shape[3], k[0], k[1]), x.dtype)
    n, hp, wp, c = x.shape
    if (oh - 1) * s[0] + ek[0] > hp or (ow - 1) * s[1] + ek[1] > wp:  # (never: the pads fit)
        raise ValueError(f"{oh}x{ow} windows of {ek} do not fit a {hp}x{wp} input")
    # The strided, dilated window view built directly: sliding_window_view and slicing
    # it cost 15 us of Python per call, as_strided 2.3, the ndarray constructor over a
    # contiguous x's buffer 0.5 (a ResNet block's six convolutions at batch 1 spent 15%
    # of their time in the first).
    sn, sh, sw, sc = x.strides
    shape = (n, oh, ow, c, k[0], k[1])
    strides = (sn, sh * s[0], sw * s[1], sc, sh * d[0], sw * d[1])
    if not x.flags.c_contiguous:
        return as_strided(x, shape, strides, writeable=False)
    view = np.ndarray(shape, x.dtype, x, 0, strides)
    view.flags.writeable = False
    return view


def _geometry(op: Operation, ksize_attr: str | None) -> tuple[bool, Any]:
    attrs = op._attrs
    nchw = attrs["data_format"] == "NCHW"
    s = _spatial(attrs["strides"], nchw, "strides")
    d = _spatial(attrs["dilations"], nchw, "dilations") if "dilations" in attrs else (1, 1)
    k = _spatial(attrs[ksize_attr], nchw, "ksize") if ksize_attr else None
    explicit = _explicit(attrs, nchw)
    return nchw, (k, s, d, attrs["padding"], explicit)


def _in_nhwc(fn: Callable[..., Any], nchw: bool) -> Callable[..., Any]:
    if not nchw:
        return fn

    def nchw_kernel(x: np.ndarray, *rest: Any) -> Any:
        y = fn(np.transpose(x, (0, 2, 3, 1)), *rest)
        return np.ascontiguousarray(np.transpose(y, (0, 3, 1, 2)))

    return nchw_kernel


def _static_macs(op: Operation) -> tuple[int, bool] | None:
    """The op's multiply-adds by its static shapes (unknown dimensions counted as 1) and
    whether every dimension was known; None when a rank is unknown."""
    out = op._outputs[0]._shape
    f = op._inputs[1]._shape
    if out.rank is None or f.rank is None:
        return None
    kh, kw, c, _ = (d or 1 for d in f)
    depthwise = op._attrs.get("conv_op", op._type) != "Conv2D"
    macs = math.prod(d or 1 for d in out) * kh * kw * (1 if depthwise else c)
    known = out.is_fully_defined() and f.is_fully_defined()
    return macs, known


def _sized(
    op: Operation,
    kernel: Callable[..., Any],
    macs: Callable[..., int],
    split: bool = True,
    batched: tuple[int, ...] = (0,),
) -> tuple[Callable[..., Any], int]:
    """``kernel`` and its kind: decided now when the static shapes settle it (small: inline;
    large with a batch of 1: a worker thread), else by the inputs' actual size at run
    time (:class:`_RunTimeSized`, which may also ``split`` a batch across threads).

    A graph built with an unknown batch (every exported model) would otherwise be sized
    as batch 1, and a batch-8 convolution run inline on the event loop with one BLAS
    thread.
    """
    static = _static_macs(op)
    if static is not None and static[1] and static[0] < _EXPENSIVE_MACS:
        return kernel, registry.INLINE
    if static is not None and _only_batch_free(op) and static[0] * _SIZED_BATCH < _EXPENSIVE_MACS:
        return kernel, registry.INLINE  # small images: inline at any batch worth serving
    batch = op._outputs[0]._shape[0] if op._outputs[0]._shape.rank else None
    if static is not None and static[0] >= _EXPENSIVE_MACS and batch == 1:
        return kernel, registry.EXPENSIVE
    return _RunTimeSized(kernel, macs, split, batched), registry.ASYNC


def _only_batch_free(op: Operation) -> bool:
    """Every dimension of the output and the filter is known but the batch."""
    out = op._outputs[0]._shape
    return (
        out.rank == 4
        and all(d is not None for d in out.as_list()[1:])
        and op._inputs[1]._shape.is_fully_defined()
    )


class _RunTimeSized:
    """A kernel that runs inline when its inputs are small and on the worker threads of
    the step's device when they are large.

    The executor calls :meth:`nowait` first, like an inline kernel: it computes at once
    below ``_EXPENSIVE_MACS`` multiply-adds (a few microseconds to size), else answers
    ``WOULD_BLOCK`` and the executor awaits the call, which hops to the device's threads.
    A batch of several images is split into parts, one kernel call each on one of the
    device's threads (one BLAS thread each): every part of the convolution (window copy,
    GEMM, depthwise einsum, bias, clamp) runs on all the cores.  (A GEMM boosted to
    several BLAS threads parallelises the GEMM only, and on a loaded machine waits for
    its slowest helper thread: ResNet50 64px batch 8 had a 140 ms median for a 40 ms
    minimum, split 48 ms for 45.)
    A single image is one call, whose large GEMMs may get BLAS threads (:func:`_gemm`).
    """

    __slots__ = ("_batched", "_kernel", "_macs", "_split")

    def __init__(
        self,
        kernel: Callable[..., Any],
        macs: Callable[..., int],
        split: bool,
        batched: tuple[int, ...] = (0,),
    ) -> None:
        self._kernel = kernel
        self._macs = macs
        self._split = split
        self._batched = batched  # the arguments a split cuts along the batch

    def nowait(self, *args: Any) -> Any:
        if self._macs(*args) < _EXPENSIVE_MACS:
            return self._kernel(*args)
        return WOULD_BLOCK

    async def __call__(self, *args: Any) -> Any:
        device = _step_device()
        if device is None:  # (not run by a step's executor: nothing to hop to)
            return self._kernel(*args)
        parts = _parts(args[0].shape[0] if args[0].ndim else 1, device) if self._split else 1
        if parts <= 1:
            return await device.run_in_thread(self._kernel, *args)
        cuts = [len(args[0]) * i // parts for i in range(parts + 1)]
        batched = self._batched
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(
                        device.run_in_thread(
                            _unboosted,
                            self._kernel,
                            *(v[a:b] if k in batched else v for k, v in enumerate(args)),
                        )
                    )
                    for a, b in itertools.pairwise(cuts)
                ]
        except BaseExceptionGroup as eg:  # the first failure, as one kernel call raises it
            raise eg.exceptions[0] from None
        return np.concatenate([t.result() for t in tasks])


def _parts(batch: int, device: LocalDevice) -> int:
    """How many parts a batch is split into: one per thread that can run at once, one
    image at least per part.  (Two per thread, so that a thread finishing early takes
    another, cost more in thread hops than they saved: ResNet50 64px batch 8 at 56 ms
    minimum against 45 ms, measured interleaved on a loaded 2-core machine.)"""
    width = min(device.max_threads, available_cores())
    return 1 if width < 2 else min(batch, width)


_part = threading.local()  # .active: this thread computes one part of a split batch


def _unboosted(kernel: Callable[..., Any], *args: Any) -> Any:
    """``kernel(*args)`` as one part of a split batch: its GEMMs keep one BLAS thread (the
    other parts use the other cores)."""
    _part.active = True
    try:
        return kernel(*args)
    finally:
        _part.active = False


def _step_device() -> LocalDevice | None:
    """The device whose step is running this kernel (None outside a step)."""
    device = getattr(running(), "device", None)
    return device if isinstance(device, LocalDevice) else None


def _conv_macs(s: tuple[int, int]) -> Callable[..., int]:
    """About the multiply-adds of a convolution (``Conv2D`` and depthwise alike) of
    ``x`` by ``f`` with strides ``s``: each input element meets ``kh * kw * f.shape[3]``
    filter taps (outputs, or outputs per channel), once per stride step."""
    step = s[0] * s[1]

    def macs(x: np.ndarray, f: np.ndarray, *_: Any) -> int:
        return int(x.size * f.shape[0] * f.shape[1] * f.shape[3]) // step

    return macs


def _backprop_macs(sizes: np.ndarray, f: np.ndarray, dy: np.ndarray) -> int:
    return int(dy.size * f.shape[0] * f.shape[1] * f.shape[2])


@registry.register_kernel_factory("Conv2D")
def _conv2d_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    nchw, (_, s, d, padding, explicit) = _geometry(op, None)
    cache: dict[Any, Any] = {}  # oneDNN's primitives, per geometry

    def conv2d_kernel(x: np.ndarray, f: np.ndarray) -> Any:
        y = _onednn(cache, x, f, None, s, d, padding, explicit, None)
        return _conv2d(x, f, s, d, padding, explicit) if y is None else y

    return _sized(op, _in_nhwc(conv2d_kernel, nchw), _conv_macs(s))


def _conv2d(
    x: np.ndarray,
    f: np.ndarray,
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
) -> Any:
    """NHWC ``Conv2D``: im2col + one GEMM; a 1x1 filter is a plain GEMM of the pixels."""
    kh, kw, c, o = f.shape
    if x.shape[3] != c:
        raise ValueError(f"input depth {x.shape[3]} does not match the filter's in_channels {c}")
    if kh == kw == 1 and padding != "EXPLICIT":
        # No padding with a 1x1 filter (VALID and SAME alike): each output pixel is
        # one input pixel times the filter; strides pick pixels.
        if s != (1, 1):
            x = x[:, :: s[0], :: s[1], :]
        n, oh, ow = x.shape[:3]
        y = _gemm(x.reshape(n * oh * ow, c), f.reshape(c, o))
        return y.reshape(n, oh, ow, o)
    win = _windows(x, (kh, kw), s, d, padding, explicit, 0)
    # im2col with the channels innermost (the copy reads x nearly in order; about
    # twice as fast as tensordot's own transpose), then one BLAS matmul.
    n, oh, ow = win.shape[:3]
    rows, depth = n * oh * ow, kh * kw * c
    with _gemm_threads(rows * depth * o) as ready:  # (BLAS is sized while cols are copied)
        cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(rows, depth)
        ready()
        y = cols @ f.reshape(depth, o)
    return y.reshape(n, oh, ow, o)


@registry.register_kernel_factory("DepthwiseConv2dNative")
def _depthwise_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    nchw, (_, s, d, padding, explicit) = _geometry(op, None)

    def depthwise_kernel(x: np.ndarray, f: np.ndarray) -> Any:
        return _depthwise(x, f, s, d, padding, explicit)

    return _sized(op, _in_nhwc(depthwise_kernel, nchw), _conv_macs(s))


def _depthwise(
    x: np.ndarray,
    f: np.ndarray,
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
) -> Any:
    """NHWC depthwise convolution: one ``einsum`` pass over the strided window view (no
    window copy).  Measured against ``kh * kw`` multiply-accumulate passes over tap
    views and against ``einsum(optimize=True)`` (which copies through ``tensordot``):
    as fast or faster on MobileNet's shapes, and no temporaries."""
    kh, kw, c, m = f.shape
    if x.shape[3] != c:
        raise ValueError(f"input depth {x.shape[3]} does not match the filter's in_channels {c}")
    if m == 1 and s[1] == 1 and c < _EINSUM_CHANNELS:
        return _depthwise_rows(x, f, s, d, padding, explicit)
    win = _windows(x, (kh, kw), s, d, padding, explicit, 0)
    if m == 1:
        return np.einsum("nhwcij,ijc->nhwc", win, f[..., 0])
    y = np.einsum("nhwcij,ijcm->nhwcm", win, f)
    return y.reshape(*y.shape[:3], c * m)


#: Channels from which the depthwise ``einsum`` beats the row taps: einsum's inner
#: loop runs over the channels only (16 of them: 270 us for a batch of 8 16x16 images,
#: the taps 85 us), the taps' over a whole output row; at 144-256 channels they are
#: even, at 384-576 einsum wins by a third (one pass where the taps make two per tap).
_EINSUM_CHANNELS = 128


def _depthwise_rows(
    x: np.ndarray,
    f: np.ndarray,
    s: tuple[int, int],
    d: tuple[int, int],
    padding: str,
    explicit: tuple[tuple[int, int], tuple[int, int]],
) -> Any:
    """A depthwise convolution with a channel multiplier of 1 and a column stride of 1,
    as one multiply-add per filter tap over whole rows.

    With the column stride 1 the pixels a tap reads in one output row are a contiguous
    run of the padded input row (``ow * c`` values), so each tap is a 3-D strided view
    multiplied by the tap's weights tiled along the row: numpy's inner loops run over
    rows, not over the channels of one pixel.
    """
    kh, kw, c, _ = f.shape
    xp, oh, ow = _padded(x, (kh, kw), s, d, padding, explicit, 0)
    n, hp, wp, _ = xp.shape
    out = np.empty((n, oh, ow * c), np.result_type(x.dtype, f.dtype))
    if n == 0 or oh == 0 or ow == 0:
        return out.reshape(n, oh, ow, c)
    rows = xp.reshape(n, hp, wp * c)
    weights = np.tile(f[:, :, :, 0], (1, 1, ow))  # (kh, kw, ow * c)
    tmp = np.empty_like(out)
    for i in range(kh):
        band = rows[:, i * d[0] : i * d[0] + (oh - 1) * s[0] + 1 : s[0]]
        for j in range(kw):
            tap = band[:, :, j * d[1] * c : (j * d[1] + ow) * c]
            if i == j == 0:
                np.multiply(tap, weights[0, 0], out=out)
            else:
                np.multiply(tap, weights[i, j], out=tmp)
                out += tmp
    return out.reshape(n, oh, ow, c)


def _fused_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    return _conv_shape(inputs[:2], attrs, depthwise=attrs["conv_op"] != "Conv2D")


#: A convolution, its BiasAdd and an optional Relu / Relu6 as one node: made by the
#: optimizer (``asyncflow.compiler.fold_batchnorm``), never by graph builders.
define_op("_FusedConv2D", _fused_shape)


@registry.register_kernel_factory("_FusedConv2D")
def _fused_conv_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    _, (_, s, d, padding, explicit) = _geometry(op, None)
    depthwise = op._attrs["conv_op"] != "Conv2D"
    conv = _depthwise if depthwise else _conv2d
    fused = op._attrs["fused_ops"]
    activation = fused[-1] if fused[-1] in ("Relu", "Relu6") else None
    cache: dict[Any, Any] = {}  # oneDNN's primitives, per geometry

    def fused_conv_kernel(
        x: np.ndarray, f: np.ndarray, b: np.ndarray, residual: np.ndarray | None = None
    ) -> Any:
        if not depthwise:
            y = _onednn(cache, x, f, b, s, d, padding, explicit, activation, residual)
            if y is not None:
                return y
        y = conv(x, f, s, d, padding, explicit)  # a fresh array: updated in place
        rows = channel_rows(y, b)
        if rows is None:
            y += b
        else:
            view, (bias_row,) = rows
            view += bias_row  # (a view of y)
        if residual is not None:
            if residual.shape == y.shape:
                y += residual
            else:  # (broadcast, as the Add it replaced did)
                y = np.add(y, residual)
        if activation == "Relu":
            np.maximum(y, 0, out=y)
        elif activation == "Relu6":
            np.clip(y, 0, 6, out=y)
        return y

    # (A residual is batched like the input: a split batch splits it too.)
    batched = (0, 3) if "Add" in fused else (0,)
    return _sized(op, fused_conv_kernel, _conv_macs(s), batched=batched)


def _pool_reduce(
    x: np.ndarray, k: tuple[int, int], s: tuple[int, int], padding: str, pad_value: Any, ufunc: Any
) -> Any:
    """``ufunc``-reduce each pooling window: one ufunc call per window offset on a strided
    view (``kh * kw`` calls), cheaper than reducing a 6-D window view."""
    x, oh, ow = _padded(x, k, s, (1, 1), padding, ((0, 0), (0, 0)), pad_value)
    if oh == 0 or ow == 0:
        return np.zeros((x.shape[0], oh, ow, x.shape[3]), x.dtype)
    out = None
    for i in range(k[0]):
        for j in range(k[1]):
            view = _tap(x, i, j, oh, ow, s)
            out = view.copy() if out is None else ufunc(out, view, out=out)
    return out


@registry.register_kernel_factory("Conv2DBackpropInput")
def _conv_backprop_input_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    nchw, (_, s, d, padding, explicit) = _geometry(op, None)

    def backprop_input_kernel(sizes: np.ndarray, f: np.ndarray, dy: np.ndarray) -> Any:
        n, h, w, c = (int(v) for v in sizes)
        kh, kw = f.shape[0], f.shape[1]
        oh, ph = _out_and_pads(h, kh, s[0], d[0], padding, explicit[0])
        ow, pw = _out_and_pads(w, kw, s[1], d[1], padding, explicit[1])
        assert oh is not None
        assert ow is not None
        assert ph is not None
        assert pw is not None
        if dy.shape != (n, oh, ow, f.shape[3]) or f.shape[2] != c:
            raise ValueError(
                f"out_backprop of shape {list(dy.shape)} and filter of shape "
                f"{list(f.shape)} do not fit input_sizes {[n, h, w, c]}"
            )
        # The transpose of the convolution: each filter tap scatters dy @ tap^T back to
        # the input positions it read (one matmul per tap, strided adds).
        rows = max((oh - 1) * s[0] + (kh - 1) * d[0] + 1, ph[0] + h)
        cols = max((ow - 1) * s[1] + (kw - 1) * d[1] + 1, pw[0] + w)
        buf = np.zeros((n, rows, cols, c), np.result_type(dy.dtype, f.dtype))
        for i in range(kh):
            for j in range(kw):
                tap = dy @ f[i, j].T
                buf[
                    :,
                    i * d[0] : i * d[0] + (oh - 1) * s[0] + 1 : s[0],
                    j * d[1] : j * d[1] + (ow - 1) * s[1] + 1 : s[1],
                    :,
                ] += tap
        return buf[:, ph[0] : ph[0] + h, pw[0] : pw[0] + w, :].astype(dy.dtype, copy=False)

    if not nchw:
        return _sized(op, backprop_input_kernel, _backprop_macs, split=False)

    def nchw_kernel(sizes: np.ndarray, f: np.ndarray, dy: np.ndarray) -> Any:
        nhwc = np.asarray(sizes)[[0, 2, 3, 1]]
        y = backprop_input_kernel(nhwc, f, np.transpose(dy, (0, 2, 3, 1)))
        return np.ascontiguousarray(np.transpose(y, (0, 3, 1, 2)))

    return _sized(op, nchw_kernel, _backprop_macs, split=False)


def _lowest(dtype: np.dtype[Any]) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


@registry.register_kernel_factory("MaxPool")
def _max_pool_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    nchw, (k, s, _d, padding, _explicit) = _geometry(op, "ksize")

    def max_pool_kernel(x: np.ndarray) -> Any:
        return _pool_reduce(x, k, s, padding, _lowest(x.dtype), np.maximum)

    return _in_nhwc(max_pool_kernel, nchw), registry.INLINE


@registry.register_kernel_factory("AvgPool")
def _avg_pool_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    nchw, (k, s, _d, padding, _explicit) = _geometry(op, "ksize")

    def avg_pool_kernel(x: np.ndarray) -> Any:
        acc = x if x.dtype.kind == "f" else x.astype(np.float64)
        total = _pool_reduce(acc, k, s, padding, 0, np.add)
        if padding == "VALID":
            return (total / (k[0] * k[1])).astype(x.dtype, copy=False)
        # As TF: SAME averages over the window's valid (unpadded) elements only.
        ones = np.ones((1, x.shape[1], x.shape[2], 1), acc.dtype)
        count = _pool_reduce(ones, k, s, padding, 0, np.add)
        return (total / count).astype(x.dtype, copy=False)

    return _in_nhwc(avg_pool_kernel, nchw), registry.INLINE


# -- constructors ----------------------------------------------------------------------


def _like(value: Any, x: Tensor) -> Tensor:
    """A Tensor as is; a Python or numpy value converted to ``x``'s dtype (as TF's ``T``)."""
    if isinstance(value, Tensor) or hasattr(value, "_as_graph_element"):
        return convert_to_tensor(value)
    return convert_to_tensor(value, dtype=x.dtype)


def _four(value: Any, nchw: bool, what: str) -> list[int]:
    """TF's ``strides``/``ksize``/``dilations`` argument as the 4-element attribute."""
    if isinstance(value, int | np.integer):
        a = b = int(value)
    else:
        items = [int(v) for v in value]
        if len(items) == 4:
            return items
        if len(items) == 1:
            a = b = items[0]
        elif len(items) == 2:
            a, b = items
        else:
            raise ValueError(f"{what} must be an int or a list of 1, 2 or 4 ints, got {value!r}")
    return [1, 1, a, b] if nchw else [1, a, b, 1]


def _padding_attrs(padding: Any, nchw: bool) -> dict[str, Any]:
    if isinstance(padding, str):
        return {"padding": padding.upper(), "explicit_paddings": []}
    pairs = [[int(p) for p in pair] for pair in padding]
    if len(pairs) != 4 or any(len(p) != 2 for p in pairs):
        raise ValueError(f"explicit padding must be 4 [before, after] pairs, got {padding!r}")
    return {"padding": "EXPLICIT", "explicit_paddings": [p for pair in pairs for p in pair]}


def conv2d(
    input: Any,
    filter: Any = None,
    strides: Any = None,
    padding: Any = "VALID",
    use_cudnn_on_gpu: bool = True,
    data_format: str = "NHWC",
    dilations: Any = 1,
    name: str | None = None,
    filters: Any = None,
) -> Tensor:
    """2-D convolution of a rank-4 ``input`` with a ``[KH, KW, in, out]`` filter (``Conv2D``).

    ``strides``/``dilations``: an int, 2 ints or TF's 4; ``padding``: ``"SAME"``,
    ``"VALID"`` or explicit ``[[0, 0], [top, bottom], [left, right], [0, 0]]`` pairs in
    ``data_format`` order (``"NHWC"`` or ``"NCHW"``).
    """
    if filters is not None:
        filter = filters
    if filter is None or strides is None:
        raise TypeError("conv2d needs a filter and strides")
    nchw = data_format == "NCHW"
    attrs = {
        "strides": _four(strides, nchw, "strides"),
        "data_format": data_format,
        "dilations": _four(dilations, nchw, "dilations"),
        **_padding_attrs(padding, nchw),
    }
    x = convert_to_tensor(input)
    f = _like(filter, x)
    return make_op("Conv2D", (x, f), attrs, name=name, default_name="Conv2D").outputs[0]


def depthwise_conv2d(
    input: Any,
    filter: Any,
    strides: Any,
    padding: Any,
    rate: Any = None,
    name: str | None = None,
    data_format: str = "NHWC",
    dilations: Any = None,
) -> Tensor:
    """Depthwise 2-D convolution with a ``[KH, KW, in, multiplier]`` filter.

    Output depth is ``in * multiplier`` (op ``DepthwiseConv2dNative``); ``rate`` (TF 1.x)
    or ``dilations`` dilate the filter.
    """
    nchw = data_format == "NCHW"
    dil = dilations if dilations is not None else (rate if rate is not None else 1)
    attrs = {
        "strides": _four(strides, nchw, "strides"),
        "data_format": data_format,
        "dilations": _four(dil, nchw, "dilations"),
        **_padding_attrs(padding, nchw),
    }
    x = convert_to_tensor(input)
    f = _like(filter, x)
    return make_op(
        "DepthwiseConv2dNative", (x, f), attrs, name=name, default_name="depthwise"
    ).outputs[0]


def conv2d_transpose(
    value: Any = None,
    filter: Any = None,
    output_shape: Any = None,
    strides: Any = None,
    padding: Any = "SAME",
    data_format: str = "NHWC",
    name: str | None = None,
    input: Any = None,
    filters: Any = None,
    dilations: Any = None,
) -> Tensor:
    """The transpose (gradient) of :func:`conv2d`: ``value`` of the convolution's output
    shape back to ``output_shape`` (op ``Conv2DBackpropInput``); the filter is
    ``[KH, KW, out_channels, in_channels]`` as TF's."""
    value = input if input is not None else value
    filter = filters if filters is not None else filter
    if value is None or filter is None or output_shape is None or strides is None:
        raise TypeError("conv2d_transpose needs value, filter, output_shape and strides")
    nchw = data_format == "NCHW"
    attrs = {
        "strides": _four(strides, nchw, "strides"),
        "data_format": data_format,
        "dilations": _four(1 if dilations is None else dilations, nchw, "dilations"),
        **_padding_attrs(padding, nchw),
    }
    dy = convert_to_tensor(value)
    f = _like(filter, dy)
    if isinstance(output_shape, Tensor) or hasattr(output_shape, "_as_graph_element"):
        sizes = convert_to_tensor(output_shape)
    else:
        from asyncflow.ops.array_ops import constant

        sizes = constant(np.asarray(output_shape, np.int32).reshape(-1), dtype=dtypes.int32)
    return make_op(
        "Conv2DBackpropInput", (sizes, f, dy), attrs, name=name, default_name="conv2d_transpose"
    ).outputs[0]


def _pool(
    op_type: str,
    value: Any,
    ksize: Any,
    strides: Any,
    padding: str,
    data_format: str,
    name: str | None,
) -> Tensor:
    nchw = data_format == "NCHW"
    attrs = {
        "ksize": _four(ksize, nchw, "ksize"),
        "strides": _four(strides, nchw, "strides"),
        "padding": padding.upper(),
        "data_format": data_format,
    }
    return make_op(
        op_type, (convert_to_tensor(value),), attrs, name=name, default_name=op_type
    ).outputs[0]


def max_pool(
    value: Any,
    ksize: Any,
    strides: Any,
    padding: str,
    data_format: str = "NHWC",
    name: str | None = None,
    input: Any = None,
) -> Tensor:
    """Max pooling over ``ksize`` windows (op ``MaxPool``); SAME pads with -inf."""
    return _pool(
        "MaxPool", input if input is not None else value, ksize, strides, padding, data_format, name
    )


def avg_pool(
    value: Any,
    ksize: Any,
    strides: Any,
    padding: str,
    data_format: str = "NHWC",
    name: str | None = None,
    input: Any = None,
) -> Tensor:
    """Average pooling (op ``AvgPool``); SAME averages the valid elements only, as TF."""
    return _pool(
        "AvgPool", input if input is not None else value, ksize, strides, padding, data_format, name
    )
