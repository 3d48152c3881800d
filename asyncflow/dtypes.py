"""Element types of tensors and their mapping to numpy.

A :class:`DType` is an interned value object: ``af.float32 is af.as_dtype("float32")``.
String tensors hold ``bytes``, as TensorFlow's ``tf.string`` in Python: their
values are numpy ``object`` arrays of ``bytes``, and ``str`` given as a constant,
feed or ``py_func`` result is encoded as UTF-8 (:func:`as_string_array`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "DType",
    "as_dtype",
    "as_string_array",
    "bool",
    "complex64",
    "complex128",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "string",
    "uint8",
]

_builtin_bool = bool


class DType:
    """The element type of a tensor (``af.float32``, ``af.int64``, ``af.string``, ...)."""

    __slots__ = ("_kind", "_name", "_np")

    def __init__(self, name: str, np_dtype: np.dtype[Any]) -> None:
        self._name = name
        self._np = np_dtype
        self._kind = np_dtype.kind

    @property
    def name(self) -> str:
        """The TensorFlow name, e.g. ``"float32"``."""
        return self._name

    @property
    def as_numpy_dtype(self) -> type:
        """The numpy scalar type, e.g. ``np.float32`` (``object`` for strings)."""
        return self._np.type

    @property
    def np(self) -> np.dtype[Any]:
        """The numpy dtype object."""
        return self._np

    @property
    def is_floating(self) -> _builtin_bool:
        """True for float16/32/64."""
        return self._kind == "f"

    @property
    def is_complex(self) -> _builtin_bool:
        """True for complex64/128."""
        return self._kind == "c"

    @property
    def is_integer(self) -> _builtin_bool:
        """True for signed and unsigned integers (not bool)."""
        return self._kind in "iu"

    @property
    def is_unsigned(self) -> _builtin_bool:
        """True for unsigned integers."""
        return self._kind == "u"

    @property
    def is_bool(self) -> _builtin_bool:
        """True for ``bool``."""
        return self._kind == "b"

    @property
    def is_numeric(self) -> _builtin_bool:
        """True for integer, floating and complex types."""
        return self._kind in "iufc"

    @property
    def is_string(self) -> _builtin_bool:
        """True for ``string``."""
        return self._name == "string"

    def __repr__(self) -> str:
        return f"af.{self._name}"

    def __str__(self) -> str:
        return self._name

    def __reduce__(self) -> tuple[Any, ...]:
        return (as_dtype, (self._name,))


float16 = DType("float16", np.dtype(np.float16))
float32 = DType("float32", np.dtype(np.float32))
float64 = DType("float64", np.dtype(np.float64))
int8 = DType("int8", np.dtype(np.int8))
int16 = DType("int16", np.dtype(np.int16))
int32 = DType("int32", np.dtype(np.int32))
int64 = DType("int64", np.dtype(np.int64))
uint8 = DType("uint8", np.dtype(np.uint8))
bool = DType("bool", np.dtype(np.bool_))
string = DType("string", np.dtype(object))
complex64 = DType("complex64", np.dtype(np.complex64))
complex128 = DType("complex128", np.dtype(np.complex128))

_ALL = (
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    bool,
    string,
    complex64,
    complex128,
)
_BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
_BY_NAME.update({"half": float16, "float": float32, "double": float64})
_BY_NP: dict[np.dtype[Any], DType] = {d.np: d for d in _ALL}
#: Python's own types, as TensorFlow maps them (a Python ``float`` is float32).
_BY_PY_TYPE: dict[type, DType] = {
    _builtin_bool: bool,
    int: int64,
    float: float32,
    complex: complex128,
    bytes: string,
    str: string,
}


def as_dtype(type_value: Any) -> DType:
    """Convert a DType, a name (``"float32"``), a numpy dtype or type, or a Python type.

    Raises ``TypeError`` naming the value when it is none of those.
    """
    if isinstance(type_value, DType):
        return type_value
    if isinstance(type_value, str):
        found = _BY_NAME.get(type_value)
        if found is not None:
            return found
    elif isinstance(type_value, type):
        found = _BY_PY_TYPE.get(type_value)
        if found is not None:
            return found
    found = _from_numpy(type_value)
    if found is None:
        raise TypeError(f"cannot convert {type_value!r} to an asyncflow dtype")
    return found


def _from_numpy(type_value: Any) -> DType | None:
    """The dtype of whatever ``np.dtype`` accepts (numpy's strings and objects are
    ``string``), or None."""
    try:
        np_dtype = np.dtype(type_value)
    except TypeError:
        return None
    if np_dtype.kind in "SUO":
        return string
    return _BY_NP.get(np_dtype)


def dtype_of_value(value: Any) -> DType:
    """The dtype TensorFlow infers for a Python or numpy value (``1`` → int32, ``1.0`` → float32)."""
    if isinstance(value, np.ndarray | np.generic):
        return as_dtype(value.dtype)
    try:
        arr = np.asarray(value)
    except UnicodeError:  # str mixed with non-ASCII bytes: only a string tensor holds both
        return string
    kind = arr.dtype.kind
    if kind == "i":
        # TF's convert_to_tensor: Python ints are int32 unless they do not fit.
        if arr.size and (arr.max() > 2**31 - 1 or arr.min() < -(2**31)):
            return int64
        return int32
    if kind == "f":
        return float32
    if kind == "c":
        return complex128
    return as_dtype(arr.dtype)


def as_string_array(value: Any) -> np.ndarray:
    """``value`` (bytes, str, or a nested list / array of them) as a string tensor value.

    An ``object`` array of ``bytes`` of the same shape: ``str`` items are encoded as
    UTF-8, ``bytes`` kept.  ``TypeError`` naming the first item that is neither
    (TensorFlow does not turn numbers into strings either).
    """
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        items = [bytes(v) for v in value.reshape(-1)]
        shape: tuple[int, ...] = value.shape
    else:
        source = np.array(value, dtype=object)
        shape = source.shape
        items = []
        for item in source.reshape(-1).tolist():
            if isinstance(item, bytes):
                items.append(bytes(item))
            elif isinstance(item, str):
                items.append(item.encode("utf-8"))
            else:
                raise TypeError(
                    f"a string tensor holds bytes or str, got {type(item).__name__} {item!r}"
                )
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)
