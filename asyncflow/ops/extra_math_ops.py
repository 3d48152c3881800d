"""More math ops frozen TF graphs use: Rsqrt, Erf, SquaredDifference, ClipByValue,
Cumsum, TopKV2 and Einsum (TensorFlow's op types and attributes)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, broadcast_shapes, unknown_shape
from asyncflow.ops import special_math
from asyncflow.ops._base import (
    binary_inputs,
    binary_shape,
    const_value,
    define_op,
    inline_kernel,
    make_op,
)
from asyncflow.ops.array_ops import _check_axis, constant

__all__ = [
    "broadcast_to",
    "ceil",
    "clip_by_value",
    "cos",
    "cumsum",
    "einsum",
    "erf",
    "erfc",
    "expm1",
    "floor",
    "is_finite",
    "is_nan",
    "log1p",
    "matrix_band_part",
    "reciprocal",
    "round",
    "rsqrt",
    "sign",
    "sin",
    "softplus",
    "softsign",
    "squared_difference",
    "top_k",
    "truncatediv",
    "truncatemod",
]

Specs = list[tuple[dtypes.DType, Any]]


def _float_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not (x._dtype.is_floating or x._dtype.is_complex):
        raise TypeError(
            f"input {x.name!r} has dtype {x._dtype.name}, expected a floating or complex dtype"
        )
    return [(x._dtype, x._shape)]


# -- Rsqrt, Erf ---------------------------------------------------------------------------

define_op("Rsqrt", _float_shape)


def _rsqrt_kernel(x: Any) -> Any:
    return np.reciprocal(np.sqrt(x))


inline_kernel("Rsqrt", _rsqrt_kernel)


def rsqrt(x: Any, name: str | None = None) -> Tensor:
    """``1 / sqrt(x)`` elementwise (op ``Rsqrt``)."""
    t = convert_to_tensor(x)
    return make_op("Rsqrt", (t,), name=name, default_name="Rsqrt").outputs[0]


def _erf_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not x._dtype.is_floating:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a floating dtype")
    return [(x._dtype, x._shape)]


define_op("Erf", _erf_shape)
# numpy has no erf: a vectorised float64 one (FDLIBM's method, within one ulp).
inline_kernel("Erf", special_math.erf)


def erf(x: Any, name: str | None = None) -> Tensor:
    """The Gauss error function elementwise (op ``Erf``)."""
    t = convert_to_tensor(x)
    return make_op("Erf", (t,), name=name, default_name="Erf").outputs[0]


define_op("Erfc", _erf_shape)
# 1 - erf(x) loses every digit for large x: erfc keeps its relative accuracy there
# (exact gelu computes 0.5 * x * erfc(-x / sqrt(2))).
inline_kernel("Erfc", special_math.erfc)


def erfc(x: Any, name: str | None = None) -> Tensor:
    """The complementary error function ``1 - erf(x)`` elementwise, accurate where erf
    is near 1 (op ``Erfc``)."""
    t = convert_to_tensor(x)
    return make_op("Erfc", (t,), name=name, default_name="Erfc").outputs[0]


# -- Select (v1) ------------------------------------------------------------------------------


def _select_v1_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    cond, x, y = inputs
    if not cond._dtype.is_bool:
        raise TypeError(f"condition {cond.name!r} must be bool, got {cond._dtype.name}")
    if x._dtype is not y._dtype:
        raise TypeError(
            f"inputs must have the same dtype, got {x._dtype.name} ({x.name}) "
            f"and {y._dtype.name} ({y.name})"
        )
    if not x._shape.is_compatible_with(y._shape):
        raise ValueError(
            f"'then' {x.name!r} and 'else' {y.name!r} must have the same "
            f"shape, got {x._shape} and {y._shape}"
        )
    return [(x._dtype, x._shape.merge_with(y._shape))]


define_op("Select", _select_v1_shape)


def _select_v1_kernel(cond: Any, x: Any, y: Any) -> Any:
    # TF 1.x Select: no broadcasting, but a vector condition picks whole rows; which
    # case applies is known only from the values' ranks (often unknown in a loop).
    # (Arrays, the common inputs, skip asarray: an LSTM step selects three times an
    # iteration.)
    c = cond if cond.__class__ is np.ndarray else np.asarray(cond)
    a = x if x.__class__ is np.ndarray else np.asarray(x)
    b = y if y.__class__ is np.ndarray else np.asarray(y)
    if a.shape != b.shape:
        raise errors.InvalidArgumentError(
            None,
            None,
            f"'then' and 'else' must have the same "
            f"size.  but received: {list(a.shape)} "
            f"vs. {list(b.shape)}",
        )
    if c.size == 1 and a.size and (c.ndim == 0 or (c.ndim == 1 and a.ndim and len(a) == 1)):
        # One condition for the whole value (a batch of one: an RNN's
        # ``time >= sequence_length`` each step): the chosen input itself, no copy.
        return a if c.item() else b
    if c.ndim == 1 and a.ndim > 1:
        if c.shape[0] != a.shape[0]:
            raise errors.InvalidArgumentError(
                None,
                None,
                f"Number of batches of 'then' must "
                f"match size of 'cond', but saw: "
                f"{a.shape[0]} vs. {c.shape[0]}",
            )
        c = c.reshape((-1,) + (1,) * (a.ndim - 1))
    elif c.ndim and c.shape != a.shape:
        raise errors.InvalidArgumentError(
            None,
            None,
            f"'cond' and 'then' must have the same "
            f"size.  but received: {list(c.shape)} "
            f"vs. {list(a.shape)}",
        )
    return np.where(c, a, b)


inline_kernel("Select", _select_v1_kernel)


# -- MatrixBandPart ---------------------------------------------------------------------------


def _band_part_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, lower, upper = inputs
    if x._shape.rank is not None and x._shape.rank < 2:
        raise ValueError(f"input {x.name!r} must be at least 2-D, got shape {x._shape}")
    for b in (lower, upper):
        if b._dtype not in (dtypes.int32, dtypes.int64):
            raise TypeError(f"band bound {b.name!r} must be int32 or int64, got {b._dtype.name}")
        if not b._shape.is_compatible_with(TensorShape(())):
            raise ValueError(f"band bound {b.name!r} must be a scalar, got shape {b._shape}")
    return [(x._dtype, x._shape)]


define_op("MatrixBandPart", _band_part_shape)


def _band_part_kernel(x: Any, num_lower: Any, num_upper: Any) -> Any:
    a = np.asarray(x)
    if a.ndim < 2:
        raise errors.InvalidArgumentError(
            None, None, f"input must be at least 2-dim, received shape: {list(a.shape)}"
        )
    m, n = a.shape[-2:]
    lo, up = int(num_lower), int(num_upper)
    if lo > m:
        raise errors.InvalidArgumentError(
            None,
            None,
            f"num_lower must be negative or less or equal to number of rows ({m}) got: {lo}",
        )
    if up > n:
        raise errors.InvalidArgumentError(
            None,
            None,
            f"num_upper must be negative or less or equal to number of columns ({n}) got: {up}",
        )
    diff = np.arange(m)[:, None] - np.arange(n)[None, :]  # row - column
    keep = ((lo < 0) | (diff <= lo)) & ((up < 0) | (-diff <= up))
    return np.where(keep, a, np.zeros((), a.dtype))


inline_kernel("MatrixBandPart", _band_part_kernel)


def matrix_band_part(input: Any, num_lower: Any, num_upper: Any, name: str | None = None) -> Tensor:
    """``input``'s innermost matrices with everything outside the band set to zero: at
    most ``num_lower`` diagonals below and ``num_upper`` above the main one (negative:
    all).  ``matrix_band_part(ones, -1, 0)`` is the causal mask (op ``MatrixBandPart``)."""
    x = convert_to_tensor(input)
    lo, up = (
        b if isinstance(b, Tensor) else convert_to_tensor(b, dtype=dtypes.int64)
        for b in (num_lower, num_upper)
    )
    return make_op("MatrixBandPart", (x, lo, up), name=name, default_name="MatrixBandPart").outputs[
        0
    ]


# -- SquaredDifference, ClipByValue ---------------------------------------------------------


def _squared_difference_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = binary_shape(inputs, attrs)
    if not inputs[0]._dtype.is_numeric:
        raise TypeError(f"inputs have dtype {inputs[0]._dtype.name}, expected numeric")
    return specs


define_op("SquaredDifference", _squared_difference_shape)


def _squared_difference_kernel(x: Any, y: Any) -> Any:
    d = np.subtract(x, y)
    return d * np.conj(d) if np.iscomplexobj(d) else d * d


inline_kernel("SquaredDifference", _squared_difference_kernel)


def squared_difference(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``(x - y) ** 2`` elementwise with broadcasting (op ``SquaredDifference``)."""
    a, b = binary_inputs(x, y, name or "SquaredDifference")
    return make_op(
        "SquaredDifference", (a, b), name=name, default_name="SquaredDifference"
    ).outputs[0]


def _clip_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    t, lo, hi = inputs
    for b in (lo, hi):
        if b._dtype is not t._dtype:
            raise TypeError(
                f"clip bound {b.name!r} has dtype {b._dtype.name}, tensor "
                f"{t.name!r} has {t._dtype.name}"
            )
        if b._shape.rank not in (0, None) and not b._shape.is_compatible_with(t._shape):
            raise ValueError(
                f"clip bound {b.name!r} of shape {b._shape} must be a scalar or "
                f"have the shape {t._shape} of {t.name!r}"
            )
    return [(t._dtype, t._shape)]


define_op("ClipByValue", _clip_shape)


def _clip_kernel(t: Any, lo: Any, hi: Any) -> Any:
    return np.minimum(np.maximum(t, lo), hi)


inline_kernel("ClipByValue", _clip_kernel)


def clip_by_value(
    t: Any, clip_value_min: Any, clip_value_max: Any, name: str | None = None
) -> Tensor:
    """``t`` with values below/above the bounds replaced by them.

    As ``tf.compat.v1.clip_by_value``: ``Maximum(Minimum(t, max), min)``; ``ValueError``
    when a bound's shape does not fit ``t``.
    """
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops.math_ops import maximum, minimum

    x = convert_to_tensor(t)
    with name_scope(name or "clip_by_value"):
        lo = convert_to_tensor(
            clip_value_min, dtype=None if isinstance(clip_value_min, Tensor) else x.dtype
        )
        hi = convert_to_tensor(
            clip_value_max, dtype=None if isinstance(clip_value_max, Tensor) else x.dtype
        )
        _clip_shape((x, lo, hi), {})
        if (
            broadcast_shapes(broadcast_shapes(x.shape, lo.shape), hi.shape) != x.shape
            and x.shape.is_fully_defined()
        ):
            raise ValueError(f"clip bounds must not broadcast {x.name!r} to a larger shape")
        return maximum(minimum(x, hi), lo)


# -- Cumsum ------------------------------------------------------------------------------


def _cumsum_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, axis = inputs
    if not x._dtype.is_numeric:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected numeric")
    if axis._dtype not in (dtypes.int32, dtypes.int64) or axis._shape.rank not in (0, None):
        raise TypeError(f"axis {axis.name!r} must be a scalar int32 or int64")
    value = const_value(axis)
    if value is not None and x._shape.rank is not None:
        _check_axis(int(value), x._shape.rank, x)
    return [(x._dtype, x._shape)]


define_op("Cumsum", _cumsum_shape)


@registry.register_kernel_factory("Cumsum")
def _cumsum_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    exclusive, reverse = bool(op._attrs["exclusive"]), bool(op._attrs["reverse"])

    def cumsum_kernel(x: Any, axis: Any) -> Any:
        a = int(axis)
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"axis {a} is out of range for a tensor of rank {x.ndim}")
        y = np.flip(x, a) if reverse else x
        out = np.cumsum(y, axis=a, dtype=x.dtype)
        if exclusive:
            out = (
                np.concatenate(
                    [np.zeros_like(np.take(out, [0], axis=a)), np.delete(out, -1, axis=a)], axis=a
                )
                if x.shape[a]
                else out
            )
        return np.flip(out, a) if reverse else out

    return cumsum_kernel, registry.INLINE


def cumsum(
    x: Any, axis: Any = 0, exclusive: bool = False, reverse: bool = False, name: str | None = None
) -> Tensor:
    """Running sum along ``axis`` (op ``Cumsum``); ``exclusive`` starts at 0, ``reverse``
    sums from the end."""
    t = convert_to_tensor(x)
    a = axis if isinstance(axis, Tensor) else constant(int(axis), dtype=dtypes.int32)
    attrs = {"exclusive": bool(exclusive), "reverse": bool(reverse)}
    return make_op("Cumsum", (t, a), attrs, name=name, default_name="Cumsum").outputs[0]


# -- TopKV2 ---------------------------------------------------------------------------------


def _top_k_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, k = inputs
    if not (x._dtype.is_integer or x._dtype.is_floating):
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a real dtype")
    if k._dtype is not dtypes.int32 or k._shape.rank not in (0, None):
        raise TypeError(f"k {k.name!r} must be a scalar int32")
    value = const_value(k)
    n = None if value is None else int(value)
    if x._shape.rank is None:
        shape = unknown_shape()
    else:
        if x._shape.rank == 0:
            raise ValueError(f"input {x.name!r} must be at least rank 1")
        last = x._shape[-1]
        if n is not None and (n < 0 or (last is not None and n > last)):
            raise ValueError(
                f"k = {n} must be in [0, {last}] for input {x.name!r} of shape {x._shape}"
            )
        shape = TensorShape([*x._shape.as_list()[:-1], n])
    return [(x._dtype, shape), (dtypes.int32, shape)]


define_op("TopKV2", _top_k_shape)


def _top_k_kernel(x: Any, k: Any) -> list[Any]:
    n = int(k)
    if not 0 <= n <= x.shape[-1]:
        raise ValueError(f"input must have at least k = {n} columns, has {x.shape[-1]}")
    # A stable sort of the negated values: ties keep the lower index first, as TF.
    key = -x.astype(np.float64) if x.dtype.kind in "iu" else -x
    idx = np.argsort(key, axis=-1, kind="stable")[..., :n]
    return [np.take_along_axis(x, idx, axis=-1), idx.astype(np.int32)]


inline_kernel("TopKV2", _top_k_kernel)


def top_k(
    input: Any, k: Any = 1, sorted: bool = True, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of the last dimension and their int32 indices (``TopKV2``).

    Results are always sorted (largest first); ties list the lower index first.
    """
    x = convert_to_tensor(input)
    kt = k if isinstance(k, Tensor) else constant(int(k), dtype=dtypes.int32)
    op = make_op("TopKV2", (x, kt), {"sorted": bool(sorted)}, name=name, default_name="TopKV2")
    return op.outputs[0], op.outputs[1]


# -- Einsum -------------------------------------------------------------------------------

_EQUATION = re.compile(r"^[a-zA-Z.]*(,[a-zA-Z.]*)*(->[a-zA-Z.]*)?$")


def _einsum_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    equation = attrs["equation"].replace(" ", "")
    if not _EQUATION.match(equation):
        raise ValueError(f"invalid einsum equation {attrs['equation']!r}")
    lhs = equation.split("->")[0].split(",")
    if len(lhs) != len(inputs):
        raise ValueError(
            f"einsum equation {equation!r} has {len(lhs)} operands, got {len(inputs)} inputs"
        )
    dt = inputs[0]._dtype
    for t in inputs:
        if t._dtype is not dt:
            raise TypeError(
                f"einsum inputs must have one dtype, got {dt.name} and {t._dtype.name} ({t.name})"
            )
    if any(t._shape.rank is None for t in inputs) or "." in equation:
        return [(dt, unknown_shape())]
    sizes: dict[str, int | None] = {}
    for labels, t in zip(lhs, inputs):
        if len(labels) != t._shape.rank:
            raise ValueError(
                f"einsum operand {labels!r} has {len(labels)} labels, input "
                f"{t.name!r} has rank {t._shape.rank}"
            )
        for c, d in zip(labels, t._shape.as_list()):
            old = sizes.get(c)
            if old is not None and d is not None and old != d and 1 not in (old, d):
                raise ValueError(f"einsum label {c!r} has sizes {old} and {d}")
            sizes[c] = d if old is None or old == 1 else old
    if "->" in equation:
        out = equation.split("->")[1]
    else:
        joined = "".join(lhs)
        out = "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    missing = [c for c in out if c not in sizes]
    if missing:
        raise ValueError(f"einsum output labels {missing} do not appear in the inputs")
    return [(dt, TensorShape([sizes[c] for c in out]))]


define_op("Einsum", _einsum_shape)


@registry.register_kernel_factory("Einsum")
def _einsum_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    equation = op._attrs["equation"].replace(" ", "")

    def einsum_kernel(*xs: Any) -> Any:
        return np.asarray(np.einsum(equation, *xs, optimize=len(xs) > 2))

    return einsum_kernel, registry.INLINE


def einsum(equation: str, *inputs: Any, name: str | None = None, **kwargs: Any) -> Tensor:
    """Einstein summation over ``inputs`` as ``equation`` says (op ``Einsum``)."""
    if kwargs:
        raise TypeError(f"einsum got unexpected keyword arguments {sorted(kwargs)}")
    tensors = [convert_to_tensor(x) for x in inputs]
    return make_op(
        "Einsum",
        tensors,
        {"equation": str(equation), "N": len(tensors)},
        name=name,
        default_name="einsum",
    ).outputs[0]


# -- simple elementwise ops frozen graphs often hold ------------------------------------------


def _real_float_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not x._dtype.is_floating:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a floating dtype")
    return [(x._dtype, x._shape)]


def _numeric_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not x._dtype.is_numeric:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected numeric")
    return [(x._dtype, x._shape)]


def _float_to_bool_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    _real_float_shape(inputs, attrs)
    return [(dtypes.bool, x._shape)]


def _softplus(x: Any) -> Any:
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)).
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _softsign(x: Any) -> Any:
    return x / (1 + np.abs(x))


def _round(x: Any) -> Any:
    return np.rint(x) if x.dtype.kind in "fc" else x


def _reciprocal(x: Any) -> Any:
    return np.reciprocal(x) if x.dtype.kind in "fc" else x.dtype.type(1) // x


# op type -> (shape function, numpy kernel, public name, docstring)
_UNARY: dict[str, tuple[Any, Callable[..., Any], str, str]] = {
    "Floor": (_real_float_shape, np.floor, "floor", "The largest integer <= x, elementwise"),
    "Ceil": (_real_float_shape, np.ceil, "ceil", "The smallest integer >= x, elementwise"),
    "Round": (
        _numeric_shape,
        _round,
        "round",
        "x rounded to the nearest integer, halves to even (as TF), elementwise",
    ),
    "Sign": (_numeric_shape, np.sign, "sign", "-1, 0 or 1 by the sign of x, elementwise"),
    "Reciprocal": (_numeric_shape, _reciprocal, "reciprocal", "1 / x, elementwise"),
    "Log1p": (_float_shape, np.log1p, "log1p", "log(1 + x), accurate near 0, elementwise"),
    "Expm1": (_float_shape, np.expm1, "expm1", "exp(x) - 1, accurate near 0, elementwise"),
    "Sin": (_float_shape, np.sin, "sin", "The sine of x, elementwise"),
    "Cos": (_float_shape, np.cos, "cos", "The cosine of x, elementwise"),
    "Softplus": (
        _real_float_shape,
        _softplus,
        "softplus",
        "log(1 + exp(x)) without overflow, elementwise",
    ),
    "Softsign": (_real_float_shape, _softsign, "softsign", "x / (1 + |x|), elementwise"),
    "IsNan": (_float_to_bool_shape, np.isnan, "is_nan", "Whether x is NaN, elementwise"),
    "IsFinite": (
        _float_to_bool_shape,
        np.isfinite,
        "is_finite",
        "Whether x is finite, elementwise",
    ),
}


def _unary_constructor(op_type: str, public: str, doc: str) -> Callable[..., Tensor]:
    def make(x: Any, name: str | None = None) -> Tensor:
        t = convert_to_tensor(x)
        return make_op(op_type, (t,), name=name, default_name=op_type).outputs[0]

    make.__name__ = make.__qualname__ = public
    make.__doc__ = f"{doc} (op ``{op_type}``)."
    return make


for _type, (_shape_fn, _kernel, _public, _doc) in _UNARY.items():
    define_op(_type, _shape_fn)
    inline_kernel(_type, _kernel)

floor = _unary_constructor("Floor", *_UNARY["Floor"][2:])
ceil = _unary_constructor("Ceil", *_UNARY["Ceil"][2:])
round = _unary_constructor("Round", *_UNARY["Round"][2:])
sign = _unary_constructor("Sign", *_UNARY["Sign"][2:])
reciprocal = _unary_constructor("Reciprocal", *_UNARY["Reciprocal"][2:])
log1p = _unary_constructor("Log1p", *_UNARY["Log1p"][2:])
expm1 = _unary_constructor("Expm1", *_UNARY["Expm1"][2:])
sin = _unary_constructor("Sin", *_UNARY["Sin"][2:])
cos = _unary_constructor("Cos", *_UNARY["Cos"][2:])
_softplus_op = _unary_constructor("Softplus", *_UNARY["Softplus"][2:])
_softsign_op = _unary_constructor("Softsign", *_UNARY["Softsign"][2:])


def softplus(features: Any, name: str | None = None) -> Tensor:
    """``log(1 + exp(features))`` without overflow, elementwise (op ``Softplus``)."""
    return _softplus_op(features, name=name)


def softsign(features: Any, name: str | None = None) -> Tensor:
    """``features / (1 + |features|)``, elementwise (op ``Softsign``)."""
    return _softsign_op(features, name=name)


is_nan = _unary_constructor("IsNan", *_UNARY["IsNan"][2:])
is_finite = _unary_constructor("IsFinite", *_UNARY["IsFinite"][2:])


# -- TruncateDiv, TruncateMod (C-style integer division, TF's Div on ints) -------------------


def _int_binary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = binary_shape(inputs, attrs)
    if not (inputs[0]._dtype.is_integer or inputs[0]._dtype.is_floating):
        raise TypeError(f"inputs have dtype {inputs[0]._dtype.name}, expected a real dtype")
    return specs


def _truncate_div(x: Any, y: Any) -> Any:
    if np.asarray(x).dtype.kind == "f":
        return np.trunc(x / y)
    if np.any(np.asarray(y) == 0):
        raise errors.InvalidArgumentError(None, None, "Integer division by zero")
    q = np.floor_divide(x, y)
    # Floor division rounds toward -inf; truncation toward 0 differs when signs differ.
    return q + ((np.remainder(x, y) != 0) & ((np.asarray(x) < 0) != (np.asarray(y) < 0)))


def _truncate_mod(x: Any, y: Any) -> Any:
    # numpy's fmod gives 0 for an integer x % 0; TF fails the step.
    if np.asarray(x).dtype.kind in "iu" and np.any(np.asarray(y) == 0):
        raise errors.InvalidArgumentError(None, None, "Integer division by zero")
    return np.fmod(x, y)


define_op("TruncateDiv", _int_binary_shape)
inline_kernel("TruncateDiv", _truncate_div)
define_op("TruncateMod", _int_binary_shape)
inline_kernel("TruncateMod", _truncate_mod)


def truncatediv(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x / y`` rounded toward zero, as C (op ``TruncateDiv``)."""
    a, b = binary_inputs(x, y, name or "TruncateDiv")
    return make_op("TruncateDiv", (a, b), name=name, default_name="TruncateDiv").outputs[0]


def truncatemod(x: Any, y: Any, name: str | None = None) -> Tensor:
    """The remainder of :func:`truncatediv`, with the sign of ``x`` (op ``TruncateMod``)."""
    a, b = binary_inputs(x, y, name or "TruncateMod")
    return make_op("TruncateMod", (a, b), name=name, default_name="TruncateMod").outputs[0]


# -- BroadcastTo ---------------------------------------------------------------------------


def _broadcast_to_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, shape = inputs
    if shape._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"shape {shape.name!r} must be int32 or int64, got {shape._dtype.name}")
    value = const_value(shape)
    if value is None:
        n = shape._shape[0] if shape._shape.rank == 1 else None
        return [(x._dtype, unknown_shape(n))]
    target = TensorShape(np.asarray(value).reshape(-1).tolist())
    try:
        merged = broadcast_shapes(x._shape, target)
    except ValueError:
        raise ValueError(f"cannot broadcast {x.name!r} of shape {x._shape} to {target}") from None
    if merged.rank != target.rank or not merged.is_compatible_with(target):
        raise ValueError(f"cannot broadcast {x.name!r} of shape {x._shape} to {target}")
    return [(x._dtype, target)]


define_op("BroadcastTo", _broadcast_to_shape)


def _broadcast_to_kernel(x: Any, shape: Any) -> Any:
    # A read-only broadcast view: kernels never write their inputs.
    return np.broadcast_to(x, tuple(np.asarray(shape).tolist()))


inline_kernel("BroadcastTo", _broadcast_to_kernel)


def broadcast_to(input: Any, shape: Any, name: str | None = None) -> Tensor:
    """``input`` broadcast to ``shape`` with numpy's rules (op ``BroadcastTo``)."""
    x = convert_to_tensor(input)
    s = (
        shape
        if isinstance(shape, Tensor)
        else constant(np.asarray(shape, np.int32).reshape(-1), dtype=dtypes.int32)
    )
    return make_op("BroadcastTo", (x, s), name=name, default_name="BroadcastTo").outputs[0]
