"""Random ops: RandomUniform, RandomUniformInt, RandomStandardNormal, TruncatedNormal.

Seeds follow TensorFlow 1.x's rules (``tf.compat.v1.get_seed``): with a graph-level
seed (``af.set_random_seed``) an op without its own seed takes the graph's op count
as op seed, so rebuilding the same graph gives the same sequence; an op seed without
a graph seed pairs with TF's default graph seed 87654321; neither gives fresh
randomness per session.  The seeds land in the ``seed``/``seed2`` attributes as in TF.

The numbers are TensorFlow's: :mod:`asyncflow.ops._philox` reproduces its Philox4x32-10
streams and distributions, so a seeded op gives TF's values (to float32 rounding of
log / sin / cos), run after run.  The stream lives per session and op (the session's
resource manager), so consecutive runs draw new numbers and a new session starts
over, as in TF.  The ops are stateful: never constant-folded or merged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Graph, Operation, Tensor, convert_to_tensor, get_default_graph
from asyncflow.framework.shapes import TensorShape, unknown_shape
from asyncflow.ops._base import const_value, define_op, make_op
from asyncflow.ops._philox import PhiloxStream
from asyncflow.ops.array_ops import constant

__all__ = ["get_seed", "random_normal", "random_uniform", "set_random_seed", "truncated_normal"]

Specs = list[tuple[dtypes.DType, Any]]

DEFAULT_GRAPH_SEED = 87654321
_MAXINT32 = 2**31 - 1
_FLOATS = (dtypes.float16, dtypes.float32, dtypes.float64)


def set_random_seed(seed: int | None) -> None:
    """Set the graph-level random seed of the default graph (``tf.compat.v1.set_random_seed``)."""
    get_default_graph()._seed = None if seed is None else int(seed)


def get_seed(op_seed: int | None, graph: Graph | None = None) -> tuple[int | None, int | None]:
    """The ``(graph seed, op seed)`` an op uses, by TensorFlow 1.x's rules."""
    g = graph if graph is not None else get_default_graph()
    graph_seed: int | None = getattr(g, "_seed", None)
    if graph_seed is not None:
        seeds: tuple[int | None, int | None] = (
            graph_seed,
            len(g._ops) if op_seed is None else int(op_seed),
        )
    elif op_seed is not None:
        seeds = (DEFAULT_GRAPH_SEED, int(op_seed))
    else:
        seeds = (None, None)
    if seeds == (0, 0):
        # (0, 0) means "nondeterministic" to the kernels; TF avoids it the same way.
        return 0, _MAXINT32
    return seeds


def _random_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    shape = inputs[0]
    if shape._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"shape {shape.name!r} must be int32 or int64, got {shape._dtype.name}")
    if shape._shape.rank not in (1, None):
        raise ValueError(f"shape {shape.name!r} must be a vector, got shape {shape._shape}")
    dt = attrs["dtype"] if "dtype" in attrs else inputs[1]._dtype
    value = const_value(shape)
    if value is not None:
        dims = np.asarray(value).reshape(-1).tolist()
        if any(d < 0 for d in dims):
            raise ValueError(f"shape must be non-negative, got {dims}")
        return [(dt, TensorShape(dims))]
    n = shape._shape[0] if shape._shape.rank == 1 else None
    return [(dt, unknown_shape(n))]


def _float_random_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    if attrs["dtype"] not in _FLOATS:
        raise TypeError(f"dtype must be float16, float32 or float64, got {attrs['dtype'].name}")
    return _random_shape(inputs, attrs)


def _int_random_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    _, lo, hi = inputs
    if lo._dtype not in (dtypes.int32, dtypes.int64) or hi._dtype is not lo._dtype:
        raise TypeError(
            f"minval and maxval must both be int32 or int64, got "
            f"{lo._dtype.name} and {hi._dtype.name}"
        )
    return _random_shape(inputs, attrs)


for _type in ("RandomUniform", "RandomStandardNormal", "TruncatedNormal"):
    define_op(_type, _float_random_shape, stateful=True)
define_op("RandomUniformInt", _int_random_shape, stateful=True)


def _stream(op: Operation, resources: Any) -> PhiloxStream:
    seed, seed2 = int(op._attrs.get("seed", 0)), int(op._attrs.get("seed2", 0))
    stream: PhiloxStream = resources.lookup_or_create(
        "random", op._name, PhiloxStream, lambda: PhiloxStream(seed, seed2)
    )
    return stream


def _dims(shape: Any) -> tuple[int, ...]:
    dims = tuple(np.asarray(shape).reshape(-1).tolist())
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative, got {list(dims)}")
    return dims


def _float_factory(method: str) -> Callable[[Operation, Any], tuple[Callable[..., Any], int]]:
    def factory(op: Operation, resources: Any) -> tuple[Callable[..., Any], int]:
        draw = getattr(_stream(op, resources), method)
        dt = op._attrs["dtype"].np

        def random_kernel(shape: Any) -> Any:
            dims = _dims(shape)
            return draw(math.prod(dims), dt).reshape(dims)

        return random_kernel, registry.INLINE

    return factory


registry.register_kernel_factory("RandomUniform", needs_resources=True)(_float_factory("uniform"))
registry.register_kernel_factory("RandomStandardNormal", needs_resources=True)(
    _float_factory("normal")
)
registry.register_kernel_factory("TruncatedNormal", needs_resources=True)(
    _float_factory("truncated_normal")
)


@registry.register_kernel_factory("RandomUniformInt", needs_resources=True)
def _uniform_int_factory(op: Operation, resources: Any) -> tuple[Callable[..., Any], int]:
    stream = _stream(op, resources)
    dt = op._outputs[0]._dtype.np

    def uniform_int_kernel(shape: Any, lo: Any, hi: Any) -> Any:
        if not lo < hi:
            raise ValueError(f"Need minval < maxval: {lo} >= {hi}")
        dims = _dims(shape)
        return stream.uniform_int(math.prod(dims), int(lo), int(hi), dt).reshape(dims)

    return uniform_int_kernel, registry.INLINE


def _shape_tensor(shape: Any) -> Tensor:
    if isinstance(shape, Tensor) or hasattr(shape, "_as_graph_element"):
        return convert_to_tensor(shape)
    if isinstance(shape, TensorShape):
        shape = shape.as_list()
    return constant(np.asarray(shape, np.int32).reshape(-1), dtype=dtypes.int32, name="shape")


def _random_op(
    op_type: str,
    shape: Any,
    dtype: Any,
    seed: int | None,
    name: str | None,
    extra: Sequence[Tensor] = (),
) -> Tensor:
    s1, s2 = get_seed(seed)
    attrs: dict[str, Any] = {"seed": s1 or 0, "seed2": s2 or 0}
    if op_type != "RandomUniformInt":
        attrs["dtype"] = dtypes.as_dtype(dtype)
    return make_op(
        op_type, (_shape_tensor(shape), *extra), attrs, name=name, default_name=op_type
    ).outputs[0]


def random_uniform(
    shape: Any,
    minval: Any = 0,
    maxval: Any = None,
    dtype: Any = dtypes.float32,
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """Uniform values in ``[minval, maxval)`` (``maxval`` defaults to 1 for floats).

    Floats: ``RandomUniform * (maxval - minval) + minval``, as TF; ints: ``RandomUniformInt``
    (``maxval`` required).
    """
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops.math_ops import add, multiply, subtract

    dt = dtypes.as_dtype(dtype)
    with name_scope(name or "random_uniform"):
        if dt.is_integer:
            if maxval is None:
                raise ValueError(f"random_uniform: maxval is required for {dt.name}")
            lo, hi = convert_to_tensor(minval, dtype=dt), convert_to_tensor(maxval, dtype=dt)
            return _random_op("RandomUniformInt", shape, dt, seed, None, (lo, hi))
        lo = convert_to_tensor(minval, dtype=dt)
        hi = convert_to_tensor(1 if maxval is None else maxval, dtype=dt)
        rnd = _random_op("RandomUniform", shape, dt, seed, None)
        return add(multiply(rnd, subtract(hi, lo)), lo)


def random_normal(
    shape: Any,
    mean: Any = 0.0,
    stddev: Any = 1.0,
    dtype: Any = dtypes.float32,
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """Normal values: ``RandomStandardNormal * stddev + mean``, as TF."""
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops.math_ops import add, multiply

    dt = dtypes.as_dtype(dtype)
    with name_scope(name or "random_normal"):
        m, s = convert_to_tensor(mean, dtype=dt), convert_to_tensor(stddev, dtype=dt)
        return add(multiply(_random_op("RandomStandardNormal", shape, dt, seed, None), s), m)


def truncated_normal(
    shape: Any,
    mean: Any = 0.0,
    stddev: Any = 1.0,
    dtype: Any = dtypes.float32,
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """Normal values redrawn beyond two standard deviations: ``TruncatedNormal * stddev + mean``."""
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops.math_ops import add, multiply

    dt = dtypes.as_dtype(dtype)
    with name_scope(name or "truncated_normal"):
        m, s = convert_to_tensor(mean, dtype=dt), convert_to_tensor(stddev, dtype=dt)
        return add(multiply(_random_op("TruncatedNormal", shape, dt, seed, None), s), m)
