"""The compiler's value IR: plain, immutable, picklable node definitions.

Every compile pass (prune → place → optimize → control-flow lowering → partition →
plan) is a pure function from these values to these values.  A :class:`NodeDef` is
what TensorFlow's ``NodeDef`` is: an op type, a name, its inputs by name, control
inputs by name, a device, attributes, plus the static facts the passes and the
kernel factories need (output dtypes and shapes, input dtypes and shapes,
statefulness, where in user code the op was created).  There is no ``Graph``,
``Operation``, lock, kernel or session object inside, so a compiled partition can
be pickled, printed, cached, shipped to another process and turned back into a
graph def.

A ``NodeDef`` also answers the read-only questions a kernel factory asks of an op
(``name``, ``type``, ``_attrs``, ``get_attr``, ``node_attrs()``, ``_inputs`` /
``_outputs`` with ``_dtype`` and ``_shape``), so kernels are instantiated from the IR
(:mod:`asyncflow.runtime.bind`) exactly as they would be from a graph op.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from asyncflow.framework.graph import Tensor

if TYPE_CHECKING:
    from asyncflow.dtypes import DType
    from asyncflow.framework.graph import Graph, Operation
    from asyncflow.framework.shapes import TensorShape

__all__ = [
    "FUNCTION_ATTR",
    "FunctionIR",
    "GraphIR",
    "NodeDef",
    "Ref",
    "ValueInfo",
    "format_ref",
    "function_ir",
    "graph_ir",
    "node_def_of",
    "parse_ref",
    "ref_of",
]

#: The attribute of a function call node that holds the function's :class:`FunctionIR`
#: (so a call node is self-contained: inlining and the call kernel need nothing else).
FUNCTION_ATTR = "_function"

#: A tensor reference: (producing node's name, output index).
Ref = tuple[str, int]

_NO_ATTRS: Mapping[str, Any] = {}  # shared default: attrs are never mutated

#: The ops a back edge starts from (their consumer, a Merge, is made before them).
_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})


class ValueInfo(NamedTuple):
    """The static dtype and shape of one tensor, and its value when it is a constant
    known at compile time (a ``Const`` without control inputs): kernel factories may
    specialise on it, as on a graph tensor whose op is a ``Const``."""

    dtype: DType
    shape: TensorShape
    value: Any = None

    # The names kernel factories use on graph tensors.
    @property
    def _dtype(self) -> DType:
        return self.dtype

    @property
    def _shape(self) -> TensorShape:
        return self.shape


class NodeDef(NamedTuple):
    """One node of the IR: the requested ``device``, ``attrs`` never mutated (passes
    make new nodes).  A named tuple: immutable, cheap to make (a 100,000-node graph
    is converted on its first compile) and picklable."""

    name: str
    op: str
    inputs: tuple[Ref, ...] = ()
    control_inputs: tuple[str, ...] = ()
    device: str = ""
    attrs: Mapping[str, Any] = _NO_ATTRS
    outputs: tuple[ValueInfo, ...] = ()
    input_types: tuple[ValueInfo, ...] = ()
    stateful: bool = False
    traceback: str = "<unknown>"

    # -- what kernel factories read (the Operation protocol, read-only) ---------------

    @property
    def type(self) -> str:
        return self.op

    @property
    def _name(self) -> str:
        return self.name

    @property
    def _type(self) -> str:
        return self.op

    @property
    def _attrs(self) -> Mapping[str, Any]:
        return self.attrs

    @property
    def _device(self) -> str:
        return self.device

    @property
    def _inputs(self) -> tuple[ValueInfo, ...]:
        return self.input_types

    @property
    def _outputs(self) -> tuple[ValueInfo, ...]:
        return self.outputs

    def get_attr(self, name: str) -> Any:
        """The value of attribute ``name``; ``ValueError`` naming the node if absent."""
        try:
            return self.attrs[name]
        except KeyError:
            raise ValueError(
                f"node {self.name!r} (type {self.op}) has no attr named {name!r}"
            ) from None

    def node_attrs(self) -> dict[str, Any]:
        """The attributes a kernel receives (those not starting with ``_``)."""
        return {k: v for k, v in self.attrs.items() if not k.startswith("_")}

    def __repr__(self) -> str:
        ins = [format_ref(r) for r in self.inputs] + [f"^{c}" for c in self.control_inputs]
        where = f" @{self.device}" if self.device else ""
        return f"<NodeDef {self.name!r} = {self.op}({', '.join(ins)}){where}>"


@dataclass(frozen=True, slots=True, eq=False)
class GraphIR:
    """A graph as IR: nodes in a topological order (creation order), and a name index."""

    nodes: tuple[NodeDef, ...]
    by_name: Mapping[str, NodeDef]
    _positions: dict[str, int] = field(default_factory=dict, repr=False)
    #: False when no node can be a function call (the graph has no function library):
    #: the optimizer then skips looking for calls to inline.
    calls: bool = True
    #: False when no node requests a device or colocation: every node is then placed
    #: on the default device without resolving anything.
    requests: bool = True
    #: False when no node has an input made after it (a while loop's back edge into
    #: its Merge, from a NextIteration): ``nodes`` in reverse is then an order in
    #: which every node comes before its inputs.
    back_edges: bool = True

    @property
    def position(self) -> Mapping[str, int]:
        """Node name -> index in ``nodes`` (made on first use: only pruning a small
        part of a large graph asks)."""
        positions = self._positions
        if not positions and self.nodes:
            positions.update({n.name: k for k, n in enumerate(self.nodes)})
        return positions

    @staticmethod
    def of(
        nodes: Iterable[NodeDef], calls: bool = True, requests: bool = True, back_edges: bool = True
    ) -> GraphIR:
        """Index ``nodes`` (already in topological order)."""
        nodes = tuple(nodes)
        return GraphIR(
            nodes, {n.name: n for n in nodes}, calls=calls, requests=requests, back_edges=back_edges
        )


@dataclass(frozen=True, slots=True, eq=False)
class FunctionIR:
    """A function of the library as IR: its body's nodes (topological order), the
    names of its argument nodes (declared, then captured) and the returned refs."""

    name: str
    nodes: tuple[NodeDef, ...]
    args: tuple[str, ...]
    rets: tuple[Ref, ...]

    def __repr__(self) -> str:
        return f"<FunctionIR {self.name!r} nodes={len(self.nodes)} args={len(self.args)}>"


def function_ir(fdef: Any) -> FunctionIR:
    """The IR of a library function (a ``framework.function.FunctionDef``), made once."""
    fir: FunctionIR | None = fdef._ir
    if fir is None:
        fir = fdef._ir = FunctionIR(
            fdef.name,
            graph_ir(fdef.body).nodes,
            tuple(fdef.args),
            tuple(ref_of(t) for t in fdef.rets),
        )
    return fir


def format_ref(ref: Ref) -> str:
    """``"name"`` for output 0, ``"name:k"`` otherwise (TensorFlow's input strings)."""
    return ref[0] if ref[1] == 0 else f"{ref[0]}:{ref[1]}"


def parse_ref(s: str) -> Ref:
    """The inverse of :func:`format_ref` (accepts ``"name:0"`` too)."""
    name, sep, index = s.rpartition(":")
    if sep and index.isdigit():
        return name, int(index)
    return s, 0


def ref_of(t: Tensor) -> Ref:
    """The IR reference of a graph tensor."""
    return t._op._name, t._value_index


#: "file:line" strings by file and line: every op made on one line of user code
#: shares one string (a loop building 100,000 ops has one creation site).
_SITES: dict[str, dict[int, str]] = {}


def _site(file: str, line: int) -> str:
    lines = _SITES.get(file)
    if lines is None:
        lines = _SITES[file] = {}
    site = lines.get(line)
    if site is None:
        site = lines[line] = f"{file}:{line}"
    return site


# NodeDef / ValueInfo from a ready tuple of all fields, without the named tuple's
# Python-level __new__ (one call less per node on a first compile).
_new_node: Any = functools.partial(tuple.__new__, NodeDef)
_new_info: Any = functools.partial(tuple.__new__, ValueInfo)

#: The ValueInfos made by one graph_ir call, by (dtype, id of shape object): tensors
#: of one dtype and one shape object share one (shapes are immutable and alive for
#: the whole call, held by the graph's tensors).
_Infos = dict[tuple[Any, int], ValueInfo]


def _info(t: Tensor, infos: _Infos | None) -> ValueInfo:
    if infos is None:
        return ValueInfo(t._dtype, t._shape)
    key = (t._dtype, id(t._shape))
    info = infos.get(key)
    if info is None:
        info = infos[key] = _new_info((t._dtype, t._shape, None))
    return info


def node_def_of(op: Operation, infos: _Infos | None = None) -> NodeDef:
    """The IR node of a graph op (cached on the op; ops are immutable once built).

    ``infos``: a cache of ValueInfos shared by the nodes of one conversion.
    """
    node: NodeDef | None = op._ir
    if node is None:
        refs: list[Ref] | tuple[Ref, ...]
        input_types: list[ValueInfo] | tuple[ValueInfo, ...]
        a, b = op._in0, op._in1
        if b is not None and not isinstance(a, tuple):
            # Two inputs (most ops of a large graph), without lists.  A producer is
            # usually converted already: share its ValueInfo.
            pa, ka, pb, kb = a._op, a._value_index, b._op, b._value_index
            refs = ((pa._name, ka), (pb._name, kb))
            ca, cb = pa._ir, pb._ir
            input_types = (
                ca.outputs[ka] if ca is not None else _info(a, infos),
                cb.outputs[kb] if cb is not None else _info(b, infos),
            )
        else:
            refs = []
            input_types = []
            for t in op._inputs:
                producer = t._op
                k = t._value_index
                refs.append((producer._name, k))
                converted = producer._ir
                input_types.append(
                    converted.outputs[k] if converted is not None else _info(t, infos)
                )
        attrs = op._attrs
        functions = op._graph._functions
        if functions and op._type in functions:  # a call: the body travels with it
            attrs = {**attrs, FUNCTION_ATTR: function_ir(functions[op._type])}
        controls = op._control_inputs
        out = op._out
        outputs: tuple[ValueInfo, ...]
        if isinstance(out, tuple):  # none or several
            outputs = tuple([_info(t, infos) for t in out])
        elif op._type == "Const" and not controls:
            outputs = (ValueInfo(out._dtype, out._shape, attrs["value"]),)
        else:
            # Elementwise ops pass their first input's dtype and shape object on:
            # share its ValueInfo (unless it carries a constant's value).
            first = input_types[0] if input_types else None
            if (
                first is not None
                and first.shape is out._shape
                and first.dtype is out._dtype
                and first.value is None
            ):
                outputs = (first,)
            else:
                outputs = (_info(out, infos),)
        lines = _SITES.get(op._file)
        site = lines.get(op._line) if lines is not None else None
        node = op._ir = _new_node(
            (
                op._name,
                op._type,
                tuple(refs),
                tuple([c._name for c in controls]) if controls else (),
                op._device,
                attrs.copy() if attrs else _NO_ATTRS,
                outputs,
                tuple(input_types),
                op._op_def.stateful,
                site if site is not None else _site(op._file, op._line),
            )
        )
    return node


def graph_ir(graph: Graph, ops: Sequence[Operation] | None = None) -> GraphIR:
    """The IR of ``graph`` (or of ``ops``, a topologically ordered subset).

    The common op of a large graph — two tensor inputs whose producers are converted
    already, one output, no control input, not a function call — is converted right
    here, with what it shares with the ops before it (the creation site of the same
    line, a producer's ValueInfo and its outputs tuple) taken from locals;
    :func:`node_def_of` makes every other node (tests/test_build_fast_paths.py
    compares the two).
    """
    infos: _Infos = {}
    functions = graph._functions
    new_node = _new_node
    last_file: str | None = None
    last_line = -1
    site = ""
    requests = False  # some node asks for a device or colocation
    back_edges = False  # some node is a NextIteration (its Merge is made before it)
    nodes: list[NodeDef] = []
    append = nodes.append
    # Shared with the node before when the same: the second input's ref (a chain's
    # operand made once and read by every link) and the pair of input infos (a long
    # run of ops on values of one dtype and shape) -- one tuple less per node each.
    last_b: Any = None
    ref_b: Ref = ("", 0)
    pair: tuple[Any, Any] = (None, None)  # no ValueInfo is None: the first is made
    for op in graph.get_operations() if ops is None else ops:
        node = op._ir
        if node is None:
            b, out = op._in1, op._out
            if (
                b is not None
                and type(out) is Tensor
                and not op._control_inputs
                and not (functions and op._type in functions)
            ):
                a: Tensor = op._in0  # type: ignore[assignment]
                pa, pb = a._op, b._op
                ca, cb = pa._ir, pb._ir
                if ca is not None and cb is not None:
                    ka, kb = a._value_index, b._value_index
                    ia, ib = ca.outputs[ka], cb.outputs[kb]
                    if ia.shape is out._shape and ia.dtype is out._dtype and ia.value is None:
                        # The first input's dtype and shape: its producer's outputs
                        # tuple itself when that is all it has.
                        outputs = ca.outputs if len(ca.outputs) == 1 else (ia,)
                    else:
                        outputs = (_info(out, infos),)
                    file, line = op._file, op._line
                    if file is not last_file or line != last_line:
                        last_file, last_line, site = file, line, _site(file, line)
                    attrs = op._attrs
                    if op._device or (attrs and "_class" in attrs):
                        requests = True
                    if b is not last_b:
                        last_b, ref_b = b, (pb._name, kb)
                    if pair[0] is not ia or pair[1] is not ib:
                        pair = (ia, ib)
                    node = op._ir = new_node(
                        (
                            op._name,
                            op._type,
                            ((pa._name, ka), ref_b),
                            (),
                            op._device,
                            attrs.copy() if attrs else _NO_ATTRS,
                            outputs,
                            pair,
                            op._op_def.stateful,
                            site,
                        )
                    )
                    append(node)
                    continue
            node = node_def_of(op, infos)
        if node.device or "_class" in node.attrs:
            requests = True
        if node.op in _BACK_EDGE_OPS:
            back_edges = True
        append(node)
    return GraphIR.of(nodes, calls=bool(functions), requests=requests, back_edges=back_edges)
