"""Helpers shared by the op modules: defining ops, kernels and constructors tersely.

Every op module follows the same pattern, one block per op::

    define_op("Add", binary_shape)                 # build-time: dtype + shape checks
    inline_kernel("Add", np.add)                  # run-time: the numpy callable
    def add(x, y, name=None): ...                  # the public constructor

Kernels receive numpy values (arrays or numpy scalars) and return one value, a
sequence of values (several outputs) or None (no outputs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.constant_eval import blocking_op, constant_value
from asyncflow.framework.graph import (
    Graph,
    Operation,
    Tensor,
    convert_to_tensor,
    get_default_graph,
)
from asyncflow.framework.shapes import TensorShape, broadcast_shapes

__all__ = [
    "binary_inputs",
    "binary_shape",
    "const_value",
    "define_op",
    "inline_kernel",
    "is_tensor",
    "make_op",
    "register_op",
    "same_shape",
    "static_value",
    "unary_shape",
]

define_op = registry.define_op


def inline_kernel(
    op_type: str, fn: Callable[..., Any] | None = None, *, attrs: Sequence[str] = ()
) -> Any:
    """Register ``fn`` as the INLINE CPU kernel of ``op_type``.

    ``attrs`` names the op attributes bound into ``fn`` as keyword arguments (once
    per plan, by ``functools.partial``).  Usable as a decorator.
    """
    if fn is None:
        return functools.partial(inline_kernel, op_type, attrs=attrs)
    bound = tuple(attrs)

    def factory(op: Operation) -> tuple[Callable[..., Any], int]:
        if not bound:
            return fn, registry.INLINE
        return functools.partial(fn, **{a: op._attrs[a] for a in bound}), registry.INLINE

    registry.register_kernel_factory(op_type, static=not bound)(factory)
    return fn


def make_op(
    op_type: str,
    inputs: Sequence[Tensor],
    attrs: Mapping[str, Any] | None = None,
    name: str | None = None,
    default_name: str | None = None,
) -> Operation:
    """Create an op of ``op_type`` in the default graph (named ``name`` or ``default_name``)."""
    graph = get_default_graph()
    for t in inputs:
        if t._op._graph is not graph and not graph._can_capture(t._op._graph):
            # TF picks the inputs' graph; we do the same when they agree.
            graph = t._op._graph
            break
    if type(graph) is Graph:  # a subclass (a function body) may override create_op
        return graph._create_op(op_type, inputs, attrs, name or default_name or op_type, (), 2)
    return graph.create_op(op_type, inputs, attrs, name=name or default_name or op_type)


def register_op(
    op_type: str,
    shape_fn: registry.ShapeFn,
    *,
    stateful: bool = False,
    kernel: Callable[..., Any] | None = None,
    expensive: bool = False,
) -> Callable[..., Any]:
    """Register a new op type and return its constructor.

    ``shape_fn(inputs, attrs)`` returns one ``(dtype, shape)`` pair per output.  The
    returned constructor is ``make(*inputs, name=None, **attrs)``: it converts the
    inputs to tensors, adds the op to the default graph (as :func:`make_op`) and
    returns its single output Tensor, a list of Tensors for several outputs, or the
    Operation for none.  ``kernel``, when given, is registered with
    :func:`~asyncflow.framework.registry.register_kernel`.
    """
    if not isinstance(op_type, str) or not op_type or op_type.startswith("_"):
        raise ValueError(f"op type must be a non-empty name not starting with '_', got {op_type!r}")
    registry.define_op(op_type, shape_fn, stateful=stateful)
    if kernel is not None:
        registry.register_kernel(op_type, kernel, expensive=expensive)

    def make(*inputs: Any, name: str | None = None, **attrs: Any) -> Any:
        op = make_op(op_type, [convert_to_tensor(x) for x in inputs], attrs, name)
        if len(op.outputs) == 1:
            return op.outputs[0]
        return list(op.outputs) if op.outputs else op

    make.__name__ = op_type
    make.__doc__ = f"Add a {op_type!r} op to the default graph."
    return make


def _is_python_scalar_like(value: Any) -> bool:
    return not isinstance(value, Tensor) and not hasattr(value, "_as_graph_element")


def binary_inputs(x: Any, y: Any, op_name: str) -> tuple[Tensor, Tensor]:
    """Convert both operands to tensors, giving Python values the other operand's dtype.

    Constants are made in the graph of the operand that is already a tensor (as TF),
    whatever the default graph is.
    """
    graph = _graph_of(x) or _graph_of(y)
    default = get_default_graph()
    if graph is not None and graph is not default and not default._can_capture(graph):
        with graph.as_default():
            return binary_inputs(x, y, op_name)
    if isinstance(x, Tensor) or not _is_python_scalar_like(x):
        x = convert_to_tensor(x)
        y = _convert_like(y, x.dtype, op_name)
    elif isinstance(y, Tensor) or not _is_python_scalar_like(y):
        y = convert_to_tensor(y)
        x = _convert_like(x, y.dtype, op_name)
    else:
        x = convert_to_tensor(x)
        y = _convert_like(y, x.dtype, op_name)
    return x, y


def _graph_of(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value._op._graph
    if hasattr(value, "_as_graph_element"):
        return value.graph
    return None


def _has_float(value: Any) -> bool:
    if isinstance(value, float | np.floating):
        return True
    if isinstance(value, list | tuple):
        return any(_has_float(v) for v in value)
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"


def _convert_like(value: Any, dtype: dtypes.DType, op_name: str) -> Tensor:
    if isinstance(value, Tensor) or not _is_python_scalar_like(value):
        return convert_to_tensor(value)
    if (dtype.is_integer or dtype.is_bool) and _has_float(value):
        # As TF: a float literal never silently becomes an integer, even 2.0.
        raise TypeError(
            f"{op_name}: expected {dtype.name} for the other operand, got "
            f"{value!r} of type {type(value).__name__!r}"
        )
    try:
        return convert_to_tensor(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{op_name}: cannot convert {value!r} to the other operand's dtype {dtype.name}: {exc}"
        ) from None


def binary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """Same-dtype operands, numpy-broadcast shapes; output has the operands' dtype."""
    x, y = inputs
    if x._dtype is not y._dtype:
        raise TypeError(
            f"inputs must have the same dtype, got {x._dtype.name} "
            f"({x.name}) and {y._dtype.name} ({y.name})"
        )
    return [(x._dtype, broadcast_shapes(x._shape, y._shape))]


def unary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """One input; output of the same dtype and shape."""
    (x,) = inputs
    return [(x._dtype, x._shape)]


def same_shape(t: Tensor) -> TensorShape:
    """The static shape of ``t`` (a readability helper)."""
    return t._shape


# -- static arguments ----------------------------------------------------------------


def const_value(t: Tensor) -> np.ndarray | None:
    """The value of ``t`` when it is known at build time, else None.

    ``t`` is a graph tensor (shape functions: a constant, or computed from constants
    alone, see :func:`~asyncflow.framework.constant_eval.constant_value`) or a
    compiled node's input ``ValueInfo`` (kernel factories), which carries the value
    of a constant input."""
    if getattr(t, "_op", None) is None:
        return getattr(t, "value", None)
    return constant_value(t)


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a graph tensor or converts to one (a ``Variable``)."""
    return isinstance(value, Tensor) or hasattr(value, "_as_graph_element")


def static_value(value: Any, what: str, op_type: str, name: str | None) -> Any:
    """``value`` itself, or when it is a tensor, its build-time value (an ndarray).

    The one gate of every static argument an op constructor takes (a perm, an axis,
    reduction axes): a tensor computed from constants alone is evaluated, as TF's
    ``constant_value``; one that depends on a feed, a variable or a random op is a
    ``TypeError`` naming the op being built and the tensor."""
    if not is_tensor(value):
        return value
    t = convert_to_tensor(value)
    found = constant_value(t)
    if found is None:
        blocker = blocking_op(t)
        cause = (
            "values known only when the graph runs"
            if blocker is None
            else f"{blocker.name!r} ({blocker.type})"
        )
        raise TypeError(
            f"cannot build {op_type} {name or op_type!r}: {what} must be known "
            f"when the graph is built (a constant, or computed from constants "
            f"only), got {t.name!r} ({t.op.type}), which depends on {cause}"
        )
    return found
