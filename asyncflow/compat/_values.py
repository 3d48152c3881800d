"""Values between TensorFlow's protobuf messages and asyncflow: dtypes, shapes, tensors, attrs.

``TensorProto`` decoding follows TF's ``tensor_util.MakeNdarray``: ``tensor_content``
holds the raw little-endian bytes; otherwise the typed ``*_val`` field holds either
every element or a prefix whose last value fills the rest (TF's compact constants).
Half values travel as their uint16 bit patterns in ``half_val``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.compat._tf_proto import DATA_TYPES
from asyncflow.framework.shapes import TensorShape

__all__ = [
    "RESOURCE_TYPE",
    "ResourceType",
    "attr_from_proto",
    "attr_to_proto",
    "dtype_from_enum",
    "dtype_to_enum",
    "ndarray_from_proto",
    "ndarray_to_proto",
    "shape_from_proto",
    "shape_to_proto",
]

#: Larger constants are refused: a corrupt or hostile shape must not exhaust memory.
_MAX_CONSTANT_BYTES = 1 << 31

_BY_NAME = {
    "DT_FLOAT": dtypes.float32,
    "DT_DOUBLE": dtypes.float64,
    "DT_HALF": dtypes.float16,
    "DT_INT8": dtypes.int8,
    "DT_INT16": dtypes.int16,
    "DT_INT32": dtypes.int32,
    "DT_INT64": dtypes.int64,
    "DT_UINT8": dtypes.uint8,
    "DT_BOOL": dtypes.bool,
    "DT_STRING": dtypes.string,
    "DT_COMPLEX64": dtypes.complex64,
    "DT_COMPLEX128": dtypes.complex128,
}
_FROM_ENUM = {DATA_TYPES[k]: v for k, v in _BY_NAME.items()}
_TO_ENUM = {v: DATA_TYPES[k] for k, v in _BY_NAME.items()}
_ENUM_NAME = {v: k for k, v in DATA_TYPES.items()}

# The typed repeated field holding each dtype's values when tensor_content is empty.
_VAL_FIELD = {
    dtypes.float32: "float_val",
    dtypes.float64: "double_val",
    dtypes.float16: "half_val",
    dtypes.int8: "int_val",
    dtypes.int16: "int_val",
    dtypes.int32: "int_val",
    dtypes.uint8: "int_val",
    dtypes.int64: "int64_val",
    dtypes.bool: "bool_val",
    dtypes.string: "string_val",
    dtypes.complex64: "scomplex_val",
    dtypes.complex128: "dcomplex_val",
}


#: TF's ``DT_RESOURCE``: the type of a TensorArray handle.  asyncflow keeps a handle in a
#: string-typed tensor (its value is the array object itself, which never leaves the step).
RESOURCE = DATA_TYPES["DT_RESOURCE"]


class ResourceType:
    """An attribute value written as ``DT_RESOURCE`` (the type of a handle tensor)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DT_RESOURCE"


RESOURCE_TYPE = ResourceType()


def dtype_from_enum(value: int, where: str) -> dtypes.DType:
    """The asyncflow dtype of a TF ``DataType`` number (``*_REF`` types read as the base)."""
    base = value - 100 if value > 100 else value
    dt = _FROM_ENUM.get(base)
    if dt is None:
        name = _ENUM_NAME.get(base)
        if name is None:  # not a DataType at all: the graph def is wrong, as TF says
            raise errors.InvalidArgumentError(
                None, None, f"{where}: {value} is not a valid DataType"
            )
        raise errors.UnimplementedError(None, None, f"{where}: TF dtype {name} is not supported")
    return dt


def dtype_to_enum(dt: dtypes.DType, where: str) -> int:
    """The TF ``DataType`` number of an asyncflow dtype."""
    try:
        return _TO_ENUM[dt]
    except KeyError:
        raise ValueError(f"{where}: dtype {dt.name} has no TensorFlow equivalent") from None


def shape_from_proto(proto: Any) -> TensorShape:
    """A ``TensorShapeProto`` as a TensorShape (``-1`` dims are unknown)."""
    if proto.unknown_rank:
        return TensorShape(None)
    return TensorShape([None if d.size < 0 else int(d.size) for d in proto.dim])


def shape_to_proto(shape: TensorShape, proto: Any) -> None:
    """Fill ``proto`` (a ``TensorShapeProto``) from ``shape``."""
    if shape.dims is None:
        proto.unknown_rank = True
        return
    for d in shape.dims:
        proto.dim.add(size=-1 if d is None else d)


def ndarray_from_proto(proto: Any, where: str) -> tuple[dtypes.DType, np.ndarray]:
    """The dtype and a read-only numpy array of a ``TensorProto``.

    ``DataLossError`` when the data does not fill the shape.
    """
    dt = dtype_from_enum(proto.dtype, where)
    shape = shape_from_proto(proto.tensor_shape)
    if shape.dims is None or None in shape.dims:
        raise errors.InvalidArgumentError(
            None, None, f"{where}: tensor shape {shape} is not fully defined"
        )
    dims = tuple(int(d) for d in shape.dims)  # type: ignore[arg-type]
    count = 1
    for d in dims:
        count *= d  # Python ints: no overflow for absurd shapes
    if count * dt.np.itemsize > _MAX_CONSTANT_BYTES:
        raise errors.InvalidArgumentError(
            None,
            None,
            f"{where}: a constant of shape {list(dims)} ({dt.name}) is larger "
            f"than {_MAX_CONSTANT_BYTES >> 30} GiB",
        )
    if proto.tensor_content:
        if dt.is_string:
            raise errors.DataLossError(
                None, None, f"{where}: string tensors cannot use tensor_content"
            )
        raw = proto.tensor_content
        itemsize = dt.np.itemsize
        if len(raw) != count * itemsize:
            raise errors.DataLossError(
                None,
                None,
                f"{where}: tensor_content has {len(raw)} bytes, shape "
                f"{list(dims)} of {dt.name} needs {count * itemsize}",
            )
        array = np.frombuffer(raw, dtype=dt.np.newbyteorder("<")).astype(dt.np).reshape(dims)
    else:
        array = _from_val_field(proto, dt, dims, count, where)
    array.flags.writeable = False
    return dt, array


def _from_val_field(
    proto: Any, dt: dtypes.DType, dims: tuple[int, ...], count: int, where: str
) -> np.ndarray:
    values: Any = list(getattr(proto, _VAL_FIELD[dt]))
    if dt is dtypes.float16:
        values = np.asarray(values, np.uint16).view(np.float16)
    elif dt.is_complex:
        values = np.asarray(values).reshape(-1, 2)
        values = values[:, 0] + 1j * values[:, 1] if len(values) else values.reshape(-1)
    if dt.is_string:
        flat = np.empty(len(values), dtype=object)
        flat[:] = [bytes(v) for v in values]
    else:
        flat = np.asarray(values, dtype=dt.np).reshape(-1)
    if flat.size == count:
        return flat.reshape(dims)
    if flat.size == 0:
        return np.zeros(dims, dtype=dt.np) if not dt.is_string else np.full(dims, b"", dtype=object)
    if flat.size > count:
        raise errors.DataLossError(
            None, None, f"{where}: {flat.size} values do not fit shape {list(dims)}"
        )
    # TF's compact form: the last value repeats to fill the shape.
    out = np.empty(count, dtype=flat.dtype)
    out[: flat.size] = flat
    out[flat.size :] = flat[-1]
    return out.reshape(dims)


def ndarray_to_proto(array: np.ndarray, dt: dtypes.DType, proto: Any, where: str) -> None:
    """Fill ``proto`` (a ``TensorProto``) with ``array`` of dtype ``dt``."""
    proto.dtype = dtype_to_enum(dt, where)
    shape_to_proto(TensorShape(list(array.shape)), proto.tensor_shape)
    if dt.is_string:
        proto.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist()
        )
    else:
        proto.tensor_content = np.ascontiguousarray(array, dtype=dt.np.newbyteorder("<")).tobytes()


def attr_from_proto(value: Any, where: str) -> Any:
    """The Python value of an ``AttrValue``: str (from bytes), int, float, bool, DType,
    TensorShape, numpy array, or a list of those."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "list":
        lv = value.list
        for field in ("s", "i", "f", "b", "type", "shape", "tensor"):
            items = getattr(lv, field)
            if len(items):
                return [_scalar_attr(field, v, where) for v in items]
        if len(lv.func):
            raise errors.UnimplementedError(
                None, None, f"{where}: function attributes are not supported"
            )
        return []
    if kind in ("func", "placeholder"):
        raise errors.UnimplementedError(None, None, f"{where}: {kind} attributes are not supported")
    return _scalar_attr(kind, getattr(value, kind), where)


def _scalar_attr(kind: str, v: Any, where: str) -> Any:
    if kind == "s":
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v)
    if kind == "i":
        return int(v)
    if kind == "f":
        return float(v)
    if kind == "b":
        return bool(v)
    if kind == "type":
        return dtype_from_enum(v, where)
    if kind == "shape":
        return shape_from_proto(v)
    return ndarray_from_proto(v, where)[1]


def attr_to_proto(value: Any, proto: Any, where: str) -> None:
    """Fill ``proto`` (an ``AttrValue``) from a Python attribute value."""
    if isinstance(value, bool):
        proto.b = value
    elif isinstance(value, int | np.integer):
        proto.i = int(value)
    elif isinstance(value, float | np.floating):
        proto.f = float(value)
    elif isinstance(value, str):
        proto.s = value.encode("utf-8")
    elif isinstance(value, bytes):
        proto.s = value
    elif isinstance(value, dtypes.DType):
        proto.type = dtype_to_enum(value, where)
    elif isinstance(value, ResourceType):
        proto.type = RESOURCE
    elif isinstance(value, TensorShape):
        shape_to_proto(value, proto.shape)
    elif isinstance(value, list | tuple):
        _list_to_proto(list(value), proto.list, where)
    else:
        raise ValueError(f"{where}: attribute value {value!r} has no TensorFlow form")


def _list_to_proto(items: list[Any], lv: Any, where: str) -> None:
    if not items:
        lv.SetInParent()
        return
    first = items[0]
    if isinstance(first, bool):
        lv.b.extend(bool(v) for v in items)
    elif isinstance(first, int | np.integer):
        lv.i.extend(int(v) for v in items)
    elif isinstance(first, float):
        lv.f.extend(float(v) for v in items)
    elif isinstance(first, str | bytes):
        lv.s.extend(v.encode() if isinstance(v, str) else v for v in items)
    elif isinstance(first, dtypes.DType):
        lv.type.extend(dtype_to_enum(v, where) for v in items)
    elif isinstance(first, TensorShape):
        for v in items:
            shape_to_proto(v, lv.shape.add())
    else:
        raise ValueError(f"{where}: list attribute {items!r} has no TensorFlow form")
