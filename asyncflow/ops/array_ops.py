"""Array ops: constants, placeholders, identity, grouping, and shape manipulation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import (
    Operation,
    Tensor,
    convert_to_tensor,
    get_default_graph,
    make_constant_value,
)
from asyncflow.framework.shapes import TensorShape, as_shape, shape_of_value, unknown_shape
from asyncflow.ops._base import const_value, define_op, inline_kernel, make_op, unary_shape
from asyncflow.ops._base import static_value as _static_value

__all__ = [
    "concat",
    "constant",
    "expand_dims",
    "fill",
    "gather",
    "group",
    "identity",
    "identity_n",
    "no_op",
    "ones",
    "placeholder",
    "placeholder_with_default",
    "rank",
    "reshape",
    "shape",
    "size",
    "squeeze",
    "stack",
    "transpose",
    "zeros",
]


# -- Const ----------------------------------------------------------------------


def _const_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    value = attrs["value"]
    return [(attrs["dtype"], shape_of_value(value.shape))]


define_op("Const", _const_shape)


@registry.register_kernel_factory("Const")
def _const_kernel(op: Operation) -> tuple[Any, int]:
    value = _const_output(op._attrs["value"])
    return (lambda: value), registry.INLINE


def _const_output(value: np.ndarray) -> Any:
    # 0-d constants are numpy scalars, like every 0-d value inside a step.
    return value[()] if value.ndim == 0 else value


def constant(
    value: Any, dtype: Any = None, shape: Any = None, name: str | None = "Const"
) -> Tensor:
    """A constant tensor: ``value`` converted to ``dtype``, broadcast or reshaped to ``shape``.

    As TensorFlow: a scalar ``value`` fills ``shape``; a value with as many elements
    as ``shape`` is reshaped to it; anything else is a ``TypeError``/``ValueError``.
    """
    target = dtypes.as_dtype(dtype) if dtype is not None else None
    what = f"af.constant {name or 'Const'!r}"
    if isinstance(value, Tensor):
        raise TypeError(f"{what} needs a constant value, got Tensor {value.name!r}")
    try:
        array = make_constant_value(value, target)
    except ValueError as exc:  # e.g. a ragged nested list
        raise ValueError(f"{what}: {exc}") from None
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    if shape is not None:
        static = as_shape(shape)
        if not static.is_fully_defined():
            raise ValueError(f"{what}: shape must be fully defined, got {shape!r}")
        dims = tuple(int(d or 0) for d in static)
        if array.size == 1:
            array = np.broadcast_to(array.reshape(()), dims).copy()
        elif array.size == int(np.prod(dims, dtype=np.int64)):
            array = array.reshape(dims).copy()
        else:
            # ValueError as TF ("Too many elements provided ...").
            raise ValueError(
                f"{what}: value with {array.size} elements cannot fill shape {list(dims)}"
            )
        array.flags.writeable = False
    dt = dtypes.as_dtype(array.dtype) if target is None else target
    return make_op(
        "Const", (), {"value": array, "dtype": dt}, name=name, default_name="Const"
    ).outputs[0]


# -- Placeholder ----------------------------------------------------------------


def _placeholder_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    return [(attrs["dtype"], attrs["shape"])]


define_op("Placeholder", _placeholder_shape)


def _shape_for_message(shape: TensorShape) -> str:
    if shape.dims is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.dims) + "]"


@registry.register_kernel_factory("Placeholder")
def _placeholder_kernel(op: Operation) -> tuple[Any, int]:
    message = (
        f"You must feed a value for placeholder tensor {op.name!r} with dtype "
        f"{op._attrs['dtype'].name} and shape {_shape_for_message(op._attrs['shape'])}"
    )

    def unfed() -> None:
        raise errors.InvalidArgumentError(None, op, message)

    return unfed, registry.INLINE


def placeholder(dtype: Any, shape: Any = None, name: str | None = None) -> Tensor:
    """A tensor that must be fed at run time (``InvalidArgumentError`` naming it if not)."""
    return make_op(
        "Placeholder",
        (),
        {"dtype": dtypes.as_dtype(dtype), "shape": as_shape(shape)},
        name=name,
        default_name="Placeholder",
    ).outputs[0]


def _placeholder_with_default_shape(
    inputs: Sequence[Tensor], attrs: Mapping[str, Any]
) -> list[tuple[Any, Any]]:
    (x,) = inputs
    shape = attrs["shape"]
    if not shape.is_compatible_with(x.shape):
        raise ValueError(f"default value of shape {x.shape} is not compatible with shape {shape}")
    return [(x.dtype, shape)]


define_op("PlaceholderWithDefault", _placeholder_with_default_shape)
inline_kernel("PlaceholderWithDefault", lambda x: x)


def placeholder_with_default(input: Any, shape: Any, name: str | None = None) -> Tensor:
    """A placeholder that yields ``input`` when not fed."""
    x = convert_to_tensor(input)
    return make_op(
        "PlaceholderWithDefault",
        (x,),
        {"shape": as_shape(shape)},
        name=name,
        default_name="PlaceholderWithDefault",
    ).outputs[0]


# -- Identity, NoOp, group --------------------------------------------------------

define_op("Identity", unary_shape)
inline_kernel("Identity", lambda x: x)


def identity(input: Any, name: str | None = None) -> Tensor:
    """The same value, as a new tensor (useful as a named fetch or a device hop)."""
    x = convert_to_tensor(input)
    return make_op("Identity", (x,), name=name, default_name="Identity").outputs[0]


# Several values passed through as they are: what an inlined function call with
# several outputs becomes (compiler/inline.py), as in TensorFlow.
define_op("IdentityN", lambda inputs, attrs: [(t.dtype, t.shape) for t in inputs])
inline_kernel("IdentityN", lambda *xs: xs)


def identity_n(input: Sequence[Any], name: str | None = None) -> list[Tensor]:
    """The same values, as new tensors of one op (op ``IdentityN``; Keras's swish
    returns through one to attach its gradient)."""
    tensors = [convert_to_tensor(x) for x in input]
    if not tensors:
        raise ValueError("identity_n needs at least one tensor")
    return list(make_op("IdentityN", tensors, name=name, default_name="IdentityN").outputs)


define_op("NoOp", lambda inputs, attrs: [])
inline_kernel("NoOp", lambda: None)


def no_op(name: str | None = None) -> Operation:
    """An op that does nothing; a target for control dependencies."""
    return make_op("NoOp", (), name=name, default_name="NoOp")


def group(*inputs: Any, name: str | None = None) -> Operation:
    """A NoOp that runs after every op (or tensor's op) in ``inputs``."""
    flat: list[Any] = []
    for x in inputs:
        if isinstance(x, list | tuple | set):
            flat.extend(x)
        else:
            flat.append(x)
    graph = get_default_graph()
    with graph.control_dependencies(flat):
        return no_op(name=name or "group_deps")


# -- shape-manipulation helpers ----------------------------------------------------

Specs = list[tuple[dtypes.DType, Any]]


def _int_list(value: Any, what: str) -> list[int]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    items = value if isinstance(value, list | tuple) else [value]
    out: list[int] = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{what} must be an int or a list of ints, got {value!r}")
        out.append(int(v))
    return out


def _axis_value(axis: Any, op_type: str, name: str | None, what: str = "axis") -> int:
    """A Python int from an int, a numpy integer or a scalar tensor known at build time."""
    value = _static_value(axis, what, op_type, name)
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TypeError(
                f"cannot build {op_type} {name or op_type!r}: {what} must be a "
                f"scalar, got shape {list(value.shape)}"
            )
        value = value[()]
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{what} must be a single int, got {axis!r}")
    return int(value)


def _check_axis(axis: int, rank: int, t: Tensor) -> int:
    if not -rank <= axis < rank:
        raise ValueError(
            f"axis {axis} is out of range [{-rank}, {rank}) for "
            f"input {t.name!r} of shape {t._shape}"
        )
    return axis % rank


def _known_shape_input(t: Tensor) -> TensorShape:
    """The static value of a 1-D shape tensor: its Const value, else unknown dims."""
    value = const_value(t)
    if value is not None:
        return TensorShape(value.tolist())
    if t._shape.rank == 1 and t._shape[0] is not None:
        return unknown_shape(t._shape[0])
    return unknown_shape()


# -- Reshape ---------------------------------------------------------------------------


def _reshape_target(x: Tensor, target: list[int] | None) -> TensorShape:
    if target is None:
        return unknown_shape()
    if sum(1 for d in target if d == -1) > 1:
        raise ValueError(f"can only infer one dimension (-1) of shape {target}")
    if any(d < -1 for d in target):
        raise ValueError(f"invalid dimension in shape {target}")
    known = 1
    for d in target:
        if d != -1:
            known *= d
    total = x._shape.num_elements()
    if -1 not in target:
        if total is not None and total != known:
            raise ValueError(
                f"Cannot reshape a tensor with {total} elements to shape "
                f"{target} ({known} elements)"
            )
        return TensorShape(target)
    if total is None:
        return TensorShape([None if d == -1 else d for d in target])
    if known == 0 or total % known:
        raise ValueError(f"Cannot reshape a tensor with {total} elements to shape {target}")
    return TensorShape([total // known if d == -1 else d for d in target])


def _reshape_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x = inputs[0]
    if len(inputs) == 1:
        return [(x._dtype, _reshape_target(x, attrs["shape"]))]
    shape_t = inputs[1]
    if not shape_t._dtype.is_integer:
        raise TypeError(f"shape must be an int32 or int64 tensor, got {shape_t._dtype.name}")
    value = const_value(shape_t)
    if value is not None:
        return [(x._dtype, _reshape_target(x, value.tolist()))]
    return [(x._dtype, _known_shape_input(shape_t))]


define_op("Reshape", _reshape_shape)


@registry.register_kernel_factory("Reshape")
def _reshape_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    if len(op._inputs) == 2:
        return np.reshape, registry.INLINE
    return functools.partial(np.reshape, shape=tuple(op._attrs["shape"])), registry.INLINE


def reshape(tensor: Any, shape: Any, name: str | None = None) -> Tensor:
    """``tensor`` with the same elements in a new shape (op ``Reshape``).

    ``shape`` is a list of ints (one may be ``-1``, inferred) or an int tensor.  A known
    element count that does not fit is a ``ValueError`` at build time.
    """
    x = convert_to_tensor(tensor)
    if isinstance(shape, Tensor) or hasattr(shape, "_as_graph_element"):
        inputs: tuple[Tensor, ...] = (x, convert_to_tensor(shape))
        attrs: dict[str, Any] = {}
    else:
        if isinstance(shape, TensorShape):
            shape = shape.as_list()
        inputs, attrs = (x,), {"shape": _int_list(shape, "shape")}
    return make_op("Reshape", inputs, attrs, name=name, default_name="Reshape").outputs[0]


# -- Transpose ---------------------------------------------------------------------------


def _transpose_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    perm = attrs["perm"]
    rank = x._shape.rank
    if perm is None:
        return [
            (x._dtype, unknown_shape() if rank is None else TensorShape(x._shape.as_list()[::-1]))
        ]
    if rank is not None and sorted(perm) != list(range(rank)):
        raise ValueError(
            f"perm {perm} is not a permutation of the dimensions of input {x.name!r} of rank {rank}"
        )
    if rank is None:
        if sorted(perm) != list(range(len(perm))):
            raise ValueError(f"perm {perm} is not a permutation")
        return [(x._dtype, unknown_shape(len(perm)))]
    dims = x._shape.as_list()
    return [(x._dtype, TensorShape([dims[p] for p in perm]))]


define_op("Transpose", _transpose_shape)


@registry.register_kernel_factory("Transpose")
def _transpose_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    perm = op._attrs["perm"]
    axes = None if perm is None else tuple(perm)
    return functools.partial(np.transpose, axes=axes), registry.INLINE


def transpose(
    a: Any, perm: Any = None, name: str | None = "transpose", conjugate: bool = False
) -> Tensor:
    """``a`` with dimensions permuted by ``perm`` (default: reversed), op ``Transpose``."""
    if conjugate:
        raise NotImplementedError("transpose(conjugate=True) is not supported")
    x = convert_to_tensor(a)
    attrs = {
        "perm": None
        if perm is None
        else _int_list(_static_value(perm, "perm", "Transpose", name), "perm")
    }
    return make_op("Transpose", (x,), attrs, name=name, default_name="transpose").outputs[0]


# -- ConcatV2, Pack (concat, stack) ------------------------------------------------------


def _same_dtype(inputs: Sequence[Tensor]) -> dtypes.DType:
    first = inputs[0]
    for t in inputs[1:]:
        if t._dtype is not first._dtype:
            raise TypeError(
                f"inputs must have the same dtype, got {first._dtype.name} "
                f"({first.name}) and {t._dtype.name} ({t.name})"
            )
    return first._dtype


def _concat_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    dt = _same_dtype(inputs)
    axis = attrs["axis"]
    ranks = {t._shape.rank for t in inputs if t._shape.rank is not None}
    if len(ranks) > 1:
        raise ValueError(f"inputs of concat must have the same rank, got ranks {sorted(ranks)}")
    if not ranks:
        return [(dt, unknown_shape())]
    (rank,) = ranks
    if rank == 0:
        raise ValueError("cannot concatenate scalars (rank 0); use stack")
    axis = _check_axis(axis, rank, inputs[0])
    merged: list[int | None] = [None] * rank
    total: int | None = 0
    for t in inputs:
        if t._shape.rank is None:
            total = None
            continue
        dims = t._shape.as_list()
        others = TensorShape([*dims[:axis], None, *dims[axis + 1 :]])
        try:
            merged = TensorShape(merged).merge_with(others).as_list()
        except ValueError:
            raise ValueError(
                f"dimensions of inputs of concat must match except on axis "
                f"{axis}, got {t._shape} ({t.name})"
            ) from None
        size = dims[axis]
        total = None if total is None or size is None else total + size
    merged[axis] = total
    return [(dt, TensorShape(merged))]


define_op("ConcatV2", _concat_shape)


@registry.register_kernel_factory("ConcatV2")
def _concat_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axis = op._attrs["axis"]

    def concat_kernel(*values: Any) -> Any:
        return np.concatenate(values, axis=axis)

    return concat_kernel, registry.INLINE


def concat(values: Any, axis: Any, name: str | None = "concat") -> Tensor:
    """The tensors of ``values`` joined along ``axis`` (op ``ConcatV2``).

    As TensorFlow, a single value gives an ``Identity`` of it.
    """
    tensors = [convert_to_tensor(v) for v in _as_list(values, "concat")]
    a = _axis_value(axis, "ConcatV2", name)
    if len(tensors) == 1:
        # TF checks the axis against the rank even for one input.
        rank = tensors[0]._shape.rank
        if rank is not None:
            _check_axis(a, rank, tensors[0])
        return identity(tensors[0], name=name)
    return make_op("ConcatV2", tensors, {"axis": a}, name=name, default_name="concat").outputs[0]


def _as_list(values: Any, what: str) -> list[Any]:
    if isinstance(values, Tensor) or not isinstance(values, list | tuple) or not values:
        raise TypeError(f"{what} expects a non-empty list of tensors, got {values!r}")
    return list(values)


def _pack_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    dt = _same_dtype(inputs)
    shape = unknown_shape()
    for t in inputs:
        try:
            shape = shape.merge_with(t._shape)
        except ValueError:
            raise ValueError(
                f"shapes of all inputs of stack must match, got {shape} and {t._shape} ({t.name})"
            ) from None
    axis = attrs["axis"]
    if shape.rank is None:
        return [(dt, unknown_shape())]
    rank = shape.rank + 1
    if not -rank <= axis < rank:
        raise ValueError(
            f"axis {axis} is out of range [{-rank}, {rank}) for stack of inputs of shape {shape}"
        )
    dims = shape.as_list()
    dims.insert(axis % rank, len(inputs))
    return [(dt, TensorShape(dims))]


define_op("Pack", _pack_shape)


@registry.register_kernel_factory("Pack")
def _pack_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axis = op._attrs["axis"]

    def pack_kernel(*values: Any) -> Any:
        return np.stack(values, axis=axis)

    return pack_kernel, registry.INLINE


def stack(values: Any, axis: Any = 0, name: str | None = "stack") -> Tensor:
    """The tensors of ``values`` (same shape) stacked along a new ``axis`` (op ``Pack``)."""
    tensors = [convert_to_tensor(v) for v in _as_list(values, "stack")]
    return make_op(
        "Pack", tensors, {"axis": _axis_value(axis, "Pack", name)}, name=name, default_name="stack"
    ).outputs[0]


# -- GatherV2 ------------------------------------------------------------------------


def _gather_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    params, indices = inputs
    if indices._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(
            f"indices must be int32 or int64, got {indices._dtype.name} ({indices.name})"
        )
    rank = params._shape.rank
    if rank is None or indices._shape.rank is None:
        return [(params._dtype, unknown_shape())]
    if rank == 0:
        raise ValueError(f"params {params.name!r} must be at least rank 1")
    axis = _check_axis(attrs["axis"], rank, params)
    dims = params._shape.as_list()
    return [(params._dtype, TensorShape(dims[:axis] + indices._shape.as_list() + dims[axis + 1 :]))]


define_op("GatherV2", _gather_shape)


@registry.register_kernel_factory("GatherV2")
def _gather_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axis = op._attrs["axis"]

    def gather_kernel(params: Any, indices: Any) -> Any:
        # np.take would wrap negative indices; TF rejects them like any other bad index.
        limit = params.shape[axis]
        if indices.size and (indices.min() < 0 or indices.max() >= limit):
            bad = np.argwhere((indices < 0) | (indices >= limit))[0]
            raise errors.InvalidArgumentError(
                None,
                None,
                f"indices[{','.join(map(str, bad))}] = "
                f"{indices[tuple(bad)]} is not in [0, {limit})",
            )
        return np.take(params, indices, axis=axis)

    return gather_kernel, registry.INLINE


def gather(
    params: Any,
    indices: Any,
    validate_indices: Any = None,
    name: str | None = None,
    axis: Any = None,
) -> Tensor:
    """The slices of ``params`` at ``indices`` along ``axis`` (default 0), op ``GatherV2``."""
    p = convert_to_tensor(params)
    i = convert_to_tensor(indices)
    attrs = {"axis": 0 if axis is None else _axis_value(axis, "GatherV2", name)}
    return make_op("GatherV2", (p, i), attrs, name=name, default_name="GatherV2").outputs[0]


# -- ExpandDims, Squeeze -----------------------------------------------------------------


def _expand_dims_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    rank = x._shape.rank
    if rank is None:
        return [(x._dtype, unknown_shape())]
    axis = attrs["axis"]
    if not -rank - 1 <= axis <= rank:
        raise ValueError(
            f"axis {axis} is out of range [{-rank - 1}, {rank}] for input {x.name!r} of rank {rank}"
        )
    dims = x._shape.as_list()
    dims.insert(axis % (rank + 1), 1)
    return [(x._dtype, TensorShape(dims))]


define_op("ExpandDims", _expand_dims_shape)
inline_kernel("ExpandDims", np.expand_dims, attrs=("axis",))


def expand_dims(input: Any, axis: Any = None, name: str | None = None, dim: Any = None) -> Tensor:
    """``input`` with a new dimension of length 1 at ``axis`` (op ``ExpandDims``)."""
    if dim is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'dim'")
        axis = dim
    if axis is None:
        raise ValueError("expand_dims requires an axis")
    x = convert_to_tensor(input)
    return make_op(
        "ExpandDims",
        (x,),
        {"axis": _axis_value(axis, "ExpandDims", name)},
        name=name,
        default_name="ExpandDims",
    ).outputs[0]


def _squeeze_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    axes = attrs["squeeze_dims"]
    rank = x._shape.rank
    if rank is None:
        return [(x._dtype, unknown_shape())]
    dims = x._shape.as_list()
    if not axes:
        if None in dims:
            return [(x._dtype, unknown_shape())]
        return [(x._dtype, TensorShape([d for d in dims if d != 1]))]
    drop = {_check_axis(a, rank, x) for a in axes}
    for a in drop:
        if dims[a] not in (1, None):
            raise ValueError(
                f"cannot squeeze dimension {a} of size {dims[a]} of input "
                f"{x.name!r} with shape {x._shape}"
            )
    return [(x._dtype, TensorShape([d for i, d in enumerate(dims) if i not in drop]))]


define_op("Squeeze", _squeeze_shape)


@registry.register_kernel_factory("Squeeze")
def _squeeze_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axes = op._attrs["squeeze_dims"]
    return functools.partial(np.squeeze, axis=tuple(axes) if axes else None), registry.INLINE


def squeeze(
    input: Any, axis: Any = None, name: str | None = None, squeeze_dims: Any = None
) -> Tensor:
    """``input`` without its length-1 dimensions (only those in ``axis`` when given)."""
    if squeeze_dims is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'squeeze_dims'")
        axis = squeeze_dims
    x = convert_to_tensor(input)
    attrs = {
        "squeeze_dims": []
        if axis is None
        else _int_list(_static_value(axis, "axis", "Squeeze", name), "axis")
    }
    return make_op("Squeeze", (x,), attrs, name=name, default_name="Squeeze").outputs[0]


# -- Shape, Size, Rank -------------------------------------------------------------------


def _int_out_type(out_type: Any) -> dtypes.DType:
    dt = dtypes.as_dtype(out_type)
    if dt not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"out_type must be int32 or int64, got {dt.name}")
    return dt


define_op(
    "Shape", lambda inputs, attrs: [(attrs["out_type"], TensorShape([inputs[0]._shape.rank]))]
)


@registry.register_kernel_factory("Shape")
def _shape_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    dt = op._attrs["out_type"].np

    def shape_kernel(x: Any) -> np.ndarray:
        return np.array(np.shape(x), dtype=dt)

    return shape_kernel, registry.INLINE


def shape(input: Any, name: str | None = None, out_type: Any = dtypes.int32) -> Tensor:
    """The shape of ``input`` as a 1-D int tensor (op ``Shape``)."""
    x = convert_to_tensor(input)
    return make_op(
        "Shape", (x,), {"out_type": _int_out_type(out_type)}, name=name, default_name="Shape"
    ).outputs[0]


define_op("Size", lambda inputs, attrs: [(attrs["out_type"], TensorShape(()))])


@registry.register_kernel_factory("Size")
def _size_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    scalar = op._attrs["out_type"].as_numpy_dtype

    def size_kernel(x: Any) -> Any:
        return scalar(np.size(x))

    return size_kernel, registry.INLINE


def size(input: Any, name: str | None = None, out_type: Any = dtypes.int32) -> Tensor:
    """The number of elements of ``input`` as a scalar int tensor (op ``Size``)."""
    x = convert_to_tensor(input)
    return make_op(
        "Size", (x,), {"out_type": _int_out_type(out_type)}, name=name, default_name="Size"
    ).outputs[0]


define_op("Rank", lambda inputs, attrs: [(dtypes.int32, TensorShape(()))])


def _rank_kernel(x: Any) -> np.int32:
    return np.int32(np.ndim(x))


inline_kernel("Rank", _rank_kernel)


def rank(input: Any, name: str | None = None) -> Tensor:
    """The number of dimensions of ``input`` as a scalar int32 tensor (op ``Rank``)."""
    x = convert_to_tensor(input)
    return make_op("Rank", (x,), name=name, default_name="Rank").outputs[0]


# -- Fill, zeros, ones -------------------------------------------------------------------


def _fill_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    dims, value = inputs
    if dims._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"dims must be int32 or int64, got {dims._dtype.name}")
    if dims._shape.rank not in (1, None):
        raise ValueError(f"dims must be a vector, got shape {dims._shape}")
    if value._shape.rank not in (0, None):
        raise ValueError(f"value must be a scalar, got shape {value._shape}")
    return [(value._dtype, _known_shape_input(dims))]


define_op("Fill", _fill_shape)


@registry.register_kernel_factory("Fill")
def _fill_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    dt = op._outputs[0]._dtype.np

    def fill_kernel(dims: Any, value: Any) -> np.ndarray:
        if np.any(np.asarray(dims) < 0):
            raise ValueError(f"dims must be non-negative, got {dims}")
        return np.full(tuple(np.asarray(dims).tolist()), value, dtype=dt)

    return fill_kernel, registry.INLINE


def _dims_tensor(shape: Any) -> Tensor:
    if isinstance(shape, Tensor) or hasattr(shape, "_as_graph_element"):
        return convert_to_tensor(shape)
    if isinstance(shape, TensorShape):
        if not shape.is_fully_defined():
            raise ValueError(f"shape must be fully defined, got {shape}")
        shape = shape.as_list()
    return constant(_int_list(shape, "shape"), dtype=dtypes.int32, name="shape")


def fill(dims: Any, value: Any, name: str | None = None) -> Tensor:
    """A tensor of shape ``dims`` filled with the scalar ``value`` (op ``Fill``)."""
    d = _dims_tensor(dims)
    v = convert_to_tensor(value)
    return make_op("Fill", (d, v), name=name, default_name="Fill").outputs[0]


# Up to this many elements zeros/ones become a Const, as TensorFlow's _constant_if_small.
_SMALL_CONSTANT = 1000


def _filled(shape: Any, dtype: Any, scalar: int, name: str | None, default_name: str) -> Tensor:
    dt = dtypes.as_dtype(dtype)
    value = np.zeros((), dt.np) if scalar == 0 else np.ones((), dt.np)
    if not isinstance(shape, Tensor) and not hasattr(shape, "_as_graph_element"):
        if not isinstance(shape, TensorShape) and isinstance(shape, list | tuple):
            shape = TensorShape(shape)
        if isinstance(shape, TensorShape):
            if not shape.is_fully_defined():
                raise ValueError(f"shape must be fully defined, got {shape}")
            shape = shape.as_list()
        dims = _int_list(shape, "shape")
        if any(d < 0 for d in dims):
            raise ValueError(f"shape must be non-negative, got {dims}")
        if int(np.prod(dims, dtype=np.int64)) < _SMALL_CONSTANT:
            return constant(value, dtype=dt, shape=dims, name=name or default_name)
        shape = constant(dims, dtype=dtypes.int32, name="shape")
    return fill(shape, constant(value, dtype=dt, name="Const"), name=name or default_name)


def zeros(shape: Any, dtype: Any = dtypes.float32, name: str | None = None) -> Tensor:
    """A tensor of ``shape`` (a list of ints or an int tensor) filled with zeros."""
    return _filled(shape, dtype, 0, name, "zeros")


def ones(shape: Any, dtype: Any = dtypes.float32, name: str | None = None) -> Tensor:
    """A tensor of ``shape`` (a list of ints or an int tensor) filled with ones."""
    return _filled(shape, dtype, 1, name, "ones")
