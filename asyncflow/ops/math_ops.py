"""Math ops: elementwise arithmetic, comparisons, logic, matmul, reductions, casts.

Kernels are numpy ufuncs (or thin wrappers picked once per plan by a kernel factory)
because the executor calls ``kernel(*inputs)`` in its hot loop.  Every kernel returns
exactly the dtype its shape function declared.

The bottom of this module installs the Python operators on :class:`Tensor`
(``x + y``, ``-x``, ``x < y``, ...), TensorFlow's pattern: framework/ never imports ops/.
Slicing (``x[1:, None]``) is installed by :mod:`asyncflow.ops.slice_ops`.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import graph as graph_module
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, broadcast_shapes, unknown_shape
from asyncflow.ops._base import (
    binary_inputs,
    binary_shape,
    const_value,
    define_op,
    inline_kernel,
    make_op,
    static_value,
    unary_shape,
)

__all__ = [
    "abs",
    "add",
    "add_n",
    "argmax",
    "argmin",
    "cast",
    "divide",
    "equal",
    "exp",
    "floordiv",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "matmul",
    "maximum",
    "minimum",
    "mod",
    "multiply",
    "negative",
    "not_equal",
    "pow",
    "range",
    "reduce_all",
    "reduce_any",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_prod",
    "reduce_sum",
    "sqrt",
    "square",
    "subtract",
    "tanh",
    "truediv",
    "where",
]

Specs = list[tuple[dtypes.DType, Any]]

# TensorFlow's truediv result type for integer operands.
_TRUEDIV_RESULT = {
    dtypes.int8: dtypes.float32,
    dtypes.uint8: dtypes.float32,
    dtypes.int16: dtypes.float32,
    dtypes.int32: dtypes.float64,
    dtypes.int64: dtypes.float64,
}


# -- shape-function helpers --------------------------------------------------------


def _check_dtype(t: Tensor, allowed: Callable[[dtypes.DType], bool], what: str) -> None:
    if not allowed(t._dtype):
        raise TypeError(f"input {t.name!r} has dtype {t._dtype.name}, expected {what}")


def _is_numeric(d: dtypes.DType) -> bool:
    return d.is_numeric


def _is_numeric_or_string(d: dtypes.DType) -> bool:
    return d.is_numeric or d.is_string


def _is_real(d: dtypes.DType) -> bool:
    return d.is_integer or d.is_floating


def _binary_checked(
    allowed: Callable[[dtypes.DType], bool], what: str
) -> Callable[[Sequence[Tensor], Mapping[str, Any]], Specs]:
    """The shape function of a binary op on ``allowed`` dtypes: :func:`binary_shape`,
    then ``_check_dtype`` of the first operand, in one call (a shape function runs
    once per op built; ``allowed`` once per dtype)."""
    verdicts: dict[dtypes.DType, bool] = {}

    def shape_fn(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
        x, y = inputs
        dt = x._dtype
        if dt is not y._dtype:
            raise TypeError(
                f"inputs must have the same dtype, got {dt.name} "
                f"({x.name}) and {y._dtype.name} ({y.name})"
            )
        xs = x._shape
        # One shape object on both sides (a chain's scalars): itself, without a call.
        shape = xs if xs is y._shape else broadcast_shapes(xs, y._shape)
        ok = verdicts.get(dt)
        if ok is None:
            ok = verdicts[dt] = allowed(dt)
        if not ok:
            raise TypeError(f"input {x.name!r} has dtype {dt.name}, expected {what}")
        return [(dt, shape)]

    return shape_fn


_numeric_binary_shape = _binary_checked(_is_numeric, "a numeric dtype")
_real_binary_shape = _binary_checked(_is_real, "an integer or floating dtype")


def _compare_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    ((_, shape),) = binary_shape(inputs, attrs)
    return [(dtypes.bool, shape)]


def _order_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = _compare_shape(inputs, attrs)
    _check_dtype(inputs[0], _is_real, "an integer or floating dtype")
    return specs


def _logical_binary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    for t in inputs:
        _check_dtype(t, lambda d: d.is_bool, "bool")
    return binary_shape(inputs, attrs)


def _unary_checked(
    allowed: Callable[[dtypes.DType], bool], what: str
) -> Callable[[Sequence[Tensor], Mapping[str, Any]], Specs]:
    def shape_fn(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
        _check_dtype(inputs[0], allowed, what)
        return unary_shape(inputs, attrs)

    return shape_fn


def _is_inexact(d: dtypes.DType) -> bool:
    return d.is_floating or d.is_complex


def _binary(op_type: str, x: Any, y: Any, name: str | None, default_name: str) -> Tensor:
    x, y = binary_inputs(x, y, name or default_name)
    return make_op(op_type, (x, y), name=name, default_name=default_name).outputs[0]


def _unary(op_type: str, x: Any, name: str | None, default_name: str | None = None) -> Tensor:
    t = convert_to_tensor(x)
    return make_op(op_type, (t,), name=name, default_name=default_name or op_type).outputs[0]


# -- elementwise binary arithmetic ------------------------------------------------------

_add_shape = _binary_checked(_is_numeric_or_string, "a numeric or string dtype")


# The arithmetic and comparison kernels are Python's operators: on numpy values they
# are numpy's own ufuncs with numpy's dtype rules (float32 stays float32), but on the
# numpy scalars a chain of cheap ops passes around they take numpy's scalar fast path
# (~60 ns instead of ~600 ns for np.add on two np.float32).
define_op("Add", _add_shape)
inline_kernel("Add", operator.add)


def add(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x + y`` elementwise with numpy broadcasting (op ``Add``); same dtypes required."""
    return _binary("Add", x, y, name, "Add")


define_op("Sub", _numeric_binary_shape)
inline_kernel("Sub", operator.sub)


def subtract(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x - y`` elementwise with broadcasting (op ``Sub``)."""
    return _binary("Sub", x, y, name, "Sub")


define_op("Mul", _numeric_binary_shape)
inline_kernel("Mul", operator.mul)


def multiply(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x * y`` elementwise with broadcasting (op ``Mul``)."""
    return _binary("Mul", x, y, name, "Mul")


def _realdiv_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = binary_shape(inputs, attrs)
    _check_dtype(inputs[0], _is_inexact, "a floating or complex dtype")
    return specs


define_op("RealDiv", _realdiv_shape)
inline_kernel("RealDiv", operator.truediv)


def _truediv_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    ((dt, shape),) = binary_shape(inputs, attrs)
    out = _TRUEDIV_RESULT.get(dt)
    if out is None:
        raise TypeError(f"TrueDiv takes integer inputs (int8/16/32/64, uint8), got {dt.name}")
    return [(out, shape)]


define_op("TrueDiv", _truediv_shape)


@registry.register_kernel_factory("TrueDiv")
def _truediv_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    out = op._outputs[0]._dtype.np
    return functools.partial(np.true_divide, dtype=out), registry.INLINE


def divide(x: Any, y: Any, name: str | None = None) -> Tensor:
    """Python 3 division ``x / y`` (TF ``truediv``): integers give floats.

    int8/int16/uint8 → float32 and int32/int64 → float64 (op ``TrueDiv``); floating
    and complex operands divide in their own dtype (op ``RealDiv``).  Default name
    ``truediv``, as TensorFlow's.
    """
    x, y = binary_inputs(x, y, name or "truediv")
    op_type = "TrueDiv" if x.dtype.is_integer else "RealDiv"
    return make_op(op_type, (x, y), name=name, default_name="truediv").outputs[0]


truediv = divide


define_op("FloorDiv", _real_binary_shape)


def _check_integer_divisor(y: Any) -> None:
    # A numpy scalar is its own truth value (np.all costs ~3 us on one).
    if not (y if isinstance(y, np.generic) else np.all(y)):
        raise errors.InvalidArgumentError(None, None, "Integer division by zero")


def _int_floordiv(x: Any, y: Any) -> Any:
    _check_integer_divisor(y)
    return np.floor_divide(x, y)


def _float_floordiv(x: Any, y: Any) -> Any:
    # TF's float FloorDiv is floor(x / y); numpy's floor_divide differs at the edges
    # (-5.0 // inf is -1.0 in numpy, -0.0 in TF).
    return np.floor(np.true_divide(x, y))


@registry.register_kernel_factory("FloorDiv")
def _floordiv_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    integer = op._inputs[0]._dtype.is_integer
    return (_int_floordiv if integer else _float_floordiv), registry.INLINE


def floordiv(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x // y``: division rounded toward negative infinity (op ``FloorDiv``)."""
    return _binary("FloorDiv", x, y, name, "floordiv")


define_op("FloorMod", _real_binary_shape)


def _int_floormod(x: Any, y: Any) -> Any:
    _check_integer_divisor(y)
    return np.remainder(x, y)


@registry.register_kernel_factory("FloorMod")
def _floormod_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    integer = op._inputs[0]._dtype.is_integer
    return (_int_floormod if integer else np.remainder), registry.INLINE


def mod(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x % y`` with the sign of ``y``, as Python's ``%`` (op ``FloorMod``)."""
    return _binary("FloorMod", x, y, name, "FloorMod")


define_op("Pow", _numeric_binary_shape)


def _pow_kernel(x: Any, y: Any) -> Any:
    """``x ** y``; a float ``x`` to one whole power as ``+-|x| ** y``.

    numpy's float ``power`` takes a scalar path per element for a negative base (about
    70 ns each, 600 us for a 10K-element gelu ``x ** 3`` that multiplies in 15 us);
    with a whole exponent the result is ``|x| ** y`` with ``x``'s sign when ``y`` is
    odd, which is how C's ``pow`` defines it.
    """
    xa = np.asarray(x)
    ya = np.asarray(y)
    if xa.dtype.kind != "f" or ya.ndim != 0 or ya.dtype.kind not in "fiu":
        return np.power(x, y)
    whole = float(ya)
    if not whole.is_integer():
        return np.power(x, y)
    magnitude = np.power(np.abs(xa), ya)
    return (np.copysign(magnitude, xa) if whole % 2 else magnitude)[()]


inline_kernel("Pow", _pow_kernel)


def pow(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x ** y`` elementwise (op ``Pow``)."""
    return _binary("Pow", x, y, name, "Pow")


define_op("Maximum", _real_binary_shape)
inline_kernel("Maximum", np.maximum)


def maximum(x: Any, y: Any, name: str | None = None) -> Tensor:
    """The elementwise maximum of ``x`` and ``y`` (op ``Maximum``)."""
    return _binary("Maximum", x, y, name, "Maximum")


define_op("Minimum", _real_binary_shape)
inline_kernel("Minimum", np.minimum)


def minimum(x: Any, y: Any, name: str | None = None) -> Tensor:
    """The elementwise minimum of ``x`` and ``y`` (op ``Minimum``)."""
    return _binary("Minimum", x, y, name, "Minimum")


# -- comparisons ---------------------------------------------------------------

define_op("Equal", _compare_shape)
inline_kernel("Equal", np.equal)


def equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x == y`` elementwise, a bool tensor (op ``Equal``)."""
    return _binary("Equal", x, y, name, "Equal")


define_op("NotEqual", _compare_shape)
inline_kernel("NotEqual", np.not_equal)


def not_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x != y`` elementwise, a bool tensor (op ``NotEqual``)."""
    return _binary("NotEqual", x, y, name, "NotEqual")


define_op("Less", _order_shape)
inline_kernel("Less", operator.lt)


def less(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x < y`` elementwise, a bool tensor (op ``Less``)."""
    return _binary("Less", x, y, name, "Less")


define_op("LessEqual", _order_shape)
inline_kernel("LessEqual", operator.le)


def less_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x <= y`` elementwise, a bool tensor (op ``LessEqual``)."""
    return _binary("LessEqual", x, y, name, "LessEqual")


define_op("Greater", _order_shape)
inline_kernel("Greater", operator.gt)


def greater(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x > y`` elementwise, a bool tensor (op ``Greater``)."""
    return _binary("Greater", x, y, name, "Greater")


define_op("GreaterEqual", _order_shape)
inline_kernel("GreaterEqual", operator.ge)


def greater_equal(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x >= y`` elementwise, a bool tensor (op ``GreaterEqual``)."""
    return _binary("GreaterEqual", x, y, name, "GreaterEqual")


# -- logic ----------------------------------------------------------------------------


def _logical_inputs(x: Any, y: Any) -> tuple[Tensor, Tensor]:
    return convert_to_tensor(x), convert_to_tensor(y)


define_op("LogicalAnd", _logical_binary_shape)
inline_kernel("LogicalAnd", np.logical_and)


def logical_and(x: Any, y: Any, name: str | None = None) -> Tensor:
    """Elementwise ``x and y`` of bool tensors (op ``LogicalAnd``)."""
    return make_op(
        "LogicalAnd", _logical_inputs(x, y), name=name, default_name="LogicalAnd"
    ).outputs[0]


define_op("LogicalOr", _logical_binary_shape)
inline_kernel("LogicalOr", np.logical_or)


def logical_or(x: Any, y: Any, name: str | None = None) -> Tensor:
    """Elementwise ``x or y`` of bool tensors (op ``LogicalOr``)."""
    return make_op("LogicalOr", _logical_inputs(x, y), name=name, default_name="LogicalOr").outputs[
        0
    ]


define_op("LogicalXor", _logical_binary_shape)
inline_kernel("LogicalXor", np.logical_xor)


def logical_xor(x: Any, y: Any, name: str | None = None) -> Tensor:
    """Elementwise exclusive or of bool tensors (op ``LogicalXor``)."""
    return make_op(
        "LogicalXor", _logical_inputs(x, y), name=name, default_name="LogicalXor"
    ).outputs[0]


define_op("LogicalNot", _unary_checked(lambda d: d.is_bool, "bool"))
inline_kernel("LogicalNot", np.logical_not)


def logical_not(x: Any, name: str | None = None) -> Tensor:
    """Elementwise ``not x`` of a bool tensor (op ``LogicalNot``)."""
    return _unary("LogicalNot", x, name)


# -- elementwise unary ------------------------------------------------------------------

define_op("Neg", _unary_checked(_is_numeric, "a numeric dtype"))
inline_kernel("Neg", operator.neg)


def negative(x: Any, name: str | None = None) -> Tensor:
    """``-x`` elementwise (op ``Neg``)."""
    return _unary("Neg", x, name)


def _abs_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    _check_dtype(x, _is_numeric, "a numeric dtype")
    if x._dtype is dtypes.complex64:
        return [(dtypes.float32, x._shape)]
    if x._dtype is dtypes.complex128:
        return [(dtypes.float64, x._shape)]
    return [(x._dtype, x._shape)]


define_op("Abs", _abs_shape)
inline_kernel("Abs", np.absolute)


def abs(x: Any, name: str | None = None) -> Tensor:
    """``|x|`` elementwise (op ``Abs``); complex inputs give their real magnitude."""
    return _unary("Abs", x, name)


define_op("Square", _unary_checked(_is_numeric, "a numeric dtype"))
inline_kernel("Square", np.square)


def square(x: Any, name: str | None = None) -> Tensor:
    """``x * x`` elementwise (op ``Square``)."""
    return _unary("Square", x, name)


define_op("Sqrt", _unary_checked(_is_inexact, "a floating or complex dtype"))
inline_kernel("Sqrt", np.sqrt)


def sqrt(x: Any, name: str | None = None) -> Tensor:
    """The elementwise square root of a floating or complex tensor (op ``Sqrt``)."""
    return _unary("Sqrt", x, name)


define_op("Exp", _unary_checked(_is_inexact, "a floating or complex dtype"))
inline_kernel("Exp", np.exp)


def exp(x: Any, name: str | None = None) -> Tensor:
    """``e ** x`` elementwise for floating or complex tensors (op ``Exp``)."""
    return _unary("Exp", x, name)


define_op("Log", _unary_checked(_is_inexact, "a floating or complex dtype"))
inline_kernel("Log", np.log)


def log(x: Any, name: str | None = None) -> Tensor:
    """The elementwise natural logarithm of a floating or complex tensor (op ``Log``)."""
    return _unary("Log", x, name)


define_op("Tanh", _unary_checked(_is_inexact, "a floating or complex dtype"))
inline_kernel("Tanh", np.tanh)


def tanh(x: Any, name: str | None = None) -> Tensor:
    """The elementwise hyperbolic tangent of a floating or complex tensor (op ``Tanh``)."""
    return _unary("Tanh", x, name)


# -- Cast --------------------------------------------------------------------------


def _cast_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    dst = attrs["DstT"]
    if x._dtype.is_string != dst.is_string:
        raise TypeError(f"cannot cast {x._dtype.name} to {dst.name}")
    return [(dst, x._shape)]


define_op("Cast", _cast_shape)


@registry.register_kernel_factory("Cast")
def _cast_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    dst = op._attrs["DstT"].np

    def cast_kernel(x: Any) -> Any:
        return x.astype(dst, copy=False)

    return cast_kernel, registry.INLINE


def cast(x: Any, dtype: Any, name: str | None = None) -> Tensor:
    """``x`` converted to ``dtype`` (op ``Cast``); floats truncate toward zero.

    As TensorFlow, a tensor that already has ``dtype`` is returned unchanged.
    """
    dst = dtypes.as_dtype(dtype)
    t = convert_to_tensor(x)
    if t.dtype is dst:
        return t
    return make_op("Cast", (t,), {"DstT": dst}, name=name, default_name="Cast").outputs[0]


# -- AddN -------------------------------------------------------------------------


def _add_n_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    if not inputs:
        raise ValueError("AddN needs at least one input")
    first = inputs[0]
    shape = first._shape
    for t in inputs[1:]:
        if t._dtype is not first._dtype:
            raise TypeError(
                f"inputs must have the same dtype, got {first._dtype.name} "
                f"({first.name}) and {t._dtype.name} ({t.name})"
            )
        shape = shape.merge_with(t._shape)
    _check_dtype(first, _is_numeric, "a numeric dtype")
    return [(first._dtype, shape)]


define_op("AddN", _add_n_shape)


def _add_many(*xs: Any) -> Any:
    if len(xs) <= 8:
        total = xs[0] + xs[1]
        for x in xs[2:]:
            total = total + x
        return total
    first = xs[0]
    if isinstance(first, np.generic):
        # Scalars (one dtype, checked at build time): one pass over them, ~100x
        # faster than stacking len(xs) zero-d arrays first.
        total = np.fromiter(xs, first.dtype, len(xs)).sum(dtype=first.dtype)
        return total
    # Many inputs: one stacked reduction instead of len(xs) ufunc calls (the inputs
    # have one dtype and shape, checked at build time; dtype= keeps small ints).
    stacked = np.stack(xs)
    return np.add.reduce(stacked, axis=0, dtype=stacked.dtype)


@registry.register_kernel_factory("AddN")
def _add_n_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    n = len(op._inputs)
    if n == 1:
        return (lambda x: x), registry.INLINE
    return (operator.add if n == 2 else _add_many), registry.INLINE


def add_n(inputs: Sequence[Any], name: str | None = None) -> Tensor:
    """The elementwise sum of a list of tensors of one dtype and shape (op ``AddN``)."""
    if isinstance(inputs, Tensor) or not isinstance(inputs, Sequence) or not inputs:
        raise ValueError("inputs must be a non-empty list of tensors of the same shape and dtype")
    tensors = [convert_to_tensor(x) for x in inputs]
    return make_op("AddN", tensors, name=name, default_name="AddN").outputs[0]


# -- MatMul ------------------------------------------------------------------------


def _matmul_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    a, b = inputs
    if a._dtype is not b._dtype:
        raise TypeError(
            f"inputs must have the same dtype, got {a._dtype.name} "
            f"({a.name}) and {b._dtype.name} ({b.name})"
        )
    _check_dtype(a, _is_numeric, "a numeric dtype")
    for t in (a, b):
        if t._shape.rank is not None and t._shape.rank < 2:
            raise ValueError(
                f"Shape must be at least rank 2 but is rank {t._shape.rank} "
                f"for input {t.name!r} with shape {t._shape}"
            )
    if a._shape.rank is None or b._shape.rank is None:
        return [(a._dtype, unknown_shape())]
    da, db = a._shape.as_list(), b._shape.as_list()
    rows, inner_a = (da[-1], da[-2]) if attrs["transpose_a"] else (da[-2], da[-1])
    inner_b, cols = (db[-1], db[-2]) if attrs["transpose_b"] else (db[-2], db[-1])
    if inner_a is not None and inner_b is not None and inner_a != inner_b:
        raise ValueError(
            f"Dimensions must be equal, but are {inner_a} and {inner_b} "
            f"for matmul with input shapes {a._shape} and {b._shape}"
        )
    batch = broadcast_shapes(TensorShape(da[:-2]), TensorShape(db[:-2]))
    return [(a._dtype, TensorShape([*batch.as_list(), rows, cols]))]


define_op("MatMul", _matmul_shape)


def _swap(x: Any) -> Any:
    return np.swapaxes(x, -1, -2)


def _matmul(a: Any, b: Any) -> Any:
    """``a @ b``; a stack of matrices times one matrix as one 2-D GEMM.

    numpy multiplies a ``[batch, rows, k]`` stack by a ``[k, n]`` matrix one GEMM per
    matrix of the stack; as ``[batch * rows, k] @ [k, n]`` it is one (a Dense layer on
    a sequence: 20 -> 15 us for 8x10x32 @ 32x96, 22 -> 9 us for 8x10x128 @ 128x32).
    """
    if getattr(a, "ndim", 0) > 2 and getattr(b, "ndim", 0) == 2:
        out = np.matmul(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]), b)
        return out.reshape(*a.shape[:-1], out.shape[-1])
    return np.matmul(a, b)


@registry.register_kernel_factory("MatMul")
def _matmul_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    ta, tb = op._attrs["transpose_a"], op._attrs["transpose_b"]
    if not ta and not tb:
        return _matmul, registry.INLINE
    if ta and tb:
        return (lambda a, b: np.matmul(_swap(a), _swap(b))), registry.INLINE
    if ta:
        return (lambda a, b: np.matmul(_swap(a), b)), registry.INLINE
    return (lambda a, b: _matmul(a, _swap(b))), registry.INLINE


def matmul(
    a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False, name: str | None = None
) -> Tensor:
    """The matrix product ``a @ b`` of rank >= 2 tensors (op ``MatMul``).

    Leading (batch) dimensions broadcast; ``transpose_a``/``transpose_b`` transpose the
    last two dimensions first.  Mismatched inner dimensions → ``ValueError``.
    """
    a, b = binary_inputs(a, b, name or "MatMul")
    attrs = {"transpose_a": bool(transpose_a), "transpose_b": bool(transpose_b)}
    return make_op("MatMul", (a, b), attrs, name=name, default_name="MatMul").outputs[0]


# -- reductions ---------------------------------------------------------------------


def _normalize_axes(axis: Any, op_type: str, name: str | None) -> list[int] | None:
    if axis is None:
        return None
    axis = static_value(axis, "the reduction axis", op_type, name)
    if isinstance(axis, np.ndarray):
        axis = axis.tolist()
    items = list(axis) if isinstance(axis, list | tuple) else [axis]
    out: list[int] = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int | np.integer):
            raise TypeError(f"reduction axis must be an int or a list of ints, got {axis!r}")
        out.append(int(a))
    return out


def _reduced_shape(x: Tensor, axes: list[int] | None, keepdims: bool) -> TensorShape:
    rank = x._shape.rank
    if rank is None:
        if axes is None and not keepdims:
            return TensorShape(())
        return x._shape if axes == [] else unknown_shape()
    if axes is None:
        return TensorShape([1] * rank) if keepdims else TensorShape(())
    dims = x._shape.as_list()
    drop = set()
    for a in axes:
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for input {x.name!r} of rank {rank}")
        drop.add(a % rank)
    if keepdims:
        return TensorShape([1 if i in drop else d for i, d in enumerate(dims)])
    return TensorShape([d for i, d in enumerate(dims) if i not in drop])


def _reduce_shape_fn(
    allowed: Callable[[dtypes.DType], bool], what: str
) -> Callable[[Sequence[Tensor], Mapping[str, Any]], Specs]:
    def shape_fn(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
        (x,) = inputs
        _check_dtype(x, allowed, what)
        return [(x._dtype, _reduced_shape(x, attrs["axis"], attrs["keep_dims"]))]

    return shape_fn


def _np_axis(axes: list[int] | None) -> tuple[int, ...] | None:
    return None if axes is None else tuple(axes)


def _reduction_factory(fn: Callable[..., Any], pass_dtype: bool) -> registry.KernelFactory:
    def factory(op: Operation) -> tuple[Callable[..., Any], int]:
        x = op._inputs[0]
        kwargs: dict[str, Any] = {
            "axis": _np_axis(op._attrs["axis"]),
            "keepdims": op._attrs["keep_dims"],
        }
        if pass_dtype:
            # Keep the input dtype (a sum would widen int32 to int64).
            kwargs["dtype"] = x._dtype.np
        return functools.partial(fn, **kwargs), registry.INLINE

    return factory


def _reduce(
    op_type: str,
    input_tensor: Any,
    axis: Any,
    keepdims: Any,
    name: str | None,
    reduction_indices: Any,
    keep_dims: Any,
) -> Tensor:
    if reduction_indices is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'reduction_indices'")
        axis = reduction_indices
    if keep_dims is not None:
        keepdims = keep_dims
    x = convert_to_tensor(input_tensor)
    attrs = {"axis": _normalize_axes(axis, op_type, name), "keep_dims": bool(keepdims)}
    return make_op(op_type, (x,), attrs, name=name, default_name=op_type).outputs[0]


_NUMERIC = (_is_numeric, "a numeric dtype")
_ORDERED = (lambda d: d.is_integer or d.is_floating, "an integer or floating dtype")
_BOOL = (lambda d: d.is_bool, "bool")

# The ufuncs' own reduce: what np.sum / np.all / np.max call, without their Python
# wrappers (a microsecond or two a call, the cost of a small reduction in a loop).
for _type, _fn, _allowed, _pass_dtype in (
    ("Sum", np.add.reduce, _NUMERIC, True),
    ("Prod", np.multiply.reduce, _NUMERIC, True),
    ("All", np.logical_and.reduce, _BOOL, False),
    ("Any", np.logical_or.reduce, _BOOL, False),
):
    define_op(_type, _reduce_shape_fn(*_allowed))
    registry.register_kernel_factory(_type)(_reduction_factory(_fn, _pass_dtype))


def _extreme_factory(fn: Callable[..., Any], lowest: bool) -> registry.KernelFactory:
    """Max / Min: over an empty axis the result is the identity, as TF.

    The identity of max is -inf for floats and the dtype's minimum for integers
    (min: +inf / the maximum); numpy raises for an empty reduction without it.
    """

    def factory(op: Operation) -> tuple[Callable[..., Any], int]:
        dt = op._inputs[0]._dtype.np
        if dt.kind == "f":
            initial: Any = -np.inf if lowest else np.inf
        else:
            info = np.iinfo(dt)
            initial = info.min if lowest else info.max
        return functools.partial(
            fn, axis=_np_axis(op._attrs["axis"]), keepdims=op._attrs["keep_dims"], initial=initial
        ), registry.INLINE

    return factory


define_op("Max", _reduce_shape_fn(*_ORDERED))
registry.register_kernel_factory("Max")(_extreme_factory(np.maximum.reduce, lowest=True))
define_op("Min", _reduce_shape_fn(*_ORDERED))
registry.register_kernel_factory("Min")(_extreme_factory(np.minimum.reduce, lowest=False))
define_op("Mean", _reduce_shape_fn(*_NUMERIC))


def _integer_mean(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
    # TF accumulates in a wider type and truncates toward zero; an empty mean is 0.
    wide = np.uint64 if x.dtype.kind == "u" else np.int64
    total = np.sum(x, axis=axis, keepdims=keepdims, dtype=wide)
    count = x.size // max(np.size(total), 1) if x.size else 0
    if count == 0:
        return np.zeros_like(total, dtype=x.dtype)[()]
    quotient = np.abs(total) // count
    return np.where(total < 0, -quotient, quotient).astype(x.dtype)[()]


def _float_mean(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
    if x.size == 0:  # nan as TF, without numpy's "Mean of empty slice" warning
        shape = np.sum(x, axis=axis, keepdims=keepdims).shape
        return np.full(shape, np.nan, dtype=x.dtype)[()]
    # np.mean's own sum and division (the same rounding) without its Python wrappers,
    # a third of its cost on a layer norm's rows.
    add_reduce: Any = np.add.reduce  # (numpy's stubs take keepdims as a literal only)
    total = add_reduce(x, axis=axis, dtype=x.dtype, keepdims=keepdims)
    return total / (x.size // max(np.size(total), 1))


@registry.register_kernel_factory("Mean")
def _mean_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    dt = op._inputs[0]._dtype
    fn = _integer_mean if dt.is_integer else _float_mean
    return functools.partial(
        fn, axis=_np_axis(op._attrs["axis"]), keepdims=op._attrs["keep_dims"]
    ), registry.INLINE


def reduce_sum(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """The sum over ``axis`` (an int, a list of ints, or None for all), op ``Sum``.

    Keeps the input dtype; negative axes count from the end; ``keepdims`` keeps the
    reduced dimensions with length 1.
    """
    return _reduce("Sum", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_mean(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """The mean over ``axis`` (op ``Mean``); integer inputs give a truncated integer mean."""
    return _reduce("Mean", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_max(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """The maximum over ``axis`` (op ``Max``)."""
    return _reduce("Max", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_min(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """The minimum over ``axis`` (op ``Min``)."""
    return _reduce("Min", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_prod(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """The product over ``axis`` (op ``Prod``), in the input dtype."""
    return _reduce("Prod", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_all(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """Logical and over ``axis`` of a bool tensor (op ``All``)."""
    return _reduce("All", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_any(
    input_tensor: Any,
    axis: Any = None,
    keepdims: Any = None,
    name: str | None = None,
    reduction_indices: Any = None,
    keep_dims: Any = None,
) -> Tensor:
    """Logical or over ``axis`` of a bool tensor (op ``Any``)."""
    return _reduce("Any", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


# -- ArgMax / ArgMin -------------------------------------------------------------


def _arg_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    _check_dtype(
        x,
        lambda d: d.is_integer or d.is_floating or d.is_bool,
        "an integer, floating or bool dtype",
    )
    out = attrs["output_type"]
    if out not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"output_type must be int32 or int64, got {out.name}")
    rank = x._shape.rank
    axis = attrs["axis"]
    if rank is None:
        return [(out, unknown_shape())]
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for input {x.name!r} of rank {rank}")
    dims = x._shape.as_list()
    del dims[axis % rank]
    return [(out, TensorShape(dims))]


def _arg_factory(fn: Callable[..., Any], nan_as: float) -> registry.KernelFactory:
    """ArgMax / ArgMin as TF's CPU kernel: NaNs are skipped (an all-NaN slice gives 0),
    ties give the first index, an empty axis is ``InvalidArgumentError``."""

    def factory(op: Operation) -> tuple[Callable[..., Any], int]:
        axis = op._attrs["axis"]
        out = op._attrs["output_type"].np
        floating = op._inputs[0]._dtype.is_floating

        def arg_kernel(x: Any) -> Any:
            if x.shape[axis] == 0:
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"Reduction axis {axis} is empty in shape [{','.join(map(str, x.shape))}]",
                )
            if floating:
                nans = np.isnan(x)
                if nans.any():
                    x = np.where(nans, nan_as, x)
            return fn(x, axis=axis).astype(out)

        return arg_kernel, registry.INLINE

    return factory


for _type, _arg_fn, _nan_as in (("ArgMax", np.argmax, -np.inf), ("ArgMin", np.argmin, np.inf)):
    define_op(_type, _arg_shape)
    registry.register_kernel_factory(_type)(_arg_factory(_arg_fn, _nan_as))


def _arg(
    op_type: str, input: Any, axis: Any, name: str | None, output_type: Any, dimension: Any
) -> Tensor:
    if dimension is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'dimension'")
        axis = dimension
    axes = _normalize_axes(0 if axis is None else axis, op_type, name)
    if axes is None or len(axes) != 1:
        raise TypeError(f"{op_type} axis must be a single int, got {axis!r}")
    attrs = {"axis": axes[0], "output_type": dtypes.as_dtype(output_type)}
    return make_op(
        op_type, (convert_to_tensor(input),), attrs, name=name, default_name=op_type
    ).outputs[0]


def argmax(
    input: Any,
    axis: Any = None,
    name: str | None = None,
    dimension: Any = None,
    output_type: Any = dtypes.int64,
) -> Tensor:
    """The index of the largest value along ``axis`` (default 0), op ``ArgMax``."""
    return _arg("ArgMax", input, axis, name, output_type, dimension)


def argmin(
    input: Any,
    axis: Any = None,
    name: str | None = None,
    dimension: Any = None,
    output_type: Any = dtypes.int64,
) -> Tensor:
    """The index of the smallest value along ``axis`` (default 0), op ``ArgMin``."""
    return _arg("ArgMin", input, axis, name, output_type, dimension)


# -- Range --------------------------------------------------------------------------

_RANGE_ORDER = (dtypes.int32, dtypes.int64, dtypes.float32, dtypes.float64)


def _const_scalar(t: Tensor) -> Any:
    value = const_value(t)
    return None if value is None or value.ndim else value[()]


def _range_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    dt = inputs[0]._dtype
    for t in inputs:
        if t._dtype is not dt:
            raise TypeError(
                f"start, limit and delta must have the same dtype, got "
                f"{dt.name} and {t._dtype.name} ({t.name})"
            )
        if t._shape.rank not in (0, None):
            raise ValueError(
                f"start, limit and delta must be scalars, got shape {t._shape} ({t.name})"
            )
    if dt not in _RANGE_ORDER:
        raise TypeError(f"range takes int32, int64, float32 or float64, got {dt.name}")
    values = [_const_scalar(t) for t in inputs]
    if any(v is None for v in values):
        return [(dt, TensorShape([None]))]
    start, limit, delta = values
    return [(dt, TensorShape([len(_range_kernel(start, limit, delta))]))]


define_op("Range", _range_shape)


def _range_kernel(start: Any, limit: Any, delta: Any) -> np.ndarray:
    if delta == 0:
        raise ValueError("Requires delta != 0")
    if delta > 0 and start > limit:
        raise ValueError(f"Requires start <= limit when delta > 0: {start}/{limit}")
    if delta < 0 and start < limit:
        raise ValueError(f"Requires start >= limit when delta < 0: {start}/{limit}")
    return np.arange(start, limit, delta, dtype=np.result_type(start))


inline_kernel("Range", _range_kernel)


def _range_arg(value: Any, dtype: dtypes.DType) -> Tensor:
    if isinstance(value, Tensor):
        return cast(value, dtype)
    try:
        return convert_to_tensor(value, dtype=dtype)
    except TypeError:
        return cast(convert_to_tensor(value), dtype)


def range(
    start: Any, limit: Any = None, delta: Any = 1, dtype: Any = None, name: str | None = "range"
) -> Tensor:
    """``[start, start + delta, ...]`` up to but excluding ``limit`` (TF ``tf.range``).

    ``range(n)`` counts from 0.  Without ``dtype`` the widest of the arguments' dtypes
    (int32 < int64 < float32 < float64) is used.
    """
    if limit is None:
        start, limit = 0, start
    args = (start, limit, delta)
    if dtype is not None:
        dt = dtypes.as_dtype(dtype)
    else:
        inferred = [a.dtype if isinstance(a, Tensor) else dtypes.dtype_of_value(a) for a in args]
        dt = builtins.max(
            inferred, key=lambda d: _RANGE_ORDER.index(d) if d in _RANGE_ORDER else -1
        )
    tensors = tuple(_range_arg(a, dt) for a in args)
    return make_op("Range", tensors, name=name, default_name="range").outputs[0]


# -- Select / Where -----------------------------------------------------------------


def _select_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    cond, x, y = inputs
    _check_dtype(cond, lambda d: d.is_bool, "bool")
    ((dt, shape),) = binary_shape((x, y), attrs)
    return [(dt, broadcast_shapes(cond._shape, shape))]


define_op("SelectV2", _select_shape)
inline_kernel("SelectV2", np.where)


def _where_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (cond,) = inputs
    _check_dtype(cond, lambda d: d.is_bool or d.is_numeric, "bool or numeric")
    # A scalar condition builds, as in TF ([n, 0] statically); its kernel rejects it.
    return [(dtypes.int64, TensorShape([None, cond._shape.rank]))]


define_op("Where", _where_shape)


def _where_kernel(cond: Any) -> np.ndarray:
    if cond.ndim == 0:  # as TF's kernel: it handles ranks 1 to 8 only
        raise errors.InvalidArgumentError(None, None, "WhereOp : Unhandled input dimensions: 0")
    return np.argwhere(cond).astype(np.int64, copy=False)


inline_kernel("Where", _where_kernel)


def where(condition: Any, x: Any = None, y: Any = None, name: str | None = None) -> Tensor:
    """With ``x`` and ``y``: elements of ``x`` where ``condition`` else ``y`` (broadcast).

    Without them: the int64 coordinates ``[N, rank]`` of the true (non-zero) elements
    of ``condition``, as ``tf.where``.
    """
    cond = convert_to_tensor(condition)
    if x is None and y is None:
        return make_op("Where", (cond,), name=name, default_name="Where").outputs[0]
    if x is None or y is None:
        raise ValueError("x and y must both be given, or both be None")
    xt, yt = binary_inputs(x, y, name or "Select")
    return make_op("SelectV2", (cond, xt, yt), name=name, default_name="Select").outputs[0]


# -- Tensor operators ---------------------------------------------------------------


def _binary_operator(
    fn: Callable[..., Tensor], name: str, op_type: str | None = None
) -> tuple[Callable[[Tensor, Any], Tensor], Callable[[Tensor, Any], Tensor]]:
    """The forward and reflected operator of ``fn``.  With ``op_type`` (``fn`` is
    ``_binary(op_type, ...)``), two tensors go straight to the op (see
    ``graph._binary_operator``): a long chain of ``x + y`` is built op by op."""

    def forward(self: Tensor, other: Any) -> Tensor:
        return fn(self, other, name=name)

    def reflected(self: Tensor, other: Any) -> Tensor:
        return fn(other, self, name=name)

    if op_type is None:
        return forward, reflected
    return graph_module._binary_operator(op_type, name, forward), reflected


def _matmul_named(a: Any, b: Any, name: str) -> Tensor:
    return matmul(a, b, name=name)


def _install_operators() -> None:
    # TF names operator-made ops in lowercase ("add", "truediv"); named functions
    # keep the op type ("Less", "LogicalAnd").  The typed methods of
    # graph.TensorOperators look these up; Python picks the reflected one for `1 + x`.
    table: dict[str, tuple[Callable[..., Tensor], str, str | None]] = {
        "add": (add, "add", "Add"),
        "sub": (subtract, "sub", "Sub"),
        "mul": (multiply, "mul", "Mul"),
        "truediv": (divide, "truediv", None),
        "floordiv": (floordiv, "floordiv", "FloorDiv"),
        "mod": (mod, "mod", "FloorMod"),
        "pow": (pow, "pow", "Pow"),
        "matmul": (_matmul_named, "matmul", None),
        "and": (logical_and, "LogicalAnd", None),
        "or": (logical_or, "LogicalOr", None),
        "xor": (logical_xor, "LogicalXor", None),
    }
    operators: dict[str, Callable[..., Tensor]] = {}
    for key, (fn, name, op_type) in table.items():
        operators[key], operators[f"r{key}"] = _binary_operator(fn, name, op_type)
    for key, fn, name in (
        ("lt", less, "Less"),
        ("le", less_equal, "LessEqual"),
        ("gt", greater, "Greater"),
        ("ge", greater_equal, "GreaterEqual"),
    ):
        operators[key] = _binary_operator(fn, name, name)[0]
    operators.update(neg=negative, abs=abs, invert=logical_not)
    graph_module._OPERATORS.update(operators)
    # getitem (StridedSlice) is installed by asyncflow.ops.slice_ops.


_install_operators()
