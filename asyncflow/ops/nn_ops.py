"""Neural-network ops: relu, sigmoid, softmax (exported as ``af.nn``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.ops._base import define_op, inline_kernel, make_op

__all__ = ["relu", "sigmoid", "softmax"]

Specs = list[tuple[dtypes.DType, Any]]


def _real_unary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not (x._dtype.is_integer or x._dtype.is_floating):
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected an "
                        f"integer or floating dtype")
    return [(x._dtype, x._shape)]


def _float_unary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not x._dtype.is_floating:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a "
                        f"floating dtype")
    return [(x._dtype, x._shape)]


# -- Relu ------------------------------------------------------------------------------

define_op("Relu", _real_unary_shape)


@registry.register_kernel_factory("Relu")
def _relu_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    # A zero of the input dtype keeps the result dtype exact for every input kind.
    zero = op._inputs[0]._dtype.as_numpy_dtype(0)
    return functools.partial(np.maximum, zero), registry.INLINE


def relu(features: Any, name: str | None = None) -> Tensor:
    """``max(features, 0)`` elementwise (op ``Relu``)."""
    x = convert_to_tensor(features)
    return make_op("Relu", (x,), name=name, default_name="Relu").outputs[0]


# -- Sigmoid -----------------------------------------------------------------------

define_op("Sigmoid", _float_unary_shape)


def _sigmoid_kernel(x: Any) -> Any:
    # 1 / (1 + exp(-x)) overflows for large negative x; the tanh form never does.
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


inline_kernel("Sigmoid", _sigmoid_kernel)


def sigmoid(x: Any, name: str | None = None) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise, computed without overflow (op ``Sigmoid``)."""
    t = convert_to_tensor(x)
    return make_op("Sigmoid", (t,), name=name, default_name="Sigmoid").outputs[0]


# -- Softmax -----------------------------------------------------------------------

def _softmax_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = _float_unary_shape(inputs, attrs)
    (x,) = inputs
    rank = x._shape.rank
    axis = attrs["axis"]
    if rank is not None:
        if rank == 0:
            raise ValueError(f"softmax needs logits of rank >= 1, got a scalar ({x.name})")
        if not -rank <= axis < rank:
            raise ValueError(f"axis {axis} is out of range [{-rank}, {rank}) for logits "
                             f"{x.name!r} of rank {rank}")
    return specs


define_op("Softmax", _softmax_shape)


def _softmax(x: Any, axis: int) -> Any:
    # Subtracting the max makes exp() overflow-free; the result is unchanged.
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


inline_kernel("Softmax", _softmax, attrs=("axis",))


def softmax(logits: Any, axis: int | None = None, name: str | None = None,
            dim: int | None = None) -> Tensor:
    """``exp(logits) / sum(exp(logits), axis)``, numerically stable (op ``Softmax``).

    ``axis`` defaults to the last dimension; ``dim`` is its TF 1.x alias.
    """
    if dim is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'dim'")
        axis = dim
    x = convert_to_tensor(logits)
    a = -1 if axis is None else int(axis)
    return make_op("Softmax", (x,), {"axis": a}, name=name, default_name="Softmax").outputs[0]
