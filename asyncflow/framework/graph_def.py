"""Graph serialization: :func:`graph_to_graph_def` and :func:`import_graph_def`.

A graph def is a JSON-serializable dict (``json.dumps`` works on it)::

    {"versions": {"producer": 1, "format": "asyncflow.graph_def/1"},
     "node": [{"name": "y", "op": "MatMul", "input": ["x", "w:0", "^init"],
               "device": "/cpu:0", "attr": {"transpose_a": {"b": false}}}]}

Inputs use TensorFlow's spelling: ``"x"`` is output 0 of node ``x``, ``"x:1"`` its
output 1 and ``"^x"`` a control input.  Attribute values are *tagged* (a dict with
exactly one key naming the type) so that they round-trip exactly:

========== ================================================================
tag        value
========== ================================================================
``i``      int                ``f`` float (``"nan"``, ``"inf"``, ``"-inf"`` as strings)
``b``      bool               ``s`` str
``c``      complex ``[re, im]``  ``bytes`` base64 of a bytes value
``none``   None               ``list`` / ``tuple`` encoded items
``dict``   ``[[key, value], ...]`` of encoded pairs
``dtype``  an asyncflow DType name      ``np_dtype`` a numpy dtype string
``shape``  TensorShape dims (``null`` for unknown rank)
``array``  ``{"dtype", "shape", "data"}``: numpy dtype string, dims and base64 of the
           raw C-order bytes (lossless, NaN payloads and endianness included)
``objects`` ``{"shape", "items"}``: an object (e.g. string) array, items encoded
``scalar`` ``{"dtype", "data"}``: a numpy scalar, raw bytes as for ``array``
``func``   a callable by reference, ``"module:qualname"``
========== ================================================================

Import re-creates every op through :meth:`Graph.create_op` (so shape functions run
again) in dependency order, whatever the order of the node list.  A ``while_loop``'s
back edge (``NextIteration → Merge``) is the one edge that may close a cycle: the
Merge is created with the value entering the loop in its place and rewired when
its NextIteration exists; any other cycle is an error.  Everything that can be
checked before an op is added is checked first — structure, names, op types,
attributes, inputs, cycles, clashes with existing names — so a malformed graph def
is a ``ValueError`` naming the node and leaves the graph untouched (a dtype attr
— ``dtype``, ``T``, ``component_types``, ... — holding no valid dtype is
``InvalidArgumentError`` naming node and attr, as TF).  A shape
function that rejects an imported node (or a back edge whose dtype or shape does
not fit its Merge) still raises after the earlier nodes were added (graphs are
append-only).  Partition graphs (``RunMetadata.partition_graphs``, with ``_Arg`` /
``_Retval`` / ``_Send`` / ``_Recv`` nodes) import the same way.  All algorithms are iterative: graphs with
hundreds of thousands of nodes import without recursion.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from asyncflow import dtypes as _dtypes
from asyncflow import errors
from asyncflow.framework import function as _function
from asyncflow.framework import graph as _graph
from asyncflow.framework import registry
from asyncflow.framework.graph import Graph, Operation, Tensor, get_default_graph
from asyncflow.framework.shapes import TensorShape

__all__ = [
    "FORMAT",
    "PRODUCER",
    "decode_attr",
    "encode_attr",
    "graph_to_graph_def",
    "import_graph_def",
]

FORMAT = "asyncflow.graph_def/1"
PRODUCER = 1
# What compiler/partition.py writes for ``RunMetadata.partition_graphs``: the same
# node form, plus ``_Arg`` / ``_Retval`` / ``_Send`` / ``_Recv`` nodes.
_PARTITION_FORMAT = "asyncflow.partition_graph/1"
_READABLE_FORMATS = (FORMAT, _PARTITION_FORMAT)

# Nesting deeper than this in one attribute value is refused (it would only come
# from a corrupted or hostile graph def, and recursion must stay bounded).
_MAX_DEPTH = 64


# -- the call frame's op types ------------------------------------------------------
# Feeds enter a compiled partition as ``_Arg`` nodes and fetches leave it through
# ``_Retval`` nodes (TF's FunctionCallFrame).  They exist only in partition graph
# defs; defining them here lets those be imported and inspected again.  They have
# no kernels: the runtime binds a partition's call frame itself.


def _arg_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    if inputs:
        raise ValueError(f"_Arg takes no inputs, got {len(inputs)}")
    return [(_attr_dtype(attrs), TensorShape(None))]


def _retval_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    if len(inputs) != 1:
        raise ValueError(f"_Retval takes one input, got {len(inputs)}")
    dtype = _attr_dtype(attrs)
    if inputs[0].dtype is not dtype:
        raise TypeError(
            f"_Retval of dtype {dtype.name} gets a {inputs[0].dtype.name} input {inputs[0].name!r}"
        )
    return []


def _attr_dtype(attrs: Mapping[str, Any]) -> _dtypes.DType:
    dtype = attrs.get("T")
    index = attrs.get("index")
    if not isinstance(dtype, _dtypes.DType):
        raise TypeError(f"attr 'T' must be a dtype, got {_short(dtype)}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"attr 'index' must be an int >= 0, got {_short(index)}")
    return dtype


registry.define_op("_Arg", _arg_shape, stateful=True, feedable=False)
registry.define_op("_Retval", _retval_shape, stateful=True)


# -- export ---------------------------------------------------------------------


def graph_to_graph_def(graph: Graph) -> dict[str, Any]:
    """A JSON-serializable description of every op of ``graph``, in creation order.

    ``ValueError`` naming the node and attribute when an attribute cannot be
    serialized (e.g. a lambda or local function given to ``af.py_func``).
    """
    nodes = []
    for op in graph.get_operations():
        nodes.append(_node_def(op))
    out: dict[str, Any] = {"versions": {"producer": PRODUCER, "format": FORMAT}, "node": nodes}
    if graph._functions:
        out["library"] = {"function": [_function_def(f) for f in graph._functions.values()]}
    return out


def _function_def(f: _function.FunctionDef) -> dict[str, Any]:
    """One function of the library: signature, body (with its own library), results."""
    return {
        "signature": {
            "name": f.name,
            "input_arg": [{"name": a, "type": t.name} for a, t in zip(f.args, f.input_types)],
            "output_arg": [{"name": n, "type": t.dtype.name} for n, t in zip(f.out_names, f.rets)],
        },
        "num_declared": f.num_declared,
        "ret": [t.name for t in f.rets],
        "body": graph_to_graph_def(f.body),
    }


def _node_def(op: Operation) -> dict[str, Any]:
    inputs = [_input_name(t) for t in op.inputs]
    inputs.extend("^" + c.name for c in op.control_inputs)
    attrs: dict[str, Any] = {}
    for key, value in op._attrs.items():
        try:
            attrs[key] = encode_attr(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"cannot serialize attr {key!r} of node {op.name!r} (op {op.type}): {exc}"
            ) from None
    return {"name": op.name, "op": op.type, "input": inputs, "device": op.device, "attr": attrs}


def _input_name(t: Tensor) -> str:
    return t.op.name if t.value_index == 0 else f"{t.op.name}:{t.value_index}"


def encode_attr(value: Any, _depth: int = 0) -> dict[str, Any]:
    """The tagged JSON form of one attribute value (see the module docstring)."""
    if _depth > _MAX_DEPTH:
        raise ValueError(f"attribute value nested deeper than {_MAX_DEPTH} levels")
    encoded = _encode_number(value)  # first: a numpy scalar may also be a str or float
    if encoded is None:
        encoded = _encode_plain(value)
    if encoded is None:
        encoded = _encode_structure(value, _depth)
    if encoded is None:
        raise TypeError(
            f"attribute values of type {type(value).__name__} cannot be serialized: {value!r}"
        )
    return encoded


def _encode_number(value: Any) -> dict[str, Any] | None:
    if isinstance(value, np.generic):  # before float/complex: np.float64 is a float
        return {"scalar": _encode_raw(np.asarray(value))}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": int(value)}
    if isinstance(value, float):
        return {"f": value if math.isfinite(value) else repr(float(value))}
    if isinstance(value, complex):
        return {"c": [encode_attr(value.real)["f"], encode_attr(value.imag)["f"]]}
    return None


def _encode_plain(value: Any) -> dict[str, Any] | None:
    if value is None:
        return {"none": None}
    if isinstance(value, str):
        return {"s": str(value)}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, _dtypes.DType):
        return {"dtype": value.name}
    if isinstance(value, TensorShape):
        dims = value.dims
        return {"shape": None if dims is None else list(dims)}
    if isinstance(value, np.dtype):
        _check_plain_dtype(value)
        return {"np_dtype": value.str}
    return None


def _encode_structure(value: Any, depth: int) -> dict[str, Any] | None:
    if isinstance(value, np.ndarray):
        return _encode_array(value, depth)
    if isinstance(value, list):
        return {"list": [encode_attr(v, depth + 1) for v in value]}
    if isinstance(value, tuple):
        return {"tuple": [encode_attr(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {
            "dict": [
                [encode_attr(k, depth + 1), encode_attr(v, depth + 1)] for k, v in value.items()
            ]
        }
    if callable(value):
        return {"func": _callable_reference(value)}
    return None


def _check_plain_dtype(dtype: np.dtype[Any]) -> None:
    if dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        raise TypeError(
            f"numpy dtype {dtype!r} cannot be serialized "
            f"(structured and object dtypes are not supported)"
        )


def _encode_raw(array: np.ndarray) -> dict[str, Any]:
    _check_plain_dtype(array.dtype)
    data = np.ascontiguousarray(array).tobytes()
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }


def _encode_array(array: np.ndarray, depth: int) -> dict[str, Any]:
    if array.dtype.hasobject and array.dtype.fields is None:
        items = [encode_attr(v, depth + 1) for v in array.reshape(-1).tolist()]
        return {"objects": {"shape": list(array.shape), "items": items}}
    return {"array": _encode_raw(array)}


def _callable_reference(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ValueError(
            f"callable {func!r} has no importable reference "
            f"(no __module__/__qualname__); use a module-level function"
        )
    ref = f"{module}:{qualname}"
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(
            f"callable {ref!r} is a lambda or local function and cannot be "
            f"serialized by reference; define it at module level"
        )
    if module == "__main__":
        # It would resolve here, but "__main__" is another script in any program that
        # loads the graph def: the reference could never load there.
        raise ValueError(
            f"callable {ref!r} is defined in __main__ (the script being run), "
            f"so no other program can import it; move it to an importable "
            f"module"
        )
    try:
        resolved = _resolve_reference(ref)
    except ValueError as exc:
        raise ValueError(f"callable {func!r} cannot be serialized: {exc}") from None
    if resolved is not func:
        raise ValueError(
            f"callable {func!r} cannot be serialized: its reference {ref!r} "
            f"resolves to a different object {resolved!r}"
        )
    return ref


#: While set (by ``asyncflow run``), the modules a callable reference may import:
#: a reference to module ``m`` loads only if ``m`` or a parent package of it is listed.
#: ``None``: any module.
allowed_reference_modules: ContextVar[frozenset[str] | None] = ContextVar(
    "allowed_reference_modules", default=None
)


def reference_module_allowed(module_name: str, allowed: frozenset[str] | None) -> bool:
    """True when ``allowed`` (``None``: everything) lets a reference import ``module_name``."""
    if allowed is None:
        return True
    parts = module_name.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


def _resolve_reference(ref: str) -> Any:
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"malformed callable reference {ref!r} (expected 'module:qualname')")
    if "<" in qualname:
        raise ValueError(
            f"callable reference {ref!r} names a lambda or local function, which cannot be imported"
        )
    if not reference_module_allowed(module_name, allowed_reference_modules.get()):
        raise ValueError(
            f"callable reference {ref!r}: importing module {module_name!r} is not allowed"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raises on import
        raise ValueError(
            f"cannot import module {module_name!r} of callable reference {ref!r}: {exc}"
        ) from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"callable reference {ref!r} does not resolve: no attribute {part!r}"
            ) from None
    if not callable(obj):
        raise ValueError(f"callable reference {ref!r} resolves to a non-callable {obj!r}")
    return obj


# -- decoding -------------------------------------------------------------------


def decode_attr(encoded: Any, _depth: int = 0) -> Any:
    """The attribute value of a tagged JSON form; ``ValueError`` when it is malformed."""
    if _depth > _MAX_DEPTH:
        raise ValueError(f"attribute value nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(encoded, dict) or len(encoded) != 1:
        raise ValueError(
            f"an encoded attribute must be a dict with one type tag, got {_short(encoded)}"
        )
    ((tag, v),) = encoded.items()
    decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        raise ValueError(f"unknown attribute tag {tag!r}")
    return decoder(v, _depth)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _expect(value: Any, kind: type | tuple[type, ...], tag: str) -> Any:
    # bool is an int subclass; an int slot must not accept it (and vice versa).
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ValueError(f"attribute tag {tag!r} needs {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"attribute tag {tag!r} needs {_kind_name(kind)}, got {_short(value)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _decode_float(v: Any, depth: int = 0) -> float:
    if isinstance(v, str):
        if v not in ("nan", "inf", "-inf"):
            raise ValueError(f"attribute tag 'f' needs a number or 'nan'/'inf'/'-inf', got {v!r}")
        return float(v)
    try:
        return float(_expect(v, (int, float), "f"))
    except OverflowError:
        raise ValueError(f"attribute tag 'f': {_short(v)} is out of float range") from None


def _decode_complex(v: Any, depth: int) -> complex:
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError(f"attribute tag 'c' needs [real, imag], got {_short(v)}")
    return complex(_decode_float(v[0]), _decode_float(v[1]))


def _decode_b64(v: Any, tag: str) -> bytes:
    _expect(v, str, tag)
    try:
        return base64.b64decode(v.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"attribute tag {tag!r}: invalid base64 data ({exc})") from None


def _decode_shape_dims(v: Any, tag: str) -> tuple[int, ...]:
    _expect(v, list, tag)
    for d in v:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(
                f"attribute tag {tag!r}: dimensions must be ints >= 0, got {_short(v)}"
            )
    return tuple(v)


def _decode_np_dtype(v: Any, tag: str) -> np.dtype[Any]:
    _expect(v, str, tag)
    try:
        dtype: np.dtype[Any] = np.dtype(v)
    except Exception:  # numpy raises TypeError or ValueError for bad dtype strings
        raise ValueError(f"attribute tag {tag!r}: unknown numpy dtype {v!r}") from None
    if dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        raise ValueError(f"attribute tag {tag!r}: unsupported numpy dtype {v!r}")
    return dtype


def _decode_raw(v: Any, tag: str) -> np.ndarray:
    if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data"}:
        raise ValueError(
            f"attribute tag {tag!r} needs a dict with keys dtype, shape, data, got {_short(v)}"
        )
    dtype = _decode_np_dtype(v["dtype"], tag)
    dims = _decode_shape_dims(v["shape"], tag)
    raw = _decode_b64(v["data"], tag)
    # Check the byte count with Python ints before numpy allocates anything.
    expected = math.prod(dims) * dtype.itemsize
    if expected != len(raw):
        raise ValueError(
            f"attribute tag {tag!r}: {len(raw)} bytes of data do not match "
            f"dtype {dtype.str} and shape {list(dims)} ({expected} bytes)"
        )
    try:
        array = np.frombuffer(raw, dtype=dtype).reshape(dims).copy()
    except Exception as exc:  # e.g. dimensions beyond numpy's limits
        raise ValueError(f"attribute tag {tag!r}: cannot build the array ({exc})") from None
    array.flags.writeable = False
    return array


def _decode_objects(v: Any, depth: int) -> np.ndarray:
    if not isinstance(v, dict) or set(v) != {"shape", "items"}:
        raise ValueError(
            f"attribute tag 'objects' needs a dict with keys shape, items, got {_short(v)}"
        )
    dims = _decode_shape_dims(v["shape"], "objects")
    items = _expect(v["items"], list, "objects")
    if math.prod(dims) != len(items):
        raise ValueError(
            f"attribute tag 'objects': {len(items)} items do not fill shape {list(dims)}"
        )
    decoded = [decode_attr(item, depth + 1) for item in items]
    try:
        array = np.empty(len(decoded), dtype=object)
        array[:] = decoded
        array = array.reshape(dims)
    except Exception as exc:
        raise ValueError(f"attribute tag 'objects': cannot build the array ({exc})") from None
    array.flags.writeable = False
    return array


def _decode_scalar(v: Any, depth: int) -> np.generic:
    array = _decode_raw(v, "scalar")
    if array.ndim != 0:
        raise ValueError(f"attribute tag 'scalar' needs shape [], got {list(array.shape)}")
    scalar: np.generic = array.reshape(-1)[0]  # a numpy scalar of the array's dtype
    return scalar


def _decode_dtype(v: Any, depth: int) -> _dtypes.DType:
    _expect(v, str, "dtype")
    try:
        return _dtypes.as_dtype(v)
    except TypeError:
        raise ValueError(f"attribute tag 'dtype': unknown dtype {v!r}") from None


def _decode_shape(v: Any, depth: int) -> TensorShape:
    if v is None:
        return TensorShape(None)
    _expect(v, list, "shape")
    for d in v:
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
            raise ValueError(
                f"attribute tag 'shape': dimensions must be ints >= 0 or null, got {_short(v)}"
            )
    return TensorShape(v)


def _decode_dict(v: Any, depth: int) -> dict[Any, Any]:
    _expect(v, list, "dict")
    out: dict[Any, Any] = {}
    for pair in v:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"attribute tag 'dict' needs [key, value] pairs, got {_short(pair)}")
        key = decode_attr(pair[0], depth + 1)
        try:
            out[key] = decode_attr(pair[1], depth + 1)
        except TypeError:
            raise ValueError(f"attribute tag 'dict': unhashable key {_short(key)}") from None
    return out


def _decode_none(v: Any, depth: int) -> None:
    if v is not None:
        raise ValueError(f"attribute tag 'none' needs null, got {_short(v)}")


def _decode_func(v: Any, depth: int) -> Any:
    return _resolve_reference(_expect(v, str, "func"))


_DECODERS: dict[str, Callable[[Any, int], Any]] = {
    "none": _decode_none,
    "b": lambda v, d: _expect(v, bool, "b"),
    "i": lambda v, d: _expect(v, int, "i"),
    "f": _decode_float,
    "c": _decode_complex,
    "s": lambda v, d: _expect(v, str, "s"),
    "bytes": lambda v, d: _decode_b64(v, "bytes"),
    "list": lambda v, d: [decode_attr(x, d + 1) for x in _expect(v, list, "list")],
    "tuple": lambda v, d: tuple(decode_attr(x, d + 1) for x in _expect(v, list, "tuple")),
    "dict": _decode_dict,
    "dtype": _decode_dtype,
    "np_dtype": lambda v, d: _decode_np_dtype(v, "np_dtype"),
    "shape": _decode_shape,
    "array": lambda v, d: _decode_raw(v, "array"),
    "objects": _decode_objects,
    "scalar": _decode_scalar,
    "func": _decode_func,
}


# -- import ---------------------------------------------------------------------


class _Node:
    """One validated node of a graph def, ready to be created."""

    __slots__ = ("attrs", "controls", "device", "full_name", "inputs", "name", "op_type")

    def __init__(
        self,
        name: str,
        full_name: str,
        op_type: str,
        inputs: list[tuple[str, int]],
        controls: list[str],
        device: str,
        attrs: dict[str, Any],
    ) -> None:
        self.name = name
        self.full_name = full_name
        self.op_type = op_type
        self.inputs = inputs  # (producer name in the graph def, output index)
        self.controls = controls  # producer names in the graph def
        self.device = device
        self.attrs = attrs


def import_graph_def(
    graph_def: Mapping[str, Any],
    input_map: Mapping[str, Any] | None = None,
    return_elements: Sequence[str] | None = None,
    name: str | None = "",
    *,
    graph: Graph | None = None,
) -> list[Tensor | Operation] | None:
    """Import the ops of ``graph_def`` into the default graph (or ``graph``).

    ``name`` prefixes every imported op name with ``"name/"`` (``""`` or ``None``:
    no prefix); imported names are otherwise exactly those of the graph def, and a
    name already used in the target graph is a ``ValueError`` naming it.
    ``input_map`` maps graph-def tensor names (``"x:0"``; ``"^x"`` for a control
    input) to Tensors (Operations) of the target graph used in their place.
    ``return_elements`` lists graph-def names to return: ``"x:0"`` gives the
    imported Tensor, ``"x"`` the imported Operation.  Returns ``None`` without it.

    Malformed graph defs (not a dict, missing fields, unknown op types, bad inputs,
    cycles, duplicate names, undecodable attributes, unresolvable ``py_func``
    references) are a ``ValueError`` naming the node; a finalized graph is a
    ``RuntimeError``.  Resolving a ``py_func`` reference imports its module, so
    import only graph defs you trust (as with pickle).
    """

    if graph is None:
        graph = get_default_graph()
    if graph.finalized:
        raise RuntimeError(f"cannot import a graph def: graph {graph!r} is finalized")
    prefix = _prefix(name)
    node_list = _node_list(graph_def)
    library = _parse_library(graph_def.get("library"), graph)
    nodes = _parse_nodes(node_list, prefix, {**graph._functions, **library})
    mapped = _parse_input_map(input_map, graph)
    _check_inputs(nodes, mapped)
    back = _back_edges(nodes, mapped)
    order = _topological_order(nodes, mapped, back)
    _check_names_free(nodes, graph)
    with graph._all_or_nothing():  # a node failing late leaves no op behind (as TF)
        for f in library.values():
            _function.add_to_library(graph, f)
        created = _create_ops(graph, nodes, order, mapped, back)
        if return_elements is None:
            return None
        return _return_elements(return_elements, nodes, created)


def _prefix(name: str | None) -> str:
    if name is None or name == "":
        return ""
    if not isinstance(name, str):
        raise TypeError(f"import_graph_def: name must be a string, got {type(name).__name__}")
    name = name.rstrip("/")
    if not name or ":" in name or name.startswith("^") or name.startswith("/"):
        raise ValueError(f"import_graph_def: {name!r} is not a valid name prefix")
    return name + "/"


def _node_list(graph_def: Any) -> list[Any]:
    if not isinstance(graph_def, Mapping):
        raise ValueError(f"a graph def must be a dict, got {type(graph_def).__name__}")
    versions = graph_def.get("versions")
    if versions is not None:
        if not isinstance(versions, Mapping):
            raise ValueError(f"graph def 'versions' must be a dict, got {_short(versions)}")
        fmt = versions.get("format", FORMAT)
        if fmt not in _READABLE_FORMATS:
            raise ValueError(
                f"unsupported graph def format {_short(fmt)} "
                f"(this version of asyncflow reads {FORMAT!r} and "
                f"{_PARTITION_FORMAT!r})"
            )
    if "node" not in graph_def:
        raise ValueError("graph def has no 'node' field")
    node_list = graph_def["node"]
    if not isinstance(node_list, list):
        raise ValueError(f"graph def 'node' must be a list, got {type(node_list).__name__}")
    return node_list


def _parse_library(raw: Any, graph: Graph) -> dict[str, _function.FunctionDef]:
    """The functions of a graph def's ``"library"`` not yet in ``graph``'s, rebuilt
    (each body imported into its own function graph), callees first."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function", []), list):
        raise ValueError(
            f"graph def 'library' must be a dict with a 'function' list, got {_short(raw)}"
        )
    out: dict[str, _function.FunctionDef] = {}
    for i, entry in enumerate(raw.get("function", [])):
        try:
            sig = entry["signature"]
            name = sig["name"]
            args = [a["name"] for a in sig["input_arg"]]
            out_names = [a["name"] for a in sig["output_arg"]]
            num_declared = entry["num_declared"]
            rets, body_def = entry["ret"], entry["body"]
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"graph def library function #{i} is malformed: missing or bad field {exc}"
            ) from None
        if not isinstance(name, str) or not name:
            raise ValueError(f"graph def library function #{i} has no valid name")
        if name in graph._functions or name in out:
            continue
        body = _function.FuncGraph(name, None)
        try:
            import_graph_def(body_def, graph=body)
            ret_tensors = [body.get_tensor_by_name(r) for r in rets]
            for a in args:
                body.get_operation_by_name(a)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"graph def library function {name!r}: {exc}") from None
        out[name] = _function.FunctionDef(name, body, args, num_declared, ret_tensors, out_names)
    return out


def _parse_nodes(
    node_list: list[Any], prefix: str, functions: Mapping[str, Any] | None = None
) -> dict[str, _Node]:
    nodes: dict[str, _Node] = {}
    seen_lower: dict[str, str] = {}
    for i, raw in enumerate(node_list):
        node = _parse_node(i, raw, prefix, functions or {})
        # Graph names are unique case-insensitively (the uniquifier folds case).
        other = seen_lower.get(node.name.lower())
        if other is not None:
            raise ValueError(
                f"graph def has a duplicate node name {node.name!r} "
                f"(node #{i}; clashes with {other!r})"
            )
        seen_lower[node.name.lower()] = node.name
        nodes[node.name] = node
    return nodes


def _node_name(i: int, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"graph def node #{i} has no valid 'name' (got {_short(name)})")
    if ":" in name or name.startswith("^") or name.startswith("/"):
        raise ValueError(
            f"graph def node #{i}: {name!r} is not a valid op name (no ':', no leading '^' or '/')"
        )
    return name


def _parse_node(i: int, raw: Any, prefix: str, functions: Mapping[str, Any]) -> _Node:
    if not isinstance(raw, Mapping):
        raise ValueError(f"graph def node #{i} must be a dict, got {_short(raw)}")
    name = _node_name(i, raw.get("name"))
    where = f"graph def node {name!r}"
    extra = set(raw) - {"name", "op", "input", "device", "attr"}
    if extra:
        raise ValueError(f"{where} has unknown fields {sorted(map(str, extra))}")
    op_type = raw.get("op")
    if not isinstance(op_type, str):
        raise ValueError(f"{where} has no valid 'op' field (got {_short(op_type)})")
    try:
        if op_type not in functions:
            registry.get_op_def(op_type)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    device = raw.get("device", "")
    if not isinstance(device, str):
        raise ValueError(f"{where}: 'device' must be a string, got {_short(device)}")
    raw_inputs = raw.get("input", [])
    if not isinstance(raw_inputs, list):
        raise ValueError(f"{where}: 'input' must be a list, got {_short(raw_inputs)}")
    inputs, controls = _parse_inputs(raw_inputs, where)
    attrs = _parse_attrs(raw.get("attr", {}), where)
    return _Node(name, prefix + name, op_type, inputs, controls, device, attrs)


def _parse_attrs(raw_attrs: Any, where: str) -> dict[str, Any]:
    """A node's decoded attributes; a bad dtype attribute is an InvalidArgumentError."""
    if not isinstance(raw_attrs, Mapping):
        raise ValueError(f"{where}: 'attr' must be a dict, got {_short(raw_attrs)}")
    attrs: dict[str, Any] = {}
    for key, encoded in raw_attrs.items():
        if not isinstance(key, str):
            raise ValueError(f"{where}: attr names must be strings, got {key!r}")
        try:
            attrs[key] = decode_attr(encoded)
        except ValueError as exc:
            if key in _DTYPE_ATTRS:
                raise errors.InvalidArgumentError(
                    None, None, f"{where}, attr {key!r}: {exc}"
                ) from None
            raise ValueError(f"{where}, attr {key!r}: {exc}") from None
        if key in _DTYPE_ATTRS:
            _check_dtype_attr(where, key, attrs[key])
    return attrs


# Attributes that hold a dtype (or a list of dtypes) by TF's naming conventions.
_DTYPE_ATTRS = frozenset(
    {
        "dtype",
        "T",
        "DstT",
        "SrcT",
        "Tout",
        "Tin",
        "Tidx",
        "Tindices",
        "Tparams",
        "Tshape",
        "Tpaddings",
        "Tmultiples",
        "Tperm",
        "Taxis",
        "Index",
        "out_type",
        "output_type",
        "component_types",
    }
)


def _check_dtype_attr(where: str, key: str, value: Any) -> None:
    """``InvalidArgumentError`` naming node and attr when a dtype attr holds no dtype
    (TF: "... is not a valid DataType")."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        if not isinstance(item, _dtypes.DType):
            raise errors.InvalidArgumentError(
                None, None, f"{where}, attr {key!r}: {_short(item)} is not a valid dtype"
            )


def _parse_inputs(raw_inputs: list[Any], where: str) -> tuple[list[tuple[str, int]], list[str]]:
    inputs: list[tuple[str, int]] = []
    controls: list[str] = []
    for s in raw_inputs:
        if not isinstance(s, str) or not s:
            raise ValueError(f"{where}: an input must be a non-empty string, got {_short(s)}")
        if s.startswith("^"):
            controls.append(s[1:])
            continue
        if controls:
            raise ValueError(f"{where}: data input {s!r} comes after a control input")
        producer, sep, index = s.rpartition(":")
        if not sep:
            inputs.append((s, 0))
        elif index.isdigit() and index.isascii() and producer:
            inputs.append((producer, int(index)))
        else:
            raise ValueError(f"{where}: malformed input {s!r} (expected 'op', 'op:N' or '^op')")
    return inputs, controls


def _parse_input_map(
    input_map: Mapping[str, Any] | None, graph: Graph
) -> dict[tuple[str, int], Any]:

    mapped: dict[tuple[str, int], Any] = {}
    if not input_map:
        return mapped
    if not isinstance(input_map, Mapping):
        raise TypeError(f"input_map must be a dict, got {type(input_map).__name__}")
    for key, value in input_map.items():
        if not isinstance(key, str):
            raise TypeError(f"input_map keys must be tensor names, got {key!r}")
        if key.startswith("^"):
            op = value.op if isinstance(value, Tensor) else value
            if not isinstance(op, Operation) or op.graph is not graph:
                raise ValueError(
                    f"input_map[{key!r}] must be an Operation of the target graph, got {value!r}"
                )
            mapped[(key[1:], -1)] = op
            continue
        producer, sep, index = key.rpartition(":")
        if not sep:
            producer, index = key, "0"
        if not producer or not index.isdigit():
            raise ValueError(f"input_map key {key!r} is not a tensor name")
        if not isinstance(value, Tensor) or value.graph is not graph:
            raise ValueError(
                f"input_map[{key!r}] must be a Tensor of the target graph, got {value!r}"
            )
        mapped[(producer, int(index))] = value
    return mapped


def _check_inputs(nodes: dict[str, _Node], mapped: dict[tuple[str, int], Any]) -> None:
    for node in nodes.values():
        for producer, index in node.inputs:
            if (producer, index) in mapped:
                continue
            if producer not in nodes:
                raise ValueError(
                    f"graph def node {node.name!r} has input "
                    f"'{producer}:{index}' from a node {producer!r} that is "
                    f"not in the graph def"
                )
        for producer in node.controls:
            if (producer, -1) not in mapped and producer not in nodes:
                raise ValueError(
                    f"graph def node {node.name!r} has control input "
                    f"'^{producer}' from a node that is not in the graph def"
                )


def _back_edges(
    nodes: dict[str, _Node], mapped: dict[tuple[str, int], Any]
) -> dict[str, tuple[int, ...]]:
    """Merge node → positions of its inputs that are a loop's back edge.

    As TensorFlow's importer: an edge ``NextIteration → Merge`` closes a
    ``while_loop`` and is the only edge allowed to close a cycle.  The Merge is
    created before its NextIteration (with its entry value in place of the back
    edge) and rewired once the NextIteration exists.
    """
    back: dict[str, tuple[int, ...]] = {}
    for node in nodes.values():
        if node.op_type != "Merge":
            continue
        positions = tuple(
            k
            for k, (p, i) in enumerate(node.inputs)
            if (p, i) not in mapped and nodes[p].op_type == "NextIteration"
        )
        if not positions:
            continue
        if len(positions) == len(node.inputs):
            raise ValueError(
                f"graph def node {node.name!r} (Merge) has only NextIteration "
                f"inputs; a loop's Merge also needs the value entering the "
                f"loop"
            )
        back[node.name] = positions
    return back


def _dependencies(
    node: _Node, mapped: dict[tuple[str, int], Any], back: dict[str, tuple[int, ...]]
) -> set[str]:
    skip = back.get(node.name, ())
    deps = {p for k, (p, i) in enumerate(node.inputs) if (p, i) not in mapped and k not in skip}
    deps.update(p for p in node.controls if (p, -1) not in mapped)
    return deps


def _topological_order(
    nodes: dict[str, _Node], mapped: dict[tuple[str, int], Any], back: dict[str, tuple[int, ...]]
) -> list[_Node]:
    """Kahn's algorithm without the back edges, stable in graph-def order (of the
    ready nodes, the earliest in the graph def goes first, so a graph def written in
    creation order imports in that order and exports again unchanged);
    ``ValueError`` naming a cycle (one that no back edge closes)."""
    position = {name: k for k, name in enumerate(nodes)}
    pending: dict[str, int] = {}
    consumers: dict[str, list[str]] = {name: [] for name in nodes}
    for node in nodes.values():
        deps = _dependencies(node, mapped, back)
        pending[node.name] = len(deps)
        for d in deps:
            consumers[d].append(node.name)
    ready = [position[name] for name, n in pending.items() if n == 0]
    names = list(nodes)
    order: list[_Node] = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(nodes[name])
        for c in consumers[name]:
            pending[c] -= 1
            if pending[c] == 0:
                heapq.heappush(ready, position[c])
    if len(order) != len(nodes):
        cycle = _find_cycle({n for n, k in pending.items() if k > 0}, nodes, mapped, back)
        shown = " -> ".join(repr(n) for n in cycle[:10]) + (" -> ..." if len(cycle) > 10 else "")
        raise ValueError(
            f"graph def has a cycle through node {cycle[0]!r}: {shown} "
            f"(a cycle is allowed only through a NextIteration -> Merge edge)"
        )
    return order


def _find_cycle(
    stuck: set[str],
    nodes: dict[str, _Node],
    mapped: dict[tuple[str, int], Any],
    back: dict[str, tuple[int, ...]],
) -> list[str]:
    # Every stuck node waits on at least one stuck node, so walking "some stuck
    # dependency" from any stuck node must revisit a node: that loop is a cycle.
    start = min(stuck)
    path: list[str] = []
    position: dict[str, int] = {}
    current = start
    while current not in position:
        position[current] = len(path)
        path.append(current)
        current = min(d for d in _dependencies(nodes[current], mapped, back) if d in stuck)
    cycle = path[position[current] :]
    cycle.reverse()  # producer -> consumer order
    first = cycle.index(min(cycle))  # a stable start, whatever the walk's entry point
    cycle = cycle[first:] + cycle[:first]
    return [*cycle, cycle[0]]


def _check_names_free(nodes: dict[str, _Node], graph: Graph) -> None:
    # Graph.create_op would silently uniquify a clashing name ("x" -> "x_1"); an
    # import must keep names exactly, so a clash is an error before any op is added.
    in_use = graph._names_in_use
    for node in nodes.values():
        if node.full_name.lower() in in_use:
            raise ValueError(
                f"cannot import node {node.full_name!r}: the name is already "
                f"used in graph {graph!r} (pass name=... to import under a "
                f"prefix)"
            )


def _create_ops(
    graph: Graph,
    nodes: dict[str, _Node],
    order: list[_Node],
    mapped: dict[tuple[str, int], Any],
    back: dict[str, tuple[int, ...]],
) -> dict[str, Operation]:
    created: dict[str, Operation] = {}
    # NextIteration name -> (Merge op, input position, output index) still to close.
    open_edges: dict[str, list[tuple[Operation, int, int]]] = {}
    with graph.as_default(), graph.name_scope(None), graph.control_dependencies(None):
        for node in order:
            # Back edges whose NextIteration exists already (no cycle needed it) are
            # plain inputs.
            skip = [k for k in back.get(node.name, ()) if node.inputs[k][0] not in created]
            if skip:
                # The value entering the loop stands in for the back edge until the
                # NextIteration exists (as while_loop builds Merge([enter, enter])).
                entry = next(
                    _resolve_input(node, p, i, created, mapped)
                    for k, (p, i) in enumerate(node.inputs)
                    if k not in skip
                )
            inputs = [
                entry if k in skip else _resolve_input(node, p, i, created, mapped)
                for k, (p, i) in enumerate(node.inputs)
            ]
            controls = [mapped[(p, -1)] if (p, -1) in mapped else created[p] for p in node.controls]
            with graph.device(node.device):
                try:
                    op = graph.create_op(
                        node.op_type,
                        inputs,
                        node.attrs,
                        name=node.full_name,
                        control_inputs=controls,
                    )
                except (TypeError, ValueError, RuntimeError):
                    raise
                except Exception as exc:  # a shape function tripping on bad attrs
                    raise ValueError(
                        f"cannot import graph def node {node.name!r} "
                        f"(op {node.op_type}): {type(exc).__name__}: {exc}"
                    ) from exc
            if op.name != node.full_name:  # another thread took the name meanwhile
                raise ValueError(
                    f"cannot import node {node.full_name!r}: the name was "
                    f"taken during the import (the op became {op.name!r})"
                )
            created[node.name] = op
            for k in skip:
                producer, index = node.inputs[k]
                open_edges.setdefault(producer, []).append((op, k, index))
            for merge, k, index in open_edges.pop(node.name, ()):
                _close_back_edge(graph, merge, k, op, index)
    return created


def _close_back_edge(
    graph: Graph, merge: Operation, position: int, producer: Operation, index: int
) -> None:
    """Rewire input ``position`` of loop Merge ``merge`` to its NextIteration."""
    if index >= len(producer.outputs):
        raise ValueError(
            f"graph def node {merge.name!r} has input "
            f"'{producer.name}:{index}' but node {producer.name!r} has only "
            f"{len(producer.outputs)} output(s)"
        )
    t = producer.outputs[index]
    out = merge.outputs[0]
    if t.dtype is not out.dtype:
        raise TypeError(
            f"graph def node {merge.name!r} (Merge) has inputs of different "
            f"dtypes: {out.dtype.name} entering the loop and {t.dtype.name} "
            f"from {producer.name!r}"
        )
    if not out.shape.is_compatible_with(t.shape):
        raise ValueError(
            f"graph def node {merge.name!r} (Merge) has shape {out.shape} but "
            f"its back edge from {producer.name!r} has shape {t.shape}"
        )
    graph._update_input(merge, position, t)


def _resolve_input(
    node: _Node,
    producer: str,
    index: int,
    created: dict[str, Operation],
    mapped: dict[tuple[str, int], Any],
) -> Tensor:
    tensor = mapped.get((producer, index))
    if tensor is not None:
        return tensor  # type: ignore[no-any-return]
    outputs = created[producer].outputs
    if index >= len(outputs):
        raise ValueError(
            f"graph def node {node.name!r} has input '{producer}:{index}' "
            f"but node {producer!r} has only {len(outputs)} output(s)"
        )
    return outputs[index]


def _return_elements(
    names: Sequence[str], nodes: dict[str, _Node], created: dict[str, Operation]
) -> list[Tensor | Operation]:
    if isinstance(names, str):
        raise TypeError("return_elements must be a list of names, not a string")
    out: list[Tensor | Operation] = []
    for element in names:
        if not isinstance(element, str):
            raise TypeError(f"return_elements must be names, got {element!r}")
        op_name, sep, index = element.rpartition(":")
        if not sep:
            op_name = element
        op = created.get(op_name)
        if op is None:
            raise ValueError(f"return element {element!r} is not in the graph def")
        if not sep:
            out.append(op)
        elif not index.isdigit() or int(index) >= len(op.outputs):
            raise ValueError(
                f"return element {element!r} is not an output of node "
                f"{op_name!r} ({len(op.outputs)} outputs)"
            )
        else:
            out.append(op.outputs[int(index)])
    return out


_graph._graph_def_writer[0] = graph_to_graph_def
