"""``import_tf_graph_def``: run TensorFlow's own ``GraphDef`` protobufs in asyncflow.

The bytes are parsed by ``protobuf`` with the schema of :mod:`asyncflow.compat._tf_proto`;
each ``NodeDef`` becomes an asyncflow op through a *converter* (one per TF op type,
usually the same op type with the attributes renamed or dropped, see ``_CONVERTERS``).
Before anything is added the whole graph def is checked: every unsupported op type is
reported in one ``UnimplementedError`` with counts, and malformed data is an
``InvalidArgumentError`` / ``DataLossError`` naming the node; on error the target graph
keeps only what was added before the failing node (names under the fresh prefix).

v1 loops have a back edge ``NextIteration -> Merge``; the graph is append-only, so a
Merge is created with a stand-in for that input and rewired with
``Graph._update_input`` once the NextIteration exists (as ``af.while_loop`` does).
"""

from __future__ import annotations

import heapq
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncflow import dtypes, errors
from asyncflow.compat._tf_proto import messages
from asyncflow.compat._values import (
    RESOURCE,
    attr_from_proto,
    dtype_from_enum,
    ndarray_from_proto,
)
from asyncflow.framework.constant_eval import constant_value
from asyncflow.framework.graph import Graph, Operation, Tensor, get_default_graph
from asyncflow.framework.shapes import TensorShape, unknown_shape

__all__ = ["import_tf_graph_def", "supported_tf_op_types"]


# -- parsing ----------------------------------------------------------------------------------


def _parse(data: bytes | str | os.PathLike[str]) -> Any:
    m = messages()
    graph_def = m.GraphDef()
    text: str | None = None
    if isinstance(data, str | os.PathLike):
        path = os.fspath(data)
        with open(path, "rb") as f:
            raw = f.read()
        if path.endswith(".pbtxt"):
            text = raw.decode("utf-8", "replace")
    elif isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        raise TypeError(
            f"import_tf_graph_def: data must be bytes or a path, got {type(data).__name__}"
        )
    try:
        if text is not None:
            m.text_format.Parse(text, graph_def)
        else:
            graph_def.ParseFromString(raw)
    except m.DecodeError as exc:
        raise errors.DataLossError(
            None, None, f"cannot parse a TensorFlow GraphDef from {len(raw)} bytes: {exc}"
        ) from None
    except m.text_format.ParseError as exc:
        raise errors.InvalidArgumentError(
            None, None, f"cannot parse the GraphDef text format: {exc}"
        ) from None
    return graph_def


@dataclass(slots=True)
class _Node:
    name: str
    op: str
    device: str
    inputs: list[tuple[str, int]]
    controls: list[str]
    attrs: dict[str, Any]
    proto: Any = field(repr=False)


_INPUT = re.compile(r"^(\^)?([^:^]+)(?::(\d+))?$")


def _nodes(graph_def: Any) -> list[_Node]:
    out: list[_Node] = []
    seen: set[str] = set()
    for i, nd in enumerate(graph_def.node):
        if not nd.name or ":" in nd.name or nd.name.startswith("^"):
            raise errors.InvalidArgumentError(
                None, None, f"GraphDef node #{i} has an invalid name {nd.name!r}"
            )
        if nd.name in seen:
            raise errors.InvalidArgumentError(
                None, None, f"GraphDef has two nodes named {nd.name!r}"
            )
        seen.add(nd.name)
        inputs: list[tuple[str, int]] = []
        controls: list[str] = []
        for s in nd.input:
            m = _INPUT.match(s)
            if m is None:
                raise errors.InvalidArgumentError(
                    None, None, f"node {nd.name!r} has a malformed input {s!r}"
                )
            if m.group(1):
                controls.append(m.group(2))
            else:
                inputs.append((m.group(2), int(m.group(3) or 0)))
        out.append(_Node(nd.name, nd.op, nd.device, inputs, controls, {}, nd))
    for node in out:
        for producer in [p for p, _ in node.inputs] + node.controls:
            if producer not in seen:
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"node {node.name!r} has input {producer!r}, which is not in the GraphDef",
                )
    return out


#: Ops a TensorArray handle passes through (into, around and out of loops): their type
#: attribute may be ``DT_RESOURCE``, read as asyncflow's handle type ``string``.
_HANDLE_CARRIERS = frozenset(
    {"Identity", "IdentityN", "Enter", "Exit", "Switch", "Merge", "NextIteration"}
)


def _decode_attrs(node: _Node) -> None:
    where = f"node {node.name!r} ({node.op}), attr"
    carrier = node.op in _HANDLE_CARRIERS
    for key, value in node.proto.attr.items():
        if (
            carrier
            and key == "T"
            and value.WhichOneof("value") == "type"
            and value.type == RESOURCE
        ):
            node.attrs[key] = dtypes.string
        elif (
            carrier
            and key == "T"
            and value.WhichOneof("value") == "list"
            and RESOURCE in value.list.type
        ):
            node.attrs[key] = [
                dtypes.string if v == RESOURCE else dtype_from_enum(v, f"{where} {key!r}")
                for v in value.list.type
            ]
        else:
            node.attrs[key] = attr_from_proto(value, f"{where} {key!r}")


def _order(nodes: list[_Node]) -> list[_Node]:
    """Kahn's algorithm, taking the earliest ready node of the file first (stable names).

    Merge inputs from NextIteration nodes are loop back edges, not dependencies.
    """
    by_name = {n.name: n for n in nodes}
    position = {n.name: i for i, n in enumerate(nodes)}
    deps: dict[str, set[str]] = {}
    users: dict[str, list[str]] = {n.name: [] for n in nodes}
    for n in nodes:
        needed = {p for p, _ in n.inputs} | set(n.controls)
        if n.op == "Merge":
            needed = {p for p in needed if by_name[p].op != "NextIteration"}
        deps[n.name] = needed
        for p in needed:
            users[p].append(n.name)
    heap = [(position[n.name], n.name) for n in nodes if not deps[n.name]]
    heapq.heapify(heap)
    order: list[_Node] = []
    while heap:
        _, name = heapq.heappop(heap)
        order.append(by_name[name])
        for u in users[name]:
            deps[u].discard(name)
            if not deps[u]:
                heapq.heappush(heap, (position[u], u))
    if len(order) != len(nodes):
        stuck = sorted(n for n, d in deps.items() if d)[:5]
        raise errors.InvalidArgumentError(
            None,
            None,
            f"GraphDef has a cycle not broken by a NextIteration -> Merge edge (nodes {stuck})",
        )
    return order


# -- converters -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Ctx:
    graph: Graph
    prefix: str
    node: _Node
    name: str  # the imported op's full name
    controls: list[Operation]

    def op(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        attrs: Mapping[str, Any],
        name: str | None = None,
    ) -> Operation:
        extra = dict(attrs)
        cls = self.node.attrs.get("_class")
        if cls and name is None:
            extra["_class"] = [
                f"loc:@{self.prefix}{c[5:]}" if isinstance(c, str) and c.startswith("loc:@") else c
                for c in cls
            ]
        return self.graph.create_op(
            op_type,
            inputs,
            extra,
            name=name or self.name,
            control_inputs=self.controls if name is None else (),
        )

    def helper(
        self, op_type: str, inputs: Sequence[Tensor], attrs: Mapping[str, Any], suffix: str
    ) -> Tensor:
        return self.op(op_type, inputs, attrs, name=f"{self.name}/{suffix}").outputs[0]

    def attr(self, key: str, default: Any = None) -> Any:
        value = self.node.attrs.get(key)
        return default if value is None else value

    def required(self, key: str, kind: type | tuple[type, ...] | None = None) -> Any:
        """An attribute TF's op registry requires; ``InvalidArgumentError`` when absent."""
        value = self.node.attrs.get(key)
        if value is None:
            raise errors.InvalidArgumentError(
                None, None, f"node {self.node.name!r} ({self.node.op}) has no attr {key!r}"
            )
        if kind is not None and not isinstance(value, kind):
            raise errors.InvalidArgumentError(
                None, None, f"node {self.node.name!r} ({self.node.op}): attr {key!r} is {value!r}"
            )
        return value

    def const(self, t: Tensor, what: str) -> Any:
        """The build-time value of ``t``: a Const, or computed from constants alone
        (Keras makes a ``Transpose`` perm by ``ConcatV2`` of constants)."""
        value = constant_value(t)
        if value is None:
            raise errors.UnimplementedError(
                None,
                None,
                f"node {self.node.name!r} ({self.node.op}): {what} must be a "
                f"constant for asyncflow (or computed from constants only), "
                f"got {t.name!r} ({t.op.type})",
            )
        return value


Converter = Callable[[_Ctx, list[Tensor]], Operation]


def _same(op_type: str | None = None, /, **defaults: Any) -> Converter:
    """The same op (or ``op_type``) with the attributes in ``defaults`` (TF default values)."""

    def convert(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
        attrs = {
            k: ctx.attr(k, d) if d is not None else ctx.required(k) for k, d in defaults.items()
        }
        return ctx.op(op_type or ctx.node.op, inputs, attrs)

    return convert


def _const(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    proto = ctx.node.proto.attr["value"].tensor
    dt, array = ndarray_from_proto(proto, f"node {ctx.node.name!r} (Const)")
    return ctx.op("Const", inputs, {"value": array, "dtype": dt})


def _placeholder(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    shape = ctx.attr("shape", TensorShape(None))
    if not isinstance(shape, TensorShape):
        ctx.required("shape", TensorShape)
    return ctx.op(
        "Placeholder", inputs, {"dtype": ctx.required("dtype", dtypes.DType), "shape": shape}
    )


def _cast(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    return ctx.op("Cast", inputs, {"DstT": ctx.required("DstT", dtypes.DType)})


def _reduction(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    x, axes = inputs
    keep_dims = bool(ctx.attr("keep_dims", False))
    if _every_axis(axes, x):
        return ctx.op(ctx.node.op, [x], {"axis": None, "keep_dims": keep_dims})
    value = ctx.const(axes, "the reduction axes")
    return ctx.op(
        ctx.node.op, [x], {"axis": [int(a) for a in value.reshape(-1)], "keep_dims": keep_dims}
    )


def _every_axis(axes: Tensor, x: Tensor) -> bool:
    """Whether ``axes`` is ``Range(0, Rank(x), 1)``: how TF reduces a tensor of unknown
    rank over all its axes (``reduce_sum(x)`` with no axis)."""
    op = axes.op
    if op.type != "Range" or len(op.inputs) != 3:
        return False
    start, limit, delta = op.inputs
    if limit.op.type != "Rank" or _through_identities(
        limit.op.inputs[0]
    ) is not _through_identities(x):
        return False
    first, step = constant_value(start), constant_value(delta)
    return first is not None and step is not None and int(first) == 0 and int(step) == 1


def _through_identities(t: Tensor) -> Tensor:
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _arg(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    x, dim = inputs
    return ctx.op(
        ctx.node.op,
        [x],
        {
            "axis": int(ctx.const(dim, "the dimension")),
            "output_type": ctx.attr("output_type", dtypes.int64),
        },
    )


def _transpose(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    x, perm = inputs
    return ctx.op("Transpose", [x], {"perm": [int(p) for p in ctx.const(perm, "perm")]})


def _concat_v2(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    axis = int(ctx.const(inputs[-1], "the axis"))
    if len(inputs) == 2:
        return ctx.op("Identity", inputs[:1], {})
    return ctx.op("ConcatV2", inputs[:-1], {"axis": axis})


def _concat_v1(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    return _concat_v2(ctx, [*inputs[1:], inputs[0]])


def _gather(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    if int(ctx.attr("batch_dims", 0)) != 0:
        raise errors.UnimplementedError(
            None, None, f"node {ctx.node.name!r}: GatherV2 with batch_dims is not supported"
        )
    axis = int(ctx.const(inputs[2], "the axis")) if len(inputs) == 3 else 0
    return ctx.op("GatherV2", inputs[:2], {"axis": axis})


def _expand_dims(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    x, dim = inputs
    return ctx.op("ExpandDims", [x], {"axis": int(ctx.const(dim, "the axis"))})


def _matmul_batch(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    return ctx.op(
        "MatMul",
        inputs,
        {
            "transpose_a": bool(ctx.attr("adj_x", False)),
            "transpose_b": bool(ctx.attr("adj_y", False)),
        },
    )


def _div(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    # TF's Div truncates integers toward zero (C semantics).
    if inputs[0].dtype.is_integer:
        return ctx.op("TruncateDiv", inputs, {})
    return ctx.op("RealDiv", inputs, {})


def _bias_add_v1(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    return ctx.op("BiasAdd", inputs, {"data_format": "NHWC"})


_CONV = {
    "strides": None,
    "padding": None,
    "data_format": "NHWC",
    "dilations": [1, 1, 1, 1],
    "explicit_paddings": [],
}
_POOL = {"ksize": None, "strides": None, "padding": None, "data_format": "NHWC"}
_BN = {"epsilon": 1e-4, "data_format": "NHWC", "is_training": True, "exponential_avg_factor": 1.0}
_RANDOM = {"dtype": dtypes.float32, "seed": 0, "seed2": 0}
_SS = {
    "begin_mask": 0,
    "end_mask": 0,
    "ellipsis_mask": 0,
    "new_axis_mask": 0,
    "shrink_axis_mask": 0,
}

_UNKNOWN = TensorShape(None)
_RESIZE = {"align_corners": False, "half_pixel_centers": False}


def _decode_jpeg(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    ratio = int(ctx.attr("ratio", 1))
    if ratio != 1:
        raise errors.UnimplementedError(
            None,
            None,
            f"node {ctx.node.name!r} (DecodeJpeg): "
            f"ratio={ratio} (downscaled decoding) "
            f"is not supported",
        )
    return ctx.op(
        "DecodeJpeg", inputs, {"channels": int(ctx.attr("channels", 0)), "dtype": dtypes.uint8}
    )


_CONVERTERS: dict[str, Converter] = {
    "Const": _const,
    "Placeholder": _placeholder,
    "PlaceholderWithDefault": _same(shape=TensorShape(None)),
    "Identity": _same(),
    "StopGradient": _same("Identity"),
    "Snapshot": _same("Identity"),
    "PreventGradient": _same("Identity"),
    "NoOp": _same(),
    "Add": _same(),
    "AddV2": _same("Add"),
    "Sub": _same(),
    "Mul": _same(),
    "RealDiv": _same(),
    "Div": _div,
    "FloorDiv": _same(),
    "FloorMod": _same(),
    "Pow": _same(),
    "Maximum": _same(),
    "Minimum": _same(),
    "SquaredDifference": _same(),
    "AddN": _same(),
    "Neg": _same(),
    "Abs": _same(),
    "Square": _same(),
    "Sqrt": _same(),
    "Rsqrt": _same(),
    "Exp": _same(),
    "Log": _same(),
    "Tanh": _same(),
    "Sigmoid": _same(),
    "Erf": _same(),
    "Floor": _same(),
    "Ceil": _same(),
    "Round": _same(),
    "Sign": _same(),
    "Reciprocal": _same(),
    "Inv": _same("Reciprocal"),
    "Log1p": _same(),
    "Expm1": _same(),
    "Sin": _same(),
    "Cos": _same(),
    "Softplus": _same(),
    "Softsign": _same(),
    "IsNan": _same(),
    "IsFinite": _same(),
    "TruncateDiv": _same(),
    "TruncateMod": _same(),
    "BroadcastTo": _same(),
    "Relu": _same(),
    "Relu6": _same(),
    "Elu": _same(),
    "Selu": _same(),
    "LeakyRelu": _same(alpha=0.2),
    "Softmax": _same(axis=-1),
    "LogSoftmax": _same(),
    "BiasAdd": _same(data_format="NHWC"),
    "BiasAddV1": _bias_add_v1,
    "MatMul": _same(transpose_a=False, transpose_b=False),
    "BatchMatMul": _matmul_batch,
    "BatchMatMulV2": _matmul_batch,
    "BatchMatMulV3": _matmul_batch,
    "Equal": _same(),
    "NotEqual": _same(),
    "Less": _same(),
    "LessEqual": _same(),
    "Greater": _same(),
    "GreaterEqual": _same(),
    "LogicalAnd": _same(),
    "LogicalOr": _same(),
    "LogicalNot": _same(),
    "Cast": _cast,
    "Sum": _reduction,
    "Mean": _reduction,
    "Max": _reduction,
    "Min": _reduction,
    "Prod": _reduction,
    "All": _reduction,
    "Any": _reduction,
    "ArgMax": _arg,
    "ArgMin": _arg,
    "Reshape": _same(),
    "Transpose": _transpose,
    "ConcatV2": _concat_v2,
    "Concat": _concat_v1,
    "Pack": _same(axis=0),
    "Unpack": _same(num=None, axis=0),
    "GatherV2": _gather,
    "Gather": _gather,
    "ExpandDims": _expand_dims,
    "Squeeze": _same(squeeze_dims=[]),
    "Shape": _same(out_type=dtypes.int32),
    "Size": _same(out_type=dtypes.int32),
    "Rank": _same(),
    "Fill": _same(),
    "Range": _same(),
    "ZerosLike": _same(),
    "OnesLike": _same(),
    "Where": _same(),
    "SelectV2": _same(),
    "Select": _same(),
    "StridedSlice": _same(**_SS),
    "Slice": _same(),
    "Split": _same(num_split=None),
    "SplitV": _same(num_split=None),
    "Tile": _same(),
    "Pad": _same(),
    "PadV2": _same(),
    "MirrorPad": _same(mode=None),
    "OneHot": _same(axis=-1),
    "GatherNd": _same(),
    "ReverseV2": _same(),
    "Cumsum": _same(exclusive=False, reverse=False),
    "TopKV2": _same(sorted=True),
    "Einsum": _same(equation=None),
    "ClipByValue": _same(),
    "Conv2D": _same(**_CONV),
    "DepthwiseConv2dNative": _same(**_CONV),
    "Conv2DBackpropInput": _same(**_CONV),
    "MaxPool": _same(**_POOL),
    "AvgPool": _same(**_POOL),
    "FusedBatchNorm": _same(**_BN),
    "FusedBatchNormV2": _same(**_BN),
    "FusedBatchNormV3": _same(**_BN),
    "SoftmaxCrossEntropyWithLogits": _same(),
    "SparseSoftmaxCrossEntropyWithLogits": _same(),
    "RandomUniform": _same(**_RANDOM),
    "RandomStandardNormal": _same(**_RANDOM),
    "TruncatedNormal": _same(**_RANDOM),
    "RandomUniformInt": _same(seed=0, seed2=0),
    "Print": _same(message="", first_n=-1, summarize=3),
    "Assert": _same(summarize=3),
    "Switch": _same(),
    "Exit": _same(),
    "NextIteration": _same(),
    "LoopCond": _same(),
    "Enter": _same(frame_name=None, is_constant=False, parallel_iterations=10),
    "IdentityN": _same(),
    "Erfc": _same(),
    "MatrixBandPart": _same(),
    "TensorArrayV3": _same(
        dtype=None,
        element_shape=_UNKNOWN,
        dynamic_size=False,
        clear_after_read=True,
        identical_element_shapes=False,
        tensor_array_name="",
    ),
    "TensorArrayReadV3": _same(dtype=None),
    "TensorArrayWriteV3": _same(T=None),
    "TensorArrayGatherV3": _same(dtype=None, element_shape=_UNKNOWN),
    "TensorArrayScatterV3": _same(T=None),
    "TensorArrayConcatV3": _same(dtype=None, element_shape_except0=_UNKNOWN),
    "TensorArraySplitV3": _same(T=None),
    "TensorArraySizeV3": _same(),
    "TensorArrayCloseV3": _same(),
    "ResizeBilinear": _same(**_RESIZE),
    "ResizeNearestNeighbor": _same(**_RESIZE),
    "DecodePng": _same(channels=0, dtype=dtypes.uint8),
    "DecodeJpeg": _decode_jpeg,
    "EncodePng": _same(compression=-1),
    "EncodeJpeg": _same(quality=95, format=""),
}


def supported_tf_op_types() -> tuple[str, ...]:
    """The TensorFlow op types :func:`import_tf_graph_def` accepts, sorted: the keys of
    the converter table (the one place an op type becomes importable)."""
    return tuple(sorted([*_CONVERTERS, "Merge"]))


# -- the import -----------------------------------------------------------------------------

_DEVICE_TYPE = re.compile(r"device:([A-Za-z_]+):\d+|/(cpu|gpu):\d+", re.IGNORECASE)


def _device(spec: str) -> str:
    """A TF device string, kept when it is a CPU; other devices are dropped (soft placement)."""
    if not spec:
        return ""
    m = _DEVICE_TYPE.search(spec)
    if m is None or (m.group(1) or m.group(2)).upper() != "CPU":
        return ""
    return spec


def import_tf_graph_def(
    data: bytes | str | os.PathLike[str],
    input_map: Mapping[str, Any] | None = None,
    return_elements: Sequence[str] | None = None,
    name: str | None = "import",
) -> list[Tensor | Operation] | None:
    """Import a TensorFlow ``GraphDef`` protobuf into the default graph.

    ``data``: serialized bytes, or a path to a binary ``.pb`` or text ``.pbtxt`` file.
    As ``tf.import_graph_def``: op names get the prefix ``name/`` (uniquified; ``None``
    means ``"import"``, ``""`` no prefix); ``input_map`` maps graph-def tensor names
    (``"x:0"``, ``"x"``) to tensors used in their place; ``return_elements`` lists names
    to return (``"op:0"`` → Tensor, ``"op"`` → Operation), else ``None`` is returned.

    Unsupported op types → one ``UnimplementedError`` listing each with its count;
    undecodable bytes → ``DataLossError``; malformed nodes → ``InvalidArgumentError``
    naming the node.  All or nothing: the graph def is first built into a scratch
    graph, so on any error the target graph is unchanged.  Needs the ``protobuf``
    package (``pip install 'asyncflow[tf]'``).
    """
    graph_def = _parse(data)
    if len(graph_def.library.function):
        names = sorted(f.signature.name for f in graph_def.library.function)
        raise errors.UnimplementedError(
            None, None, f"GraphDef function libraries are not supported (functions {names})"
        )
    nodes = _nodes(graph_def)
    counts = Counter(n.op for n in nodes if n.op not in _CONVERTERS and n.op != "Merge")
    if counts:
        listed = ", ".join(f"{t} (x{c})" for t, c in sorted(counts.items()))
        raise errors.UnimplementedError(
            None,
            None,
            f"the GraphDef uses {len(counts)} op type(s) asyncflow does not support: {listed}",
        )
    for n in nodes:
        _decode_attrs(n)
    order = _order(nodes)
    mapped = _input_map(input_map, {n.name: n for n in nodes})
    graph = get_default_graph()
    if graph.finalized:
        raise RuntimeError(f"cannot import a GraphDef: graph {graph!r} is finalized")
    _dry_run(order, mapped)
    prefix = ""
    if name is None:
        name = "import"  # as tf.import_graph_def
    if name:
        prefix = graph.unique_name(name.rstrip("/")) + "/"
    created = _create(graph, prefix, order, mapped)
    if return_elements is None:
        return None
    return [_element(e, created) for e in return_elements]


def _input_map(
    input_map: Mapping[str, Any] | None, nodes: dict[str, _Node]
) -> dict[tuple[str, int], Tensor]:
    from asyncflow.framework.graph import convert_to_tensor

    out: dict[tuple[str, int], Tensor] = {}
    missing = []
    for key, value in (input_map or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"input_map keys must be tensor names, got {key!r}")
        m = _INPUT.match(key)
        if m is None or m.group(1):
            raise ValueError(f"input_map key {key!r} is not a tensor name ('op:0')")
        if m.group(2) not in nodes:
            missing.append(key)
            continue
        out[(m.group(2), int(m.group(3) or 0))] = convert_to_tensor(value)
    if missing:
        raise ValueError(
            f"Attempted to map inputs that were not found in graph_def: {sorted(missing)}"
        )
    return out


def _dry_run(order: list[_Node], mapped: dict[tuple[str, int], Tensor]) -> None:
    """Build everything into a scratch graph first: the graph is append-only, so this is
    how a failing node leaves the caller's graph untouched.  Mapped inputs become
    placeholders of the same dtype and shape there."""
    scratch = Graph()
    with scratch.as_default():
        stand_ins = {
            key: scratch.create_op("Placeholder", (), {"dtype": t.dtype, "shape": t.shape}).outputs[
                0
            ]
            for key, t in mapped.items()
        }
    _create(scratch, "", order, stand_ins)


def _create(
    graph: Graph, prefix: str, order: list[_Node], mapped: dict[tuple[str, int], Tensor]
) -> dict[str, Operation]:
    created: dict[str, Operation] = {}
    # (merge op, input index, producer, output index) of NextIteration -> Merge edges.
    back_edges: list[tuple[Operation, int, str, int]] = []
    with graph.as_default(), graph.name_scope(None), graph.control_dependencies(None):
        for node in order:
            inputs: list[Tensor | None] = []
            for p, k in node.inputs:
                t = mapped.get((p, k))
                if t is None and p in created:
                    t = _output(created[p], k, node)
                inputs.append(t)
            pending = [i for i, t in enumerate(inputs) if t is None]
            stand_in = next((t for t in inputs if t is not None), None)
            if pending and stand_in is None:
                raise errors.InvalidArgumentError(
                    None, None, f"Merge node {node.name!r} has only back-edge inputs"
                )
            ready: list[Tensor] = []
            for t in inputs:
                chosen = t if t is not None else stand_in
                assert chosen is not None  # checked above: a stand-in exists when pending
                ready.append(chosen)
            controls = [created[c] for c in node.controls]
            ctx = _Ctx(graph, prefix, node, prefix + node.name, controls)
            with graph.device(_device(node.device)):
                op = _convert(ctx, ready)
            if pending:
                # A loop Merge: the value's shape may change from one iteration to the next.
                op._outputs[0]._shape = unknown_shape()
                back_edges.extend((op, i, *node.inputs[i]) for i in pending)
            _check_output_shapes(op, node)
            created[node.name] = op
        for op, i, p, k in back_edges:
            graph._update_input(op, i, _output(created[p], k, None))
    return created


def _convert(ctx: _Ctx, inputs: list[Tensor]) -> Operation:
    node = ctx.node
    try:
        if node.op == "Merge":
            return ctx.op("Merge", inputs, {})
        return _CONVERTERS[node.op](ctx, inputs)
    except errors.OpError:
        raise
    except Exception as exc:
        # A shape function or converter tripping on malformed attributes or inputs.
        raise errors.InvalidArgumentError(
            None, None, f"cannot import node {node.name!r} ({node.op}): {type(exc).__name__}: {exc}"
        ) from exc


def _output(op: Operation, index: int, node: _Node | None) -> Tensor:
    if index >= len(op.outputs):
        who = f"node {node.name!r}" if node is not None else "a Merge node"
        raise errors.InvalidArgumentError(
            None,
            None,
            f"{who} uses output {index} of {op.name!r}, which has {len(op.outputs)} output(s)",
        )
    return op.outputs[index]


def _check_output_shapes(op: Operation, node: _Node) -> None:
    """Refine the inferred shapes with TF's ``_output_shapes`` attribute when present."""
    declared = node.attrs.get("_output_shapes")
    if not declared or len(declared) != len(op.outputs):
        return
    for t, shape in zip(op.outputs, declared):
        if not t._shape.is_compatible_with(shape):
            raise errors.InvalidArgumentError(
                None,
                None,
                f"node {node.name!r}: inferred shape "
                f"{t._shape} of {t.name!r} does not "
                f"match _output_shapes {shape}",
            )
        t._shape = t._shape.merge_with(shape)


def _element(element: str, created: dict[str, Operation]) -> Tensor | Operation:
    if not isinstance(element, str):
        raise TypeError(f"return_elements must be names, got {element!r}")
    m = _INPUT.match(element)
    if m is None or m.group(1) or m.group(2) not in created:
        raise ValueError(f"Requested return_element {element!r} not found in graph_def.")
    op = created[m.group(2)]
    if m.group(3) is None:
        return op
    return _output(op, int(m.group(3)), None)
