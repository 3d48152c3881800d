"""TensorArrays: TF's ``TensorArrayV3`` op family and ``af.TensorArray``.

A ``TensorArrayV3`` op makes a new array each time it runs (each step, each loop
iteration it sits in): that is TF's per-step resource, and here the array object *is*
the handle value flowing along the graph's edges, so no session resource manager is
involved and concurrent steps never share an array.  Its second output, the *flow*, is
a float scalar every write returns and every read takes: the data edges along the
flow order the ops on one array, inside v1 loops and across their iterations, as in
TF.  The ops on one array run as inline kernels of one step, on that step's loop: an
array needs no lock.

The semantics and error messages are TF's (``kernels/tensor_array.h``): writing an
index twice, reading a cleared index (``clear_after_read``) or an unwritten one whose
element shape is not fully defined (a fully defined one reads as zeros), a
non-resizeable array written out of range, inconsistent element shapes, a closed array —
each an ``InvalidArgumentError`` naming the array and the failing node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, colocate_with, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, as_shape, unknown_shape
from asyncflow.ops._base import define_op, make_op

__all__ = ["TensorArray"]

Specs = list[tuple[dtypes.DType, Any]]

_FLOW = (dtypes.float32, TensorShape(()))


# -- the array --------------------------------------------------------------------------------


class _Element:
    __slots__ = ("cleared", "read", "value")

    def __init__(self) -> None:
        self.value: np.ndarray | None = None
        self.read = False
        self.cleared = False


class _Array:
    """One TensorArray of one step (TF's ``TensorArray`` resource)."""

    __slots__ = (
        "clear_after_read",
        "closed",
        "dtype",
        "dynamic_size",
        "element_shape",
        "elements",
        "fits",
        "identical",
        "name",
    )

    def __init__(
        self,
        name: str,
        dtype: np.dtype[Any],
        size: int,
        dynamic_size: bool,
        clear_after_read: bool,
        element_shape: TensorShape,
        identical: bool,
    ) -> None:
        self.name = name
        self.dtype = dtype
        self.elements = [_Element() for _ in range(size)]
        self.dynamic_size = dynamic_size
        self.clear_after_read = clear_after_read
        self.element_shape = element_shape
        self.identical = identical
        self.closed = False
        self.fits: tuple[int, ...] | None = None  # a value shape known to fit

    def _open(self) -> None:
        if self.closed:
            raise _invalid(f"TensorArray {self.name} has already been closed.")

    def write(self, index: int, value: Any) -> None:
        self._open()
        self._check_index(index)
        array = np.asarray(value)
        self._check_value(index, array.dtype, array.shape)
        self._store(index, array)

    def scatter(self, indices: Sequence[int], rows: np.ndarray) -> None:
        """Write ``rows[k]`` at ``indices[k]``: dtype and shape checked once for all."""
        self._open()
        for k, i in enumerate(indices):
            self._check_index(i)
            if k == 0:
                self._check_value(i, rows.dtype, rows.shape[1:])
            self._store(i, rows[k])

    def _check_index(self, index: int) -> None:
        if index < 0 or (not self.dynamic_size and index >= len(self.elements)):
            raise _invalid(
                f"TensorArray {self.name}: Tried to write to index {index} but "
                f"array is not resizeable and size is: {len(self.elements)}"
            )

    def _check_value(self, index: int, dtype: np.dtype[Any], dims: tuple[int, ...]) -> None:
        if dtype != self.dtype:
            raise _invalid(
                f"TensorArray {self.name}: Could not write to TensorArray index "
                f"{index} because the value dtype is {dtype} but "
                f"TensorArray dtype is {self.dtype}."
            )
        if dims != self.fits:
            self._check_shape(index, dims)

    def _store(self, index: int, array: np.ndarray) -> None:
        if index >= len(self.elements):
            self.elements.extend(_Element() for _ in range(index + 1 - len(self.elements)))
        e = self.elements[index]
        if e.read:
            raise _invalid(
                f"TensorArray {self.name}: Could not write to TensorArray index "
                f"{index} because it has already been read."
            )
        if e.value is not None or e.cleared:
            raise _invalid(
                f"TensorArray {self.name}: Could not write to TensorArray index "
                f"{index} because it has already been written to."
            )
        e.value = array

    def _check_shape(self, index: int, dims: tuple[int, ...]) -> None:
        shape = TensorShape(dims)
        if not self.element_shape.is_compatible_with(shape):
            raise _invalid(
                f"TensorArray {self.name}: Could not write to TensorArray index "
                f"{index} because the value shape is {_debug_shape(shape)} "
                f"which is incompatible with the TensorArray's inferred element "
                f"shape: {_debug_shape(self.element_shape)} (consider setting "
                f"infer_shape=False)."
            )
        if self.identical and not self.element_shape.is_fully_defined():
            self.element_shape = shape  # every element has the first one's shape
        # The shape just checked fits every later write of it (an element shape only
        # ever narrows to one that fits it): a loop writing one shape per iteration
        # compares two tuples instead of building and matching a TensorShape.
        self.fits = dims

    def read(self, index: int) -> np.ndarray:
        self._open()
        if index < 0 or index >= len(self.elements):
            raise _invalid(
                f"Tried to read from index {index} but array size is: {len(self.elements)}"
            )
        e = self.elements[index]
        if e.cleared:
            raise _invalid(
                f"TensorArray {self.name}: Could not read index {index} twice "
                f"because it was cleared after a previous read (perhaps try "
                f"setting clear_after_read = false?)."
            )
        value = e.value
        if value is None:
            value = self._zeros(index)
        if self.clear_after_read:
            e.value = None
            e.cleared = True
        e.read = True
        return value

    def _zeros(self, index: int) -> np.ndarray:
        # An index never written reads as zeros when the element shape is fully known
        # (TF: gradients of unwritten elements), else it is an error.
        shape = self.element_shape
        if not shape.is_fully_defined():
            raise _invalid(
                f"TensorArray {self.name}: Could not read from TensorArray index {index}.  "
                f"Furthermore, the element shape is not fully defined: "
                f"{_debug_shape(shape)}.  It is possible you are working with a resizeable "
                f"TensorArray and stop_gradients is not allowing the gradients to be "
                f"written.  If you set the full element_shape property on the forward "
                f"TensorArray, the proper all-zeros tensor will be returned instead of "
                f"incurring this error."
            )
        return np.zeros([int(d or 0) for d in shape], self.dtype)

    def size(self) -> int:
        self._open()
        return len(self.elements)

    def close(self) -> None:
        self._open()
        self.elements = []
        self.closed = True

    def __reduce__(self) -> Any:
        # A copy in another process would silently miss this step's writes.
        raise TypeError(
            f"TensorArray {self.name!r} cannot leave its step's process: place "
            f"every op on it with the TensorArrayV3 op"
        )

    def __repr__(self) -> str:
        return f"<TensorArray {self.name!r} size={len(self.elements)} closed={self.closed}>"


def _debug_shape(shape: TensorShape) -> str:
    if shape.dims is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.dims) + "]"


def _invalid(message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(None, None, message)


def _array(handle: Any) -> _Array:
    if not isinstance(handle, _Array):
        raise _invalid(f"expected a TensorArray handle, got {type(handle).__name__}")
    return handle


def _stack(
    arrays: Sequence[np.ndarray], name: str, dtype: np.dtype[Any], element_shape: TensorShape
) -> np.ndarray:
    """Read elements stacked: every one of the same shape (TF's gather / stack)."""
    if not arrays:
        if not element_shape.is_fully_defined():
            raise _invalid(
                f"TensorArray {name}: TensorArray has size zero, but element "
                f"shape {_debug_shape(element_shape)} is not fully defined. "
                f"Currently only "
                f"static shapes are supported when packing zero-size "
                f"TensorArrays."
            )
        return np.zeros((0, *[int(d or 0) for d in element_shape]), dtype)
    first = arrays[0].shape
    if not element_shape.is_compatible_with(TensorShape(first)):
        raise _invalid(
            f"TensorArray {name} was passed element_shape "
            f"{_debug_shape(element_shape)} which "
            f"does not match the Tensor at index 0: {list(first)}"
        )
    # Rows copied into one new array: np.stack's Python-level view per element cost
    # 4 us of a 6-row gather (an RNN's outputs, every step).
    out = np.empty((len(arrays), *first), dtype)
    for k, a in enumerate(arrays):
        if a.shape != first:
            raise _invalid(
                f"TensorArray {name}: TensorArray has inconsistent shapes.  "
                f"Index 0 has shape: {list(first)} but index {k} has shape: "
                f"{list(a.shape)}"
            )
        out[k] = a
    return out


# -- shape functions --------------------------------------------------------------------------


def _source(handle: Tensor) -> Operation | None:
    """The op behind ``handle`` past the Enter / Identity / Switch / Merge a loop puts
    in between (the ``TensorArrayV3``, for a handle that came from one)."""
    op = getattr(handle, "_op", None)
    while op is not None and op._type in ("Enter", "Identity", "Switch", "Merge") and op._inputs:
        op = op._inputs[0]._op
    return op


def _handle_element_shape(handle: Tensor) -> TensorShape:
    """The ``element_shape`` of the ``TensorArrayV3`` behind ``handle``, else unknown."""
    op = _source(handle)
    if op is not None and op._type == "TensorArrayV3":
        shape: TensorShape = op._attrs.get("element_shape", unknown_shape())
        return shape
    return unknown_shape()


def _check_scalar_int(t: Tensor, what: str) -> None:
    if not t._dtype.is_integer:
        raise TypeError(f"{what} {t.name!r} must be an integer tensor, got {t._dtype.name}")
    if not t._shape.is_compatible_with(TensorShape(())):
        raise ValueError(f"{what} {t.name!r} must be a scalar, got shape {t._shape}")


def _create_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (size,) = inputs
    _check_scalar_int(size, "size")
    return [(dtypes.string, TensorShape(())), _FLOW]


def _read_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    handle, index, _ = inputs
    _check_scalar_int(index, "index")
    return [(attrs["dtype"], _handle_element_shape(handle))]


def _write_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    _handle, index, value, _ = inputs
    _check_scalar_int(index, "index")
    if "T" in attrs and value._dtype is not attrs["T"]:
        raise TypeError(
            f"value {value.name!r} has dtype {value._dtype.name}, the "
            f"TensorArray holds {attrs['T'].name}"
        )
    return [_FLOW]


def _gather_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    handle, indices, _ = inputs
    element = attrs.get("element_shape", unknown_shape())
    if element.dims is None:
        element = _handle_element_shape(handle)
    n = indices._shape[0] if indices._shape.rank == 1 else None
    if element.dims is None:
        return [(attrs["dtype"], unknown_shape())]
    return [(attrs["dtype"], TensorShape([n, *element.dims]))]


def _scatter_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    _handle, _indices, value, _ = inputs
    if "T" in attrs and value._dtype is not attrs["T"]:
        raise TypeError(
            f"value {value.name!r} has dtype {value._dtype.name}, the "
            f"TensorArray holds {attrs['T'].name}"
        )
    return [_FLOW]


def _split_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    _, value, lengths, _ = inputs
    if "T" in attrs and value._dtype is not attrs["T"]:
        raise TypeError(
            f"value {value.name!r} has dtype {value._dtype.name}, the "
            f"TensorArray holds {attrs['T'].name}"
        )
    if lengths._dtype is not dtypes.int64:
        raise TypeError(f"lengths {lengths.name!r} must be int64, got {lengths._dtype.name}")
    return [_FLOW]


def _concat_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    rest = attrs.get("element_shape_except0", unknown_shape())
    shape = unknown_shape() if rest.dims is None else TensorShape([None, *rest.dims])
    return [(attrs["dtype"], shape), (dtypes.int64, TensorShape([None]))]


def _size_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    return [(dtypes.int32, TensorShape(()))]


define_op("TensorArrayV3", _create_shape, stateful=True)
define_op("TensorArrayReadV3", _read_shape, stateful=True)
define_op("TensorArrayWriteV3", _write_shape, stateful=True)
define_op("TensorArrayGatherV3", _gather_shape, stateful=True)
define_op("TensorArrayScatterV3", _scatter_shape, stateful=True)
define_op("TensorArrayConcatV3", _concat_shape, stateful=True)
define_op("TensorArraySplitV3", _split_shape, stateful=True)
define_op("TensorArraySizeV3", _size_shape, stateful=True)
define_op("TensorArrayCloseV3", lambda inputs, attrs: [], stateful=True)


# -- kernels ----------------------------------------------------------------------------------


def _kernel(op_type: str) -> Callable[[Callable[[Operation], Callable[..., Any]]], Any]:
    """Register ``make(op) -> kernel`` as the INLINE kernel factory of ``op_type``."""

    def decorate(make: Callable[[Operation], Callable[..., Any]]) -> Any:
        registry.register_kernel_factory(op_type)(lambda op: (make(op), registry.INLINE))
        return make

    return decorate


_ZERO = np.float32(0.0)


@_kernel("TensorArrayV3")
def _create(op: Operation) -> Callable[..., Any]:
    attrs = op._attrs
    name = attrs.get("tensor_array_name") or op.name
    np_dtype = np.dtype(attrs["dtype"].np)
    element_shape = attrs.get("element_shape", unknown_shape())
    dynamic = bool(attrs.get("dynamic_size", False))
    clear = bool(attrs.get("clear_after_read", True))
    identical = bool(attrs.get("identical_element_shapes", False))

    def create(size: Any) -> tuple[_Array, Any]:
        n = int(size)
        if n < 0:
            raise _invalid(f"TensorArray {name}: size must be >= 0, got {n}")
        return _Array(name, np_dtype, n, dynamic, clear, element_shape, identical), _ZERO

    return create


@_kernel("TensorArrayWriteV3")
def _write(op: Operation) -> Callable[..., Any]:
    def write(handle: Any, index: Any, value: Any, flow: Any) -> Any:
        _array(handle).write(int(index), value)
        return flow

    return write


@_kernel("TensorArrayReadV3")
def _read(op: Operation) -> Callable[..., Any]:
    return lambda handle, index, flow: _array(handle).read(int(index))


@_kernel("TensorArraySizeV3")
def _size(op: Operation) -> Callable[..., Any]:
    return lambda handle, flow: np.int32(_array(handle).size())


@_kernel("TensorArrayCloseV3")
def _close(op: Operation) -> Callable[..., Any]:
    def close(handle: Any) -> None:
        _array(handle).close()

    return close


@_kernel("TensorArrayGatherV3")
def _gather(op: Operation) -> Callable[..., Any]:
    element_shape = op._attrs.get("element_shape", unknown_shape())

    def gather(handle: Any, indices: Any, flow: Any) -> Any:
        ta = _array(handle)
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise _invalid(f"indices must be a vector, got shape {list(idx.shape)}")
        values = [ta.read(int(i)) for i in idx]
        known = element_shape if element_shape.dims is not None else ta.element_shape
        return _stack(values, ta.name, ta.dtype, known)

    return gather


@_kernel("TensorArrayScatterV3")
def _scatter(op: Operation) -> Callable[..., Any]:
    def scatter(handle: Any, indices: Any, value: Any, flow: Any) -> Any:
        ta = _array(handle)
        idx = np.asarray(indices)
        v = np.asarray(value)
        if idx.ndim != 1:
            raise _invalid(f"indices must be a vector, got shape {list(idx.shape)}")
        if v.ndim == 0 or v.shape[0] != idx.shape[0]:
            raise _invalid(
                f"TensorArray {ta.name}: Could not scatter to TensorArray: "
                f"Expected len(indices) == values.shape[0], but saw: "
                f"{idx.shape[0]} vs. {v.shape[0] if v.ndim else 'a scalar'}"
            )
        ta.scatter(idx.tolist(), v)
        return flow

    return scatter


@_kernel("TensorArrayConcatV3")
def _concat(op: Operation) -> Callable[..., Any]:
    def concat(handle: Any, flow: Any) -> tuple[np.ndarray, np.ndarray]:
        ta = _array(handle)
        values = [ta.read(i) for i in range(ta.size())]
        for k, v in enumerate(values):
            if v.ndim == 0:
                raise _invalid(
                    f"TensorArray {ta.name}: Concat saw a scalar shape at index "
                    f"{k} but requires at least vectors.  Did you mean to call "
                    f"TensorArray::Stack instead?"
                )
            if v.shape[1:] != values[0].shape[1:]:
                raise _invalid(
                    f"TensorArray {ta.name}: TensorArray has inconsistent shapes."
                    f"  Index 0 has (excepting dimension 0) shape: "
                    f"{list(values[0].shape[1:])} but index {k} has (excepting "
                    f"dimension 0) shape: {list(v.shape[1:])}"
                )
        lengths = np.array([v.shape[0] for v in values], np.int64)
        if not values:
            rest = op._attrs.get("element_shape_except0", unknown_shape())
            if not rest.is_fully_defined():
                raise _invalid(
                    f"TensorArray {ta.name}: TensorArray has size zero, but "
                    f"element_shape_except0 {_debug_shape(rest)} is not fully "
                    f"defined."
                )
            return np.zeros((0, *[int(d or 0) for d in rest]), ta.dtype), lengths
        return np.concatenate(values), lengths

    return concat


@_kernel("TensorArraySplitV3")
def _split(op: Operation) -> Callable[..., Any]:
    def split(handle: Any, value: Any, lengths: Any, flow: Any) -> Any:
        ta = _array(handle)
        v = np.asarray(value)
        sizes = np.asarray(lengths).astype(np.int64)
        if v.ndim == 0:
            raise _invalid(
                f"TensorArray {ta.name}: Expected value to be at least a vector, "
                f"but received shape: []"
            )
        if sizes.ndim != 1:
            raise _invalid(f"Expected lengths to be a vector, received shape: {list(sizes.shape)}")
        if int(sizes.sum()) != v.shape[0]:
            raise _invalid(
                f"Expected sum of lengths to be equal to values.shape[0], but sum "
                f"of lengths is {int(sizes.sum())} and value's shape is: "
                f"{list(v.shape)}"
            )
        if not ta.dynamic_size and ta.size() != len(sizes):
            raise _invalid(
                f"TensorArray's size is not equal to the size of lengths "
                f"({ta.size()} vs. {len(sizes)}), and the TensorArray is not "
                f"marked as dynamically resizeable"
            )
        start = 0
        for i, n in enumerate(sizes.tolist()):
            ta.write(i, v[start : start + n])
            start += n
        return flow

    return split


# -- the Python API ---------------------------------------------------------------------------


class TensorArray:
    """A list of tensors of one dtype that a graph writes and reads by index (TF 1.x's
    ``tf.TensorArray``), for loops whose iterations produce or consume one element each.

    Every write returns a *new* ``TensorArray`` object sharing the handle with the next
    flow value: use the returned one, as in TF.  Inside ``af.while_loop`` carry
    ``ta.flow`` as the loop variable and rebuild with
    ``TensorArray(dtype, handle=ta.handle, flow=flow)`` in the body.
    ``size`` may be a tensor; ``dynamic_size=True`` lets writes grow the array.
    """

    def __init__(
        self,
        dtype: Any,
        size: Any = None,
        dynamic_size: bool | None = None,
        clear_after_read: bool | None = None,
        tensor_array_name: str | None = None,
        handle: Tensor | None = None,
        flow: Tensor | None = None,
        infer_shape: bool = True,
        element_shape: Any = None,
        name: str | None = None,
    ) -> None:
        self._dtype = dtypes.as_dtype(dtype)
        self._element_shape = (
            as_shape(element_shape) if element_shape is not None else unknown_shape()
        )
        self._infer_shape = infer_shape
        if handle is not None:
            if flow is None:
                raise ValueError("TensorArray: a handle needs its flow too")
            self._handle, self._flow = handle, flow
            self._element_shape = self._element_shape.merge_with(_handle_element_shape(handle))
            return
        if size is None:
            raise ValueError(
                "TensorArray: size must be given (0 with dynamic_size=True for an array that grows)"
            )
        op = make_op(
            "TensorArrayV3",
            (convert_to_tensor(size, dtype=dtypes.int32),),
            {
                "dtype": self._dtype,
                "element_shape": self._element_shape,
                "dynamic_size": bool(dynamic_size),
                "clear_after_read": True if clear_after_read is None else bool(clear_after_read),
                "identical_element_shapes": bool(infer_shape),
                "tensor_array_name": tensor_array_name or "",
            },
            name=name,
            default_name="TensorArray",
        )
        self._handle, self._flow = op.outputs

    @property
    def handle(self) -> Tensor:
        """The array's handle tensor."""
        return self._handle

    @property
    def flow(self) -> Tensor:
        """The flow tensor: the value that orders this array's ops."""
        return self._flow

    @property
    def dtype(self) -> dtypes.DType:
        """The element dtype."""
        return self._dtype

    @property
    def element_shape(self) -> TensorShape:
        """The static element shape known so far."""
        return self._element_shape

    def _with_flow(self, flow: Tensor, element_shape: TensorShape | None = None) -> TensorArray:
        out = TensorArray(
            self._dtype,
            handle=self._handle,
            flow=flow,
            infer_shape=self._infer_shape,
            element_shape=self._element_shape,
        )
        if element_shape is not None and self._infer_shape:
            if not out._element_shape.is_compatible_with(element_shape):
                raise ValueError(
                    f"TensorArray {self._handle.op.name!r}: element shape "
                    f"{element_shape} is incompatible with "
                    f"{out._element_shape} (consider infer_shape=False)"
                )
            out._element_shape = out._element_shape.merge_with(element_shape)
        return out

    def _make(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        attrs: Mapping[str, Any],
        name: str | None,
        default_name: str,
    ) -> Operation:
        # Every op on the array is placed with it (TF colocates them too): the handle's
        # value is the array object itself, which cannot cross to another process.
        source = _source(self._handle) or self._handle.op
        with colocate_with(source):
            return make_op(op_type, inputs, attrs, name=name, default_name=default_name)

    def _index(self, index: Any) -> Tensor:
        return convert_to_tensor(index, dtype=dtypes.int32)

    def write(self, index: Any, value: Any, name: str | None = None) -> TensorArray:
        """Write ``value`` at ``index``; returns the array with the new flow."""
        v = convert_to_tensor(value, dtype=self._dtype)
        op = self._make(
            "TensorArrayWriteV3",
            (self._handle, self._index(index), v, self._flow),
            {"T": self._dtype},
            name=name,
            default_name="TensorArrayWrite",
        )
        return self._with_flow(op.outputs[0], v.shape)

    def read(self, index: Any, name: str | None = None) -> Tensor:
        """The element at ``index``."""
        op = self._make(
            "TensorArrayReadV3",
            (self._handle, self._index(index), self._flow),
            {"dtype": self._dtype},
            name=name,
            default_name="TensorArrayRead",
        )
        out = op.outputs[0]
        out._shape = out._shape.merge_with(self._element_shape)
        return out

    def gather(self, indices: Any, name: str | None = None) -> Tensor:
        """The elements at ``indices``, stacked along a new first dimension."""
        idx = convert_to_tensor(indices, dtype=dtypes.int32)
        return self._make(
            "TensorArrayGatherV3",
            (self._handle, idx, self._flow),
            {"dtype": self._dtype, "element_shape": self._element_shape},
            name=name,
            default_name="TensorArrayGather",
        ).outputs[0]

    def stack(self, name: str | None = None) -> Tensor:
        """Every element, stacked (``gather(range(size()))``)."""
        from asyncflow.ops.math_ops import range as _range

        return self.gather(_range(0, self.size()), name=name)

    def scatter(self, indices: Any, value: Any, name: str | None = None) -> TensorArray:
        """Write ``value[k]`` at ``indices[k]``."""
        v = convert_to_tensor(value, dtype=self._dtype)
        idx = convert_to_tensor(indices, dtype=dtypes.int32)
        op = self._make(
            "TensorArrayScatterV3",
            (self._handle, idx, v, self._flow),
            {"T": self._dtype},
            name=name,
            default_name="TensorArrayScatter",
        )
        return self._with_flow(op.outputs[0], v.shape[1:] if v.shape.rank else None)

    def unstack(self, value: Any, name: str | None = None) -> TensorArray:
        """Write ``value[k]`` at ``k`` for every ``k`` of its first dimension."""
        from asyncflow.ops.array_ops import shape
        from asyncflow.ops.math_ops import range as _range

        v = convert_to_tensor(value, dtype=self._dtype)
        return self.scatter(_range(0, shape(v)[0]), v, name=name)

    def concat(self, name: str | None = None) -> Tensor:
        """Every element concatenated along its first dimension."""
        rest = (
            TensorShape(self._element_shape.dims[1:])
            if self._element_shape.dims
            else unknown_shape()
        )
        return self._make(
            "TensorArrayConcatV3",
            (self._handle, self._flow),
            {"dtype": self._dtype, "element_shape_except0": rest},
            name=name,
            default_name="TensorArrayConcat",
        ).outputs[0]

    def split(self, value: Any, lengths: Any, name: str | None = None) -> TensorArray:
        """Split ``value`` along its first dimension into pieces of ``lengths``."""
        v = convert_to_tensor(value, dtype=self._dtype)
        n = convert_to_tensor(lengths, dtype=dtypes.int64)
        op = self._make(
            "TensorArraySplitV3",
            (self._handle, v, n, self._flow),
            {"T": self._dtype},
            name=name,
            default_name="TensorArraySplit",
        )
        return self._with_flow(op.outputs[0])

    def size(self, name: str | None = None) -> Tensor:
        """The number of elements."""
        return self._make(
            "TensorArraySizeV3",
            (self._handle, self._flow),
            {},
            name=name,
            default_name="TensorArraySize",
        ).outputs[0]

    def close(self, name: str | None = None) -> Operation:
        """Release the elements; any later op on the array fails."""
        return self._make(
            "TensorArrayCloseV3", (self._handle,), {}, name=name, default_name="TensorArrayClose"
        )

    def __repr__(self) -> str:
        return f"<af.TensorArray {self._handle.op.name!r} dtype={self._dtype.name}>"
