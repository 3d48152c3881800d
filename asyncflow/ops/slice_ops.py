"""Slicing ops: Slice, StridedSlice (and ``Tensor.__getitem__``), Split, Unpack, ReverseV2,
GatherNd and ``boolean_mask``.

StridedSlice has TensorFlow's exact form: ``(input, begin, end, strides)`` plus the five
bit masks (``begin_mask``, ``end_mask``, ``ellipsis_mask``, ``new_axis_mask``,
``shrink_axis_mask``), so TF graphs import and export unchanged.  The kernel turns the
spec into a numpy basic-indexing key, whose clamping and negative-stride rules are
TensorFlow's; when begin/end/strides are constants the key is built once per plan.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import graph as graph_module
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, unknown_shape
from asyncflow.ops._base import const_value, define_op, make_op, static_value
from asyncflow.ops.array_ops import (
    _axis_value,
    _check_axis,
    constant,
    reshape,
    squeeze,
    stack,
)

__all__ = ["boolean_mask", "gather_nd", "reverse", "slice", "split", "strided_slice", "unstack"]

Specs = list[tuple[dtypes.DType, Any]]
_INDEX = (dtypes.int32, dtypes.int64)


def _check_index(t: Tensor, what: str) -> None:
    if t._dtype not in _INDEX:
        raise TypeError(f"{what} {t.name!r} has dtype {t._dtype.name}, expected int32 or int64")


def _vector_value(t: Tensor) -> list[int] | None:
    value = const_value(t)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


# -- Slice ---------------------------------------------------------------------------------


def _slice_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, begin, size = inputs
    _check_index(begin, "begin")
    _check_index(size, "size")
    b, s = _vector_value(begin), _vector_value(size)
    rank = x._shape.rank
    n = len(b) if b is not None else (begin._shape[0] if begin._shape.rank == 1 else None)
    if rank is not None and n is not None and n != rank:
        raise ValueError(
            f"begin and size must have {rank} elements for input {x.name!r} of rank {rank}, got {n}"
        )
    if s is None:
        return [(x._dtype, unknown_shape(rank if rank is not None else n))]
    dims = x._shape.as_list() if rank is not None else [None] * len(s)
    out: list[int | None] = []
    for i, (d, sz) in enumerate(zip(dims, s)):
        start = b[i] if b is not None else None
        if sz == -1:
            out.append(None if d is None or start is None else d - start)
        else:
            if d is not None and start is not None and not 0 <= start <= start + sz <= d:
                raise ValueError(
                    f"slice [{start}, {start + sz}) is out of range for "
                    f"dimension {i} of size {d} of input {x.name!r}"
                )
            out.append(sz)
    return [(x._dtype, TensorShape(out))]


define_op("Slice", _slice_shape)


def _slice_kernel(x: Any, begin: Any, size: Any) -> Any:
    key = []
    for i, (b, s) in enumerate(zip(np.asarray(begin).tolist(), np.asarray(size).tolist())):
        end = x.shape[i] if s == -1 else b + s
        if not 0 <= b <= end <= x.shape[i]:
            raise ValueError(
                f"Expected begin {b} and size {s} to fit dimension {i} of size {x.shape[i]}"
            )
        key.append(builtins.slice(b, end))
    return x[tuple(key)]


registry.register_kernel_factory("Slice")(lambda op: (_slice_kernel, registry.INLINE))


def slice(input_: Any, begin: Any, size: Any, name: str | None = None) -> Tensor:
    """``size[i]`` elements from ``begin[i]`` on each dimension (``-1``: to the end), op ``Slice``."""
    x = convert_to_tensor(input_)
    b = convert_to_tensor(begin, dtype=None if isinstance(begin, Tensor) else dtypes.int32)
    s = convert_to_tensor(size, dtype=None if isinstance(size, Tensor) else dtypes.int32)
    return make_op("Slice", (x, b, s), name=name, default_name="Slice").outputs[0]


# -- StridedSlice --------------------------------------------------------------------------

_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def _kinds(n: int, attrs: Mapping[str, Any]) -> list[str]:
    out = []
    for i in builtins.range(n):
        bit = 1 << i
        if attrs["ellipsis_mask"] & bit:
            out.append("ellipsis")
        elif attrs["new_axis_mask"] & bit:
            out.append("newaxis")
        elif attrs["shrink_axis_mask"] & bit:
            out.append("index")
        else:
            out.append("slice")
    return out


def _strided_slice_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, begin, end, strides = inputs
    for t, what in ((begin, "begin"), (end, "end"), (strides, "strides")):
        _check_index(t, what)
    for m in _MASKS:
        if not isinstance(attrs.get(m, 0), int):
            raise TypeError(f"{m} must be an int, got {attrs.get(m)!r}")
    if begin._shape.rank != 1 or begin._shape[0] is None:
        return [(x._dtype, unknown_shape())]
    n = begin._shape[0]
    kinds = _kinds(n, attrs)
    if kinds.count("ellipsis") > 1:
        raise ValueError("an index can only have a single ellipsis ('...')")
    b, e, s = _vector_value(begin), _vector_value(end), _vector_value(strides)
    if s is not None and 0 in s:
        raise ValueError(f"strides must be non-zero, got {s}")
    rank = x._shape.rank
    if rank is None:
        return [(x._dtype, unknown_shape())]
    consumed = sum(1 for k in kinds if k in ("index", "slice"))
    if consumed > rank:
        raise ValueError(f"too many indices for tensor {x.name!r} of rank {rank}: {consumed}")
    if "ellipsis" not in kinds:
        kinds = [*kinds, "ellipsis"]
    return [(x._dtype, TensorShape(_strided_dims(x, kinds, consumed, (b, e, s), attrs)))]


def _strided_dims(
    x: Tensor,
    kinds: list[str],
    consumed: int,
    bounds: tuple[Sequence[int] | None, Sequence[int] | None, Sequence[int] | None],
    attrs: Mapping[str, Any],
) -> list[int | None]:
    """The static dims of ``x[kinds...]`` (``x`` of known rank; ``bounds`` are the
    constant begin / end / strides, None where not known before a run)."""
    b, e, s = bounds
    rank = len(x._shape.as_list())
    dims = iter(x._shape.as_list())
    out: list[int | None] = []
    for i, kind in enumerate(kinds):
        if kind == "newaxis":
            out.append(1)
        elif kind == "ellipsis":
            out.extend(next(dims) for _ in builtins.range(rank - consumed))
        elif kind == "index":
            d = next(dims)
            if b is not None and d is not None and not -d <= b[i] < d:
                raise ValueError(
                    f"index {b[i]} is out of bounds for dimension of size {d} of tensor {x.name!r}"
                )
        else:
            d = next(dims)
            if d is None or b is None or e is None or s is None:
                out.append(None)
                continue
            out.append(len(builtins.range(d)[_slice_of(i, b, e, s, attrs)]))
    return out


def _slice_of(
    i: int, b: Sequence[int], e: Sequence[int], s: Sequence[int], attrs: Mapping[str, Any]
) -> builtins.slice:
    bit = 1 << i
    start = None if attrs["begin_mask"] & bit else b[i]
    stop = None if attrs["end_mask"] & bit else e[i]
    return builtins.slice(start, stop, s[i])


define_op("StridedSlice", _strided_slice_shape)


def _strided_key(
    attrs: Mapping[str, Any], b: Sequence[int], e: Sequence[int], s: Sequence[int]
) -> tuple[Any, ...]:
    key: list[Any] = []
    for i, kind in enumerate(_kinds(len(b), attrs)):
        if kind == "ellipsis":
            key.append(Ellipsis)
        elif kind == "newaxis":
            key.append(None)
        elif kind == "index":
            key.append(b[i])
        else:
            if s[i] == 0:
                raise ValueError("strided_slice: strides must be non-zero")
            key.append(_slice_of(i, b, e, s, attrs))
    return tuple(key)


def _apply_key(x: Any, key: tuple[Any, ...]) -> Any:
    try:
        return x[key]
    except IndexError as exc:
        raise ValueError(f"slice out of range: {exc}") from None


@registry.register_kernel_factory("StridedSlice")
def _strided_slice_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    attrs = op._attrs
    consts = [_vector_value(t) for t in op._inputs[1:]]
    if all(c is not None for c in consts):
        b, e, s = consts
        assert b is not None
        assert e is not None
        assert s is not None
        key = _strided_key(attrs, b, e, s)
        return (lambda x, *_: _apply_key(x, key)), registry.INLINE

    def strided_slice_kernel(x: Any, begin: Any, end: Any, strides: Any) -> Any:
        key = _strided_key(
            attrs,
            np.asarray(begin).tolist(),
            np.asarray(end).tolist(),
            np.asarray(strides).tolist(),
        )
        return _apply_key(x, key)

    return strided_slice_kernel, registry.INLINE


def strided_slice(
    input_: Any,
    begin: Any,
    end: Any,
    strides: Any = None,
    begin_mask: int = 0,
    end_mask: int = 0,
    ellipsis_mask: int = 0,
    new_axis_mask: int = 0,
    shrink_axis_mask: int = 0,
    name: str | None = None,
) -> Tensor:
    """TF's ``strided_slice``: ``input_[begin:end:strides]`` per dimension, with the masks.

    Bit ``i`` of ``begin_mask``/``end_mask`` ignores ``begin[i]``/``end[i]``; of
    ``ellipsis_mask`` makes item ``i`` a ``...``; of ``new_axis_mask`` a new axis; of
    ``shrink_axis_mask`` an index (the dimension is removed).  ``x[...]`` builds this op.
    """
    x = convert_to_tensor(input_)
    b = _index_vector(begin)
    e = _index_vector(end)
    s = _index_vector(strides if strides is not None else [1] * (b.shape[0] or 0))
    attrs = {
        "begin_mask": int(begin_mask),
        "end_mask": int(end_mask),
        "ellipsis_mask": int(ellipsis_mask),
        "new_axis_mask": int(new_axis_mask),
        "shrink_axis_mask": int(shrink_axis_mask),
    }
    return make_op(
        "StridedSlice", (x, b, e, s), attrs, name=name, default_name="strided_slice"
    ).outputs[0]


def _index_vector(value: Any) -> Tensor:
    if isinstance(value, Tensor) or hasattr(value, "_as_graph_element"):
        return convert_to_tensor(value)
    return constant(np.asarray(value, dtype=np.int32).reshape(-1), dtype=dtypes.int32)


def _bound(v: Any) -> Any:
    """An int, or a scalar int tensor, from one index item; ``TypeError`` otherwise."""
    if isinstance(v, Tensor) or hasattr(v, "_as_graph_element"):
        t = convert_to_tensor(v)
        if not t.dtype.is_integer or t.shape.rank not in (0, None):
            raise TypeError(f"a tensor index must be a scalar integer tensor, got {t!r}")
        return t
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise TypeError(
            f"only integers, slices (`:`), ellipsis (`...`), af.newaxis "
            f"(`None`) and scalar int tensors are valid indices, got {v!r}"
        )
    return int(v)


def _getitem(tensor: Tensor, key: Any) -> Tensor:
    """``tensor[key]`` as one StridedSlice (TF's ``_slice_helper``)."""
    items = key if isinstance(key, tuple) else (key,)
    begin: list[Any] = []
    end: list[Any] = []
    strides: list[Any] = []
    masks = dict.fromkeys(_MASKS, 0)
    for i, item in enumerate(items):
        bit = 1 << i
        if item is None or item is Ellipsis:
            begin.append(0)
            end.append(0)
            strides.append(1)
            masks["new_axis_mask" if item is None else "ellipsis_mask"] |= bit
        elif isinstance(item, builtins.slice):
            step = 1 if item.step is None else _bound(item.step)
            if isinstance(step, int) and step == 0:
                raise ValueError("slice step cannot be zero")
            begin.append(0 if item.start is None else _bound(item.start))
            end.append(0 if item.stop is None else _bound(item.stop))
            strides.append(step)
            masks["begin_mask"] |= bit if item.start is None else 0
            masks["end_mask"] |= bit if item.stop is None else 0
        else:
            index = _bound(item)
            begin.append(index)
            end.append(index + 1 if isinstance(index, int) else 0)
            strides.append(1)
            masks["shrink_axis_mask"] |= bit
    if builtins.sum(1 for it in items if it is Ellipsis) > 1:
        raise ValueError("an index can only have a single ellipsis ('...')")
    with tensor.graph.as_default():
        vectors = [_packed(v) for v in (begin, end, strides)]
        return make_op(
            "StridedSlice", (tensor, *vectors), masks, default_name="strided_slice"
        ).outputs[0]


def _packed(values: list[Any]) -> Tensor:
    if not any(isinstance(v, Tensor) for v in values):
        return constant(np.asarray(values, dtype=np.int32).reshape(-1), dtype=dtypes.int32)
    from asyncflow.ops.math_ops import cast

    return stack(
        [
            cast(v, dtypes.int32) if isinstance(v, Tensor) else constant(v, dtype=dtypes.int32)
            for v in values
        ]
    )


# -- Split, SplitV, Unpack -----------------------------------------------------------------


def _split_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    axis_t, x = inputs
    num = attrs["num_split"]
    if not isinstance(num, int) or num < 1:
        raise ValueError(f"num_split must be >= 1, got {num!r}")
    axis = _vector_value(axis_t)
    rank = x._shape.rank
    if axis is None or rank is None:
        return [(x._dtype, unknown_shape(rank))] * num
    a = _check_axis(axis[0], rank, x)
    dims = x._shape.as_list()
    size = dims[a]
    if size is not None:
        if size % num:
            raise ValueError(
                f"dimension {a} of size {size} of {x.name!r} is not evenly "
                f"divisible by num_split {num}"
            )
        dims[a] = size // num
    return [(x._dtype, TensorShape(dims))] * num


define_op("Split", _split_shape)


@registry.register_kernel_factory("Split")
def _split_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    num = op._attrs["num_split"]

    def split_kernel(axis: Any, x: Any) -> list[Any]:
        a = int(axis)
        if x.shape[a] % num:
            raise ValueError(
                f"dimension {a} of size {x.shape[a]} is not evenly divisible by num_split {num}"
            )
        return _equal_parts(x, a, num)

    return split_kernel, registry.INLINE


def _equal_parts(x: Any, axis: int, num: int) -> list[Any]:
    """``np.split(x, num, axis)`` of a divisible axis, as basic-slice views: a fifth of
    ``np.split``'s cost on the small arrays an LSTM cell splits into its gates each step.
    """
    a = axis % x.ndim
    step = x.shape[a] // num
    lead = (builtins.slice(None),) * a
    return [x[(*lead, builtins.slice(k * step, (k + 1) * step))] for k in range(num)]


def _split_v_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, sizes_t, axis_t = inputs
    num = attrs["num_split"]
    sizes, axis = _vector_value(sizes_t), _vector_value(axis_t)
    rank = x._shape.rank
    if sizes is not None and len(sizes) != num:
        raise ValueError(f"size_splits has {len(sizes)} elements, num_split is {num}")
    if axis is None or rank is None:
        return [(x._dtype, unknown_shape(rank))] * num
    a = _check_axis(axis[0], rank, x)
    dims = x._shape.as_list()
    if sizes is None:
        return [(x._dtype, TensorShape([*dims[:a], None, *dims[a + 1 :]]))] * num
    if sizes.count(-1) > 1:
        raise ValueError(f"size_splits may hold at most one -1, got {sizes}")
    size = dims[a]
    if -1 in sizes and size is not None:
        sizes[sizes.index(-1)] = size - (builtins.sum(sizes) + 1)
    if -1 not in sizes and size is not None and builtins.sum(sizes) != size:
        raise ValueError(
            f"size_splits {sizes} do not add up to dimension {a} of size {dims[a]} of {x.name!r}"
        )
    return [
        (x._dtype, TensorShape([*dims[:a], None if n == -1 else n, *dims[a + 1 :]])) for n in sizes
    ]


define_op("SplitV", _split_v_shape)


def _split_v_kernel(x: Any, sizes: Any, axis: Any) -> list[Any]:
    a = int(axis)
    sz = np.asarray(sizes).tolist()
    if -1 in sz:
        sz[sz.index(-1)] = x.shape[a] - (builtins.sum(sz) + 1)
    if builtins.sum(sz) != x.shape[a] or builtins.min(sz, default=0) < 0:
        raise ValueError(f"size_splits {sz} do not add up to dimension {a} of size {x.shape[a]}")
    return np.split(x, np.cumsum(sz)[:-1], axis=a)


registry.register_kernel_factory("SplitV")(lambda op: (_split_v_kernel, registry.INLINE))


def split(
    value: Any,
    num_or_size_splits: Any,
    axis: Any = 0,
    num: int | None = None,
    name: str | None = "split",
) -> list[Tensor]:
    """``value`` cut along ``axis`` into equal parts (an int, op ``Split``) or parts of the
    given sizes (a list, one may be ``-1``; op ``SplitV``)."""
    x = convert_to_tensor(value)
    a = constant(axis, dtype=dtypes.int32) if not isinstance(axis, Tensor) else axis
    if isinstance(num_or_size_splits, Tensor) and num_or_size_splits.shape.rank == 0:
        # A scalar tensor is a count of splits (as TF, which takes its constant value).
        count = static_value(num_or_size_splits, "num_or_size_splits", "Split", name)
        num_or_size_splits = int(count)
    if isinstance(num_or_size_splits, int | np.integer):
        op = make_op(
            "Split", (a, x), {"num_split": int(num_or_size_splits)}, name=name, default_name="split"
        )
        return list(op.outputs)
    sizes = convert_to_tensor(
        num_or_size_splits, dtype=None if isinstance(num_or_size_splits, Tensor) else dtypes.int32
    )
    if num is None:
        n = sizes.shape[0] if sizes.shape.rank == 1 else None
        if n is None:
            raise ValueError(f"cannot infer the number of splits from {sizes!r}; pass num")
        num = n
    op = make_op("SplitV", (x, sizes, a), {"num_split": int(num)}, name=name, default_name="split")
    return list(op.outputs)


def _unpack_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    num, axis = attrs["num"], attrs["axis"]
    rank = x._shape.rank
    if rank is None:
        return [(x._dtype, unknown_shape())] * num
    a = _check_axis(axis, rank, x)
    dims = x._shape.as_list()
    if dims[a] is not None and dims[a] != num:
        raise ValueError(
            f"cannot unstack {num} tensors from dimension {a} of size {dims[a]} of {x.name!r}"
        )
    del dims[a]
    return [(x._dtype, TensorShape(dims))] * num


define_op("Unpack", _unpack_shape)


@registry.register_kernel_factory("Unpack")
def _unpack_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    axis, num = op._attrs["axis"], op._attrs["num"]

    def unpack_kernel(x: Any) -> list[Any]:
        if x.shape[axis] != num:
            raise ValueError(f"cannot unstack {num} tensors from dimension of size {x.shape[axis]}")
        return [np.take(x, i, axis=axis) for i in builtins.range(num)]

    return unpack_kernel, registry.INLINE


def unstack(
    value: Any, num: int | None = None, axis: Any = 0, name: str | None = "unstack"
) -> list[Tensor]:
    """The slices of ``value`` along ``axis`` as a list of tensors (op ``Unpack``)."""
    x = convert_to_tensor(value)
    axis = _axis_value(axis, "Unpack", name)
    if num is None:
        rank = x.shape.rank
        n = None if rank is None else x.shape[_check_axis(axis, rank, x)]
        if n is None:
            raise ValueError(f"cannot infer num from shape {x.shape} of {x.name!r}")
        num = n
    op = make_op("Unpack", (x,), {"num": int(num), "axis": axis}, name=name, default_name="unstack")
    return list(op.outputs)


# -- ReverseV2 ---------------------------------------------------------------------------


def _reverse_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, axis = inputs
    _check_index(axis, "axis")
    axes = _vector_value(axis)
    if axes is not None and x._shape.rank is not None:
        for a in axes:
            _check_axis(a, x._shape.rank, x)
    return [(x._dtype, x._shape)]


define_op("ReverseV2", _reverse_shape)


def _reverse_kernel(x: Any, axis: Any) -> Any:
    return np.flip(x, axis=tuple(np.asarray(axis).reshape(-1).tolist()))


registry.register_kernel_factory("ReverseV2")(lambda op: (_reverse_kernel, registry.INLINE))


def reverse(tensor: Any, axis: Any, name: str | None = None) -> Tensor:
    """``tensor`` with the dimensions in ``axis`` reversed (op ``ReverseV2``)."""
    x = convert_to_tensor(tensor)
    a = (
        axis
        if isinstance(axis, Tensor)
        else constant(np.asarray(axis, np.int32).reshape(-1), dtype=dtypes.int32)
    )
    return make_op("ReverseV2", (x, a), name=name, default_name="ReverseV2").outputs[0]


# -- GatherNd -----------------------------------------------------------------------------


def _gather_nd_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    params, indices = inputs
    _check_index(indices, "indices")
    if params._shape.rank is None or indices._shape.rank is None:
        return [(params._dtype, unknown_shape())]
    if indices._shape.rank == 0:
        raise ValueError(f"indices {indices.name!r} must be at least rank 1")
    depth = indices._shape[-1]
    if depth is None:
        return [(params._dtype, unknown_shape())]
    if depth > params._shape.rank:
        raise ValueError(
            f"indices.shape[-1] = {depth} exceeds the rank "
            f"{params._shape.rank} of params {params.name!r}"
        )
    dims = indices._shape.as_list()[:-1] + params._shape.as_list()[depth:]
    return [(params._dtype, TensorShape(dims))]


define_op("GatherNd", _gather_nd_shape)


def _gather_nd_kernel(params: Any, indices: Any) -> Any:
    depth = indices.shape[-1]
    bounds = np.asarray(params.shape[:depth])
    bad = (indices < 0) | (indices >= bounds)
    if np.any(bad):
        where = np.argwhere(bad.any(axis=-1))[0]
        raise errors.InvalidArgumentError(
            None,
            None,
            f"indices[{','.join(map(str, where))}] = "
            f"{indices[tuple(where)].tolist()} does not index into param shape "
            f"[{','.join(map(str, params.shape))}]",
        )
    return params[tuple(np.moveaxis(indices, -1, 0))]


registry.register_kernel_factory("GatherNd")(lambda op: (_gather_nd_kernel, registry.INLINE))


def gather_nd(params: Any, indices: Any, name: str | None = None) -> Tensor:
    """Slices of ``params`` addressed by the last dimension of ``indices`` (op ``GatherNd``)."""
    p, i = convert_to_tensor(params), convert_to_tensor(indices)
    return make_op("GatherNd", (p, i), name=name, default_name="GatherNd").outputs[0]


# -- boolean_mask (composite, as TF) ---------------------------------------------------------


def boolean_mask(
    tensor: Any, mask: Any, name: str = "boolean_mask", axis: int | None = None
) -> Tensor:
    """The elements (or slices) of ``tensor`` where the bool ``mask`` is true.

    Built from ``Reshape``, ``Where``, ``Squeeze`` and ``GatherV2`` as TF's; ``mask``'s
    shape must match the leading dimensions of ``tensor`` from ``axis`` (default 0).
    """
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops.array_ops import gather
    from asyncflow.ops.math_ops import where

    t, m = convert_to_tensor(tensor), convert_to_tensor(mask)
    if not m.dtype.is_bool:
        raise TypeError(f"mask {m.name!r} must be bool, got {m.dtype.name}")
    k = m.shape.rank
    if k is None or k == 0:
        raise ValueError(f"mask {m.name!r} must have a known rank >= 1")
    a = axis or 0
    dims = t.shape.as_list() if t.shape.rank is not None else None
    if dims is None or len(dims) < a + k:
        raise ValueError(
            f"tensor {t.name!r} of shape {t.shape} has too few dimensions for "
            f"a mask of rank {k} at axis {a}"
        )
    if not TensorShape(dims[a : a + k]).is_compatible_with(m.shape):
        raise ValueError(
            f"mask shape {m.shape} does not match the dimensions "
            f"{dims[a : a + k]} of tensor {t.name!r}"
        )
    lead, rest = dims[:a], dims[a + k :]
    if None in lead or None in rest:
        raise ValueError(
            f"boolean_mask needs the dimensions of {t.name!r} outside the mask "
            f"to be known, got {t.shape}"
        )
    with name_scope(name):
        flat = reshape(t, [*lead, -1, *rest])
        idx = squeeze(where(reshape(m, [-1])), axis=[1])
        return gather(flat, idx, axis=a)


graph_module._OPERATORS["getitem"] = _getitem
