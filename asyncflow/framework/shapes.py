"""Static shapes: :class:`TensorShape` with unknown dimensions and unknown rank.

``TensorShape([None, 3])`` has rank 2 and an unknown first dimension;
``TensorShape(None)`` has unknown rank.  Iterating a shape gives ints or ``None``
(``tuple(x.shape) == (None, 3)``), as in TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, overload

__all__ = ["TensorShape", "as_shape", "broadcast_shapes", "unknown_shape"]


class TensorShape:
    """The static shape of a tensor; dimensions are ``int`` or ``None`` (unknown)."""

    __slots__ = ("_dims",)

    _dims: tuple[int | None, ...] | None

    def __init__(self, dims: Any = None) -> None:
        if dims is None:
            self._dims = None
        elif isinstance(dims, TensorShape):
            self._dims = dims._dims
        elif isinstance(dims, int):
            self._dims = (_dim(dims),)
        else:
            self._dims = tuple(_dim(d) for d in dims)

    @classmethod
    def _from_tuple(cls, dims: tuple[int | None, ...] | None) -> TensorShape:
        shape = cls.__new__(cls)
        shape._dims = dims
        return shape

    @property
    def dims(self) -> tuple[int | None, ...] | None:
        """The dimensions, or None for unknown rank."""
        return self._dims

    @property
    def rank(self) -> int | None:
        """The number of dimensions, or None for unknown rank."""
        return None if self._dims is None else len(self._dims)

    @property
    def ndims(self) -> int | None:
        """Alias of :attr:`rank` (TensorFlow 1.x name)."""
        return self.rank

    def is_fully_defined(self) -> bool:
        """True when the rank and every dimension are known."""
        return self._dims is not None and None not in self._dims

    def as_list(self) -> list[int | None]:
        """The dimensions as a list; ``ValueError`` for unknown rank."""
        if self._dims is None:
            raise ValueError("as_list() is not defined on an unknown TensorShape")
        return list(self._dims)

    def num_elements(self) -> int | None:
        """The number of elements, or None when not fully defined."""
        if not self.is_fully_defined():
            return None
        n = 1
        for d in self._dims or ():
            n *= d  # type: ignore[operator]
        return n

    def is_compatible_with(self, other: Any) -> bool:
        """True when some concrete shape fits both ``self`` and ``other``."""
        other = as_shape(other)
        if self._dims is None or other._dims is None:
            return True
        if len(self._dims) != len(other._dims):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self._dims, other._dims))

    def merge_with(self, other: Any) -> TensorShape:
        """The most specific shape compatible with both; ``ValueError`` if incompatible."""
        o = as_shape(other)
        if self._dims is None:
            return o
        if o._dims is None:
            return self
        if not self.is_compatible_with(o):
            raise ValueError(f"Shapes {self} and {o} are not compatible")
        return TensorShape._from_tuple(
            tuple(a if a is not None else b for a, b in zip(self._dims, o._dims))
        )

    def with_rank(self, rank: int) -> TensorShape:
        """This shape with rank ``rank``; ``ValueError`` if the rank is known and differs."""
        if self._dims is None:
            return TensorShape._from_tuple((None,) * rank)
        if len(self._dims) != rank:
            raise ValueError(f"Shape {self} must have rank {rank}")
        return self

    def __iter__(self) -> Iterator[int | None]:
        if self._dims is None:
            raise ValueError("Cannot iterate over a shape with unknown rank.")
        return iter(self._dims)

    def __len__(self) -> int:
        if self._dims is None:
            raise ValueError("Cannot take the length of a shape with unknown rank.")
        return len(self._dims)

    @overload
    def __getitem__(self, key: int) -> int | None: ...
    @overload
    def __getitem__(self, key: slice) -> TensorShape: ...
    def __getitem__(self, key: int | slice) -> int | TensorShape | None:
        if self._dims is None:
            return None if isinstance(key, int) else TensorShape(None)
        if isinstance(key, slice):
            return TensorShape._from_tuple(self._dims[key])
        return self._dims[key]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TensorShape):
            return self._dims == other._dims
        try:
            return self._dims == as_shape(other)._dims
        except (TypeError, ValueError):
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self._dims)

    def __bool__(self) -> bool:
        return self._dims is not None

    def __repr__(self) -> str:
        return f"TensorShape({None if self._dims is None else list(self._dims)})"

    def __str__(self) -> str:
        if self._dims is None:
            return "<unknown>"
        if len(self._dims) == 1:
            return f"({self._dims[0]},)"
        return "(" + ", ".join(str(d) for d in self._dims) + ")"


def _dim(d: Any) -> int | None:
    if d is None:
        return None
    if hasattr(d, "value") and not isinstance(d, int):  # TF Dimension-like
        d = d.value
        if d is None:
            return None
    try:
        value = int(d)
    except (TypeError, ValueError):
        raise TypeError(f"a shape dimension must be an int or None, got {d!r}") from None
    if value != d or isinstance(d, bool):
        raise TypeError(f"a shape dimension must be an int or None, got {d!r}")
    if value < 0:
        raise ValueError(f"a shape dimension must be >= 0 or None, got {value}")
    return value


_UNKNOWN = TensorShape(None)
_SCALAR = TensorShape(())


def unknown_shape(rank: int | None = None) -> TensorShape:
    """A shape of unknown rank, or of known rank with every dimension unknown."""
    if rank is None:
        return _UNKNOWN
    return TensorShape._from_tuple((None,) * rank)


def as_shape(shape: Any) -> TensorShape:
    """Convert a TensorShape, a list/tuple of dims, an int or None to a TensorShape."""
    if isinstance(shape, TensorShape):
        return shape
    if shape is None:
        return _UNKNOWN
    if isinstance(shape, tuple) and not shape:
        return _SCALAR
    return TensorShape(shape)


def broadcast_shapes(a: TensorShape, b: TensorShape) -> TensorShape:
    """numpy broadcasting on static shapes; ``ValueError`` when they cannot broadcast."""
    if a._dims is None or b._dims is None:
        return _UNKNOWN
    if a._dims == b._dims:
        return a
    da, db = a._dims, b._dims
    n = max(len(da), len(db))
    da = (1,) * (n - len(da)) + da
    db = (1,) * (n - len(db)) + db
    out: list[int | None] = []
    for x, y in zip(da, db):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif x is None:
            out.append(y if y is not None else None)
        elif y is None:
            out.append(x)
        else:
            raise ValueError(
                f"Dimensions must be equal or 1, but are {x} and {y} for shapes {a} and {b}"
            )
    return TensorShape._from_tuple(tuple(out))


def shape_of_value(shape: Iterable[int]) -> TensorShape:
    """A fully defined TensorShape from a concrete numpy shape tuple (a scalar's is the
    one shared scalar shape: an op on two scalars then finds one shape object on both
    sides and needs no broadcast)."""
    dims = tuple(shape)
    return TensorShape._from_tuple(dims) if dims else _SCALAR
