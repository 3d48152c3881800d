"""Ops that build a tensor from a pattern: Tile, Pad / PadV2 / MirrorPad, OneHot,
ZerosLike, OnesLike (TensorFlow's op types and attributes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, unknown_shape
from asyncflow.ops._base import const_value, define_op, make_op, unary_shape
from asyncflow.ops.array_ops import constant

__all__ = ["one_hot", "ones_like", "pad", "tile", "zeros_like"]

Specs = list[tuple[dtypes.DType, Any]]


def _int_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor) or hasattr(value, "_as_graph_element"):
        return convert_to_tensor(value)
    return constant(np.asarray(value, np.int32), dtype=dtypes.int32)


def _check_int(t: Tensor, what: str) -> None:
    if t._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"{what} {t.name!r} has dtype {t._dtype.name}, expected int32 or int64")


# -- Tile ----------------------------------------------------------------------------------


def _tile_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, multiples = inputs
    _check_int(multiples, "multiples")
    m = const_value(multiples)
    rank = x._shape.rank
    if m is not None:
        mults = np.asarray(m).reshape(-1).tolist()
        if rank is not None and len(mults) != rank:
            raise ValueError(
                f"multiples has {len(mults)} elements, input {x.name!r} has rank {rank}"
            )
        if any(v < 0 for v in mults):
            raise ValueError(f"multiples must be non-negative, got {mults}")
        if rank is None:
            return [(x._dtype, unknown_shape(len(mults)))]
        return [
            (
                x._dtype,
                TensorShape(
                    [None if d is None else d * k for d, k in zip(x._shape.as_list(), mults)]
                ),
            )
        ]
    return [(x._dtype, unknown_shape(rank))]


define_op("Tile", _tile_shape)


def _tile_kernel(x: Any, multiples: Any) -> Any:
    mults = np.asarray(multiples).tolist()
    if len(mults) != np.ndim(x) or min(mults, default=0) < 0:
        raise ValueError(f"multiples {mults} must be {np.ndim(x)} non-negative ints")
    return np.tile(x, mults)


registry.register_kernel_factory("Tile")(lambda op: (_tile_kernel, registry.INLINE))


def tile(input: Any, multiples: Any, name: str | None = None) -> Tensor:
    """``input`` repeated ``multiples[i]`` times along dimension ``i`` (op ``Tile``)."""
    x = convert_to_tensor(input)
    return make_op("Tile", (x, _int_tensor(multiples)), name=name, default_name="Tile").outputs[0]


# -- Pad, PadV2, MirrorPad ----------------------------------------------------------------


def _pad_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, paddings = inputs[0], inputs[1]
    _check_int(paddings, "paddings")
    if len(inputs) == 3:
        c = inputs[2]
        if c._dtype is not x._dtype:
            raise TypeError(
                f"constant_values {c.name!r} has dtype {c._dtype.name}, input "
                f"{x.name!r} has {x._dtype.name}"
            )
        if c._shape.rank not in (0, None):
            raise ValueError(f"constant_values must be a scalar, got shape {c._shape}")
    mode = attrs.get("mode")
    if mode is not None and mode not in ("REFLECT", "SYMMETRIC"):
        raise ValueError(f"mode must be 'REFLECT' or 'SYMMETRIC', got {mode!r}")
    rank = x._shape.rank
    if paddings._shape.rank not in (2, None) or (
        paddings._shape.rank == 2 and paddings._shape[1] not in (2, None)
    ):
        raise ValueError(f"paddings must be a [rank, 2] matrix, got shape {paddings._shape}")
    value = const_value(paddings)
    if value is None:
        n = paddings._shape[0] if paddings._shape.rank == 2 else None
        return [(x._dtype, unknown_shape(rank if rank is not None else n))]
    pads = np.asarray(value).reshape(-1, 2).tolist()
    if rank is not None and len(pads) != rank:
        raise ValueError(f"paddings has {len(pads)} rows, input {x.name!r} has rank {rank}")
    if any(p < 0 for pair in pads for p in pair):
        raise ValueError(f"paddings must be non-negative, got {pads}")
    dims = x._shape.as_list() if rank is not None else [None] * len(pads)
    limit = 1 if mode == "REFLECT" else 0
    for d, (a, b) in zip(dims, pads):
        if mode is not None and d is not None and max(a, b) > d - limit:
            raise ValueError(
                f"paddings {pads} must be at most the dimension size "
                f"{d}{' - 1' if limit else ''} in {mode} mode ({x.name!r})"
            )
    return [
        (x._dtype, TensorShape([None if d is None else d + a + b for d, (a, b) in zip(dims, pads)]))
    ]


define_op("Pad", _pad_shape)
define_op("PadV2", _pad_shape)
define_op("MirrorPad", _pad_shape)


def _pad_kernel(x: Any, paddings: Any, constant_values: Any = 0) -> Any:
    pads = np.asarray(paddings).reshape(-1, 2)
    if pads.shape[0] != np.ndim(x) or np.any(pads < 0):
        raise ValueError(f"paddings {pads.tolist()} must be {np.ndim(x)} non-negative pairs")
    return np.pad(x, pads.tolist(), mode="constant", constant_values=constant_values)


registry.register_kernel_factory("Pad")(lambda op: (_pad_kernel, registry.INLINE))
registry.register_kernel_factory("PadV2")(lambda op: (_pad_kernel, registry.INLINE))


@registry.register_kernel_factory("MirrorPad")
def _mirror_pad_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    np_mode: Any = "reflect" if op._attrs["mode"] == "REFLECT" else "symmetric"
    limit = 1 if np_mode == "reflect" else 0

    def mirror_pad_kernel(x: Any, paddings: Any) -> Any:
        pads = np.asarray(paddings).reshape(-1, 2)
        for d, (a, b) in zip(np.shape(x), pads.tolist()):
            if a < 0 or b < 0 or max(a, b) > d - limit:
                raise ValueError(
                    f"paddings {pads.tolist()} do not fit input shape "
                    f"{list(np.shape(x))} in {op._attrs['mode']} mode"
                )
        return np.pad(x, pads.tolist(), mode=np_mode)

    return mirror_pad_kernel, registry.INLINE


def pad(
    tensor: Any,
    paddings: Any,
    mode: str = "CONSTANT",
    name: str | None = None,
    constant_values: Any = 0,
) -> Tensor:
    """``tensor`` padded by ``paddings`` (``[rank, 2]``: before/after per dimension).

    ``mode``: ``"CONSTANT"`` (op ``Pad``, or ``PadV2`` with a non-zero
    ``constant_values``), ``"REFLECT"`` or ``"SYMMETRIC"`` (op ``MirrorPad``).
    """
    x = convert_to_tensor(tensor)
    p = _int_tensor(paddings)
    m = mode.upper()
    if m == "CONSTANT":
        if isinstance(constant_values, int | float) and constant_values == 0:
            return make_op("Pad", (x, p), name=name, default_name="Pad").outputs[0]
        c = convert_to_tensor(
            constant_values, dtype=None if isinstance(constant_values, Tensor) else x.dtype
        )
        return make_op("PadV2", (x, p, c), name=name, default_name="PadV2").outputs[0]
    if m not in ("REFLECT", "SYMMETRIC"):
        raise ValueError(f"pad mode must be CONSTANT, REFLECT or SYMMETRIC, got {mode!r}")
    return make_op("MirrorPad", (x, p), {"mode": m}, name=name, default_name="MirrorPad").outputs[0]


# -- OneHot ------------------------------------------------------------------------------


def _one_hot_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    indices, depth, on, off = inputs
    if indices._dtype not in (dtypes.uint8, dtypes.int32, dtypes.int64):
        raise TypeError(
            f"indices {indices.name!r} has dtype {indices._dtype.name}, expected "
            f"uint8, int32 or int64"
        )
    if depth._dtype is not dtypes.int32 or depth._shape.rank not in (0, None):
        raise TypeError(f"depth {depth.name!r} must be a scalar int32")
    if on._dtype is not off._dtype:
        raise TypeError(
            f"on_value and off_value must have one dtype, got {on._dtype.name} "
            f"and {off._dtype.name}"
        )
    d = const_value(depth)
    n = None if d is None else int(d)
    if n is not None and n < 0:
        raise ValueError(f"depth must be non-negative, got {n}")
    rank = indices._shape.rank
    if rank is None:
        return [(on._dtype, unknown_shape())]
    axis = attrs["axis"]
    if not -1 <= axis <= rank:
        raise ValueError(f"axis {axis} is out of range [-1, {rank}] for indices {indices.name!r}")
    dims = indices._shape.as_list()
    dims.insert(rank if axis == -1 else axis, n)
    return [(on._dtype, TensorShape(dims))]


define_op("OneHot", _one_hot_shape)


@registry.register_kernel_factory("OneHot")
def _one_hot_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axis = op._attrs["axis"]
    dt = op._outputs[0]._dtype.np

    def one_hot_kernel(indices: Any, depth: Any, on: Any, off: Any) -> Any:
        hot = np.asarray(indices)[..., None] == np.arange(int(depth))
        out = np.where(hot, on, off).astype(dt, copy=False)
        return out if axis == -1 else np.moveaxis(out, -1, axis)

    return one_hot_kernel, registry.INLINE


def one_hot(
    indices: Any,
    depth: Any,
    on_value: Any = None,
    off_value: Any = None,
    axis: int | None = None,
    dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """``on_value`` at ``indices`` along a new ``depth``-long axis, ``off_value`` elsewhere.

    Op ``OneHot``; out-of-range indices give all ``off_value``, as TF.  ``dtype`` defaults
    to the dtype of ``on_value`` or float32.
    """
    i = convert_to_tensor(indices)
    d = convert_to_tensor(depth, dtype=None if isinstance(depth, Tensor) else dtypes.int32)
    dt = (
        dtypes.as_dtype(dtype)
        if dtype is not None
        else (
            on_value.dtype
            if isinstance(on_value, Tensor)
            else off_value.dtype
            if isinstance(off_value, Tensor)
            else dtypes.float32
        )
    )
    on = convert_to_tensor(1 if on_value is None else on_value, dtype=dt)
    off = convert_to_tensor(0 if off_value is None else off_value, dtype=dt)
    return make_op(
        "OneHot",
        (i, d, on, off),
        {"axis": -1 if axis is None else int(axis)},
        name=name,
        default_name="one_hot",
    ).outputs[0]


# -- ZerosLike, OnesLike -------------------------------------------------------------------

define_op("ZerosLike", unary_shape)
define_op("OnesLike", unary_shape)
registry.register_kernel_factory("ZerosLike")(lambda op: (np.zeros_like, registry.INLINE))
registry.register_kernel_factory("OnesLike")(lambda op: (np.ones_like, registry.INLINE))


def zeros_like(
    tensor: Any, dtype: Any = None, name: str | None = None, optimize: bool = True
) -> Tensor:
    """Zeros with the shape (and dtype, unless given) of ``tensor`` (op ``ZerosLike``)."""
    from asyncflow.ops.math_ops import cast

    t = convert_to_tensor(tensor)
    if dtype is not None and dtypes.as_dtype(dtype) is not t.dtype:
        t = cast(t, dtype)
    return make_op("ZerosLike", (t,), name=name, default_name="zeros_like").outputs[0]


def ones_like(
    tensor: Any, dtype: Any = None, name: str | None = None, optimize: bool = True
) -> Tensor:
    """Ones with the shape (and dtype, unless given) of ``tensor`` (op ``OnesLike``)."""
    from asyncflow.ops.math_ops import cast

    t = convert_to_tensor(tensor)
    if dtype is not None and dtypes.as_dtype(dtype) is not t.dtype:
        t = cast(t, dtype)
    return make_op("OnesLike", (t,), name=name, default_name="ones_like").outputs[0]
