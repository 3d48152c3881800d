"""Client-side fetch and feed handling for ``Session.run``.

A fetch structure (a Tensor, an Operation, a name, or any nesting of list / tuple /
namedtuple / dict of those) becomes a hashable signature key, a list of unique
tensors and targets, and a function that rebuilds the caller's structure from the
step's values.  A feed value is converted and checked against its tensor's dtype and
static shape (TF's messages).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes as _dtypes
from asyncflow.framework.graph import Graph, Operation, Tensor

__all__ = ["FetchMapper", "Rebuild", "feed_converter", "fetch_key", "retval_converter"]


def fetch_key(fetch: Any) -> Any:
    """A hashable key for a fetch structure (leaves by identity or name)."""
    t = type(fetch)
    if t is Tensor or t is Operation or t is str:
        return fetch
    if isinstance(fetch, str):
        return str(fetch)
    if t is list or t is tuple:
        return (t, tuple(fetch_key(f) for f in fetch))
    if isinstance(fetch, tuple):  # namedtuple
        return (t, tuple(fetch_key(f) for f in fetch))
    if isinstance(fetch, Mapping):
        # type(k) too: 1, 1.0 and True are equal dict keys but rebuild differently.
        return (t, tuple((k, type(k), fetch_key(v)) for k, v in fetch.items()))
    if isinstance(fetch, list):
        return (t, tuple(fetch_key(f) for f in fetch))
    if hasattr(fetch, "_as_graph_element") or isinstance(fetch, Tensor | Operation):
        return fetch
    raise TypeError(
        f"Fetch argument {fetch!r} has invalid type {type(fetch)!r}, must be a "
        f"string or Tensor, an Operation, or a list/tuple/dict of those."
    )


Rebuild = Callable[[Sequence[Any]], Any]


class FetchMapper:
    """Flattens a fetch structure into unique tensors + targets, and rebuilds results."""

    def __init__(self, graph: Graph, fetches: Any) -> None:
        self.tensors: list[Tensor] = []
        self.targets: list[Operation] = []
        self._index: dict[Tensor, int] = {}
        self._graph = graph
        self.rebuild: Rebuild = self._build(fetches)

    def _element(self, fetch: Any) -> Tensor | Operation:
        try:
            return self._graph.as_graph_element(fetch)
        except TypeError:
            raise TypeError(
                f"Fetch argument {fetch!r} has invalid type {type(fetch)!r}, must be a "
                f"string or Tensor, an Operation, or a list/tuple/dict of those."
            ) from None
        except ValueError as exc:
            raise ValueError(
                f"Fetch argument {fetch!r} cannot be interpreted as a Tensor or Operation: {exc}"
            ) from None

    def _build(self, fetch: Any) -> Rebuild:
        if isinstance(fetch, list | tuple) and not isinstance(fetch, str):
            parts = [self._build(f) for f in fetch]
            kind = type(fetch)
            if kind is list:
                return lambda vals: [p(vals) for p in parts]
            if kind is tuple:
                return lambda vals: tuple(p(vals) for p in parts)
            if hasattr(kind, "_fields"):
                return lambda vals: kind(*(p(vals) for p in parts))
            return lambda vals: kind(p(vals) for p in parts)
        if isinstance(fetch, Mapping):
            return self._build_mapping(fetch)
        element = self._element(fetch)
        if isinstance(element, Operation):
            if not self._graph.is_fetchable(element):
                raise ValueError(f"Operation {element.name!r} has been marked as not fetchable.")
            self.targets.append(element)
            return lambda vals: None
        if not self._graph.is_fetchable(element):
            raise ValueError(f"Tensor {element.name!r} may not be fetched.")
        index = self._index.get(element)
        if index is None:
            index = self._index[element] = len(self.tensors)
            self.tensors.append(element)
        return lambda vals: vals[index]

    def _build_mapping(self, fetch: Mapping[Any, Any]) -> Rebuild:
        items = [(k, self._build(v)) for k, v in fetch.items()]
        mkind: Any = type(fetch)
        if mkind is dict:
            return lambda vals: {k: p(vals) for k, p in items}
        factory = getattr(fetch, "default_factory", None)

        def rebuild_mapping(vals: Sequence[Any]) -> Any:
            # As TF: defaultdicts keep their factory; other mappings start empty.
            out = mkind(factory) if isinstance(fetch, defaultdict) else mkind()
            for k, p in items:
                out[k] = p(vals)
            return out

        return rebuild_mapping


def feed_converter(t: Tensor) -> Callable[[Any], Any]:
    """Convert and check one fed value for ``t`` (dtype, static shape); 0-d → numpy scalar."""
    np_dtype = t._dtype.np
    scalar_type = np_dtype.type
    dims = t._shape.dims
    floating = np_dtype.kind == "f"
    scalar_ok = dims is None or not dims  # a 0-d value passes the shape check

    def convert(v: Any) -> Any:
        tv = type(v)
        if tv is scalar_type:  # the run's fast path: a numpy scalar, or a Python float
            if scalar_ok:
                return v
            a = v
            shape: tuple[int, ...] = ()
        elif tv is float and floating:
            if scalar_ok:
                return scalar_type(v)
            a = scalar_type(v)
            shape = ()
        else:
            a = _feed_array(t, v)
            shape = a.shape
            if not shape:
                a = a[()]
        if dims is not None:
            _check_feed_shape(t, shape)
        return a

    return convert


def _feed_array(t: Tensor, v: Any) -> Any:
    """A fed value other than a scalar of ``t``'s type, as an array of its dtype."""
    name = t.name
    if isinstance(v, Tensor) or hasattr(v, "_as_graph_element"):
        raise TypeError(
            f"The value of a feed cannot be an af.Tensor object (feeding "
            f"{name!r}). Acceptable feed values include Python scalars, "
            f"strings, lists, numpy ndarrays."
        )
    if t._dtype.is_string:
        return _dtypes.as_string_array(v)  # bytes, as TF (str is UTF-8 encoded)
    np_dtype = t._dtype.np
    if type(v) is np.ndarray and v.dtype == np_dtype:
        return v
    try:
        a = np.asarray(v, dtype=np_dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"cannot convert feed value {v!r} for Tensor {name!r} to {t._dtype.name}: {exc}"
        ) from None
    if type(v) is int and a != v:  # as TF: only Python ints are checked
        raise TypeError(
            f"Type of feed value {v!r} with type {type(v).__name__} is not "
            f"compatible with Tensor type {t._dtype.name} of {name!r}"
        )
    return a


def _check_feed_shape(t: Tensor, shape: tuple[int, ...]) -> None:
    """A fed value's shape against ``t``'s static one (known dimensions must match)."""
    dims = t._shape.dims
    assert dims is not None
    if len(shape) != len(dims) or any(
        want is not None and have != want for have, want in zip(shape, dims)
    ):
        raise ValueError(
            f"Cannot feed value of shape {shape!r} for Tensor {t.name!r}, which has shape {t._shape}"
        )


def retval_converter(t: Tensor) -> Callable[[Any], Any]:
    """How a fetched value leaves the step: 0-d as a numpy scalar of ``t``'s dtype."""
    np_dtype = t._dtype.np
    scalar_type = np_dtype.type

    def convert(v: Any) -> Any:
        if type(v) is scalar_type:
            return v
        if isinstance(v, np.ndarray):
            if v.dtype != np_dtype:
                v = v.astype(np_dtype)
            if v.ndim == 0:
                return v[()]
            if not v.flags.writeable:
                v = v.copy()
            return v
        return np.asarray(v, dtype=np_dtype)[()]

    return convert
