"""``export_tf_graph_def``: write an asyncflow graph as TensorFlow's ``GraphDef`` protobuf.

Each asyncflow op type with a TensorFlow twin maps to it with TF's attributes,
including the type attributes TF's op registry requires (``T``, ``Tidx``, ...).  Where
asyncflow keeps an argument as an attribute and TF as an input (reduction axes,
``Transpose``'s perm, ``ConcatV2``'s axis, ...) a ``Const`` node is added beside the op
(``<op>/axis``).  Ops without a TF twin — ``py_func``, async kernels, variables (freeze
the graph first), ``Defun`` calls — are one ``UnimplementedError`` naming every one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.compat._tf_proto import messages
from asyncflow.compat._values import RESOURCE_TYPE, attr_to_proto, ndarray_to_proto
from asyncflow.framework.graph import Graph, Operation, Tensor

__all__ = ["export_tf_graph_def"]

#: The GraphDef producer version written (TF 2.x graphs; v1 ops are all still valid).
_PRODUCER = 1882


def _name(t: Tensor) -> str:
    return t.op.name if t.value_index == 0 else f"{t.op.name}:{t.value_index}"


class _Writer:
    def __init__(self, graph: Graph) -> None:
        self.m = messages()
        self.graph_def = self.m.GraphDef()
        self.graph_def.versions.producer = _PRODUCER
        self.names = {op.name for op in graph.get_operations()}

    def node(
        self, name: str, tf_type: str, inputs: list[str], attrs: dict[str, Any], device: str = ""
    ) -> None:
        nd = self.graph_def.node.add(name=name, op=tf_type, device=device)
        nd.input.extend(inputs)
        where = f"op {name!r} ({tf_type}), attr"
        for key, value in attrs.items():
            if key == "value" and isinstance(value, np.ndarray):
                ndarray_to_proto(value, attrs["dtype"], nd.attr[key].tensor, where)
            else:
                attr_to_proto(value, nd.attr[key], f"{where} {key!r}")

    def fresh(self, op: Operation, suffix: str) -> str:
        """A node name beside ``op`` that no other node has."""
        name = f"{op.name}/{suffix}"
        while name in self.names:
            name += "_"
        self.names.add(name)
        return name

    def const(self, op: Operation, suffix: str, value: Any, dt: dtypes.DType) -> str:
        name = self.fresh(op, suffix)
        array = np.asarray(value, dtype=dt.np)
        # A control edge from the op's first input keeps the Const in the op's loop frame
        # (as TF hangs constants inside a while body off the loop's pivot).
        controls = [f"^{op.inputs[0].op.name}"] if op.inputs else []
        self.node(name, "Const", controls, {"value": array, "dtype": dt}, op.device)
        return name


Exporter = Callable[[_Writer, Operation], tuple[str, list[str], dict[str, Any]]]


def _t(op: Operation) -> Any:
    return _type_of(op.inputs[0]) if op.inputs else op.outputs[0].dtype


#: Ops that pass their first input's value on (a TensorArray handle enters, leaves and
#: goes round loops through them).
_PASS_THROUGH = frozenset({"Identity", "Enter", "Exit", "Switch", "Merge", "NextIteration"})


def _type_of(t: Tensor) -> Any:
    """``t``'s TF type: ``DT_RESOURCE`` for a TensorArray handle (asyncflow keeps
    handles in string tensors), else its dtype."""
    if t.dtype is not dtypes.string:
        return t.dtype
    source = t
    while source.op.type in _PASS_THROUGH and source.op.inputs:
        source = source.op.inputs[0]
    if source.op.type == "TensorArrayV3" and source.value_index == 0:
        return RESOURCE_TYPE
    return t.dtype


def _simple(tf_type: str | None = None, *keep: str, t: bool = True) -> Exporter:
    def export(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
        attrs = {k: op.get_attr(k) for k in keep}
        if t and (op.inputs or op.outputs):
            attrs["T"] = _t(op)
        return tf_type or op.type, [_name(x) for x in op.inputs], attrs

    return export


def _const(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return "Const", [], {"value": np.asarray(op.get_attr("value")), "dtype": op.get_attr("dtype")}


def _placeholder(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return "Placeholder", [], {"dtype": op.get_attr("dtype"), "shape": op.get_attr("shape")}


def _reduction(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    x = op.inputs[0]
    axes = op.get_attr("axis")
    if axes is None:
        axes = list(range(x.shape.rank)) if x.shape.rank is not None else None
    axis = (
        _every_axis(w, op) if axes is None else w.const(op, "reduction_indices", axes, dtypes.int32)
    )
    attrs: dict[str, Any] = {"Tidx": dtypes.int32, "keep_dims": bool(op.get_attr("keep_dims"))}
    if op.type not in ("All", "Any"):  # TF's All / Any are bool-only: no T
        attrs["T"] = x.dtype
    return op.type, [_name(x), axis], attrs


def _every_axis(w: _Writer, op: Operation) -> str:
    """``Range(0, Rank(x), 1)``: TF's axes for reducing a tensor of unknown rank."""
    x = op.inputs[0]
    start = w.const(op, "range/start", 0, dtypes.int32)
    delta = w.const(op, "range/delta", 1, dtypes.int32)
    rank = w.fresh(op, "rank")
    w.node(rank, "Rank", [_name(x)], {"T": _type_of(x)}, op.device)
    name = w.fresh(op, "range")
    w.node(name, "Range", [start, rank, delta], {"Tidx": dtypes.int32}, op.device)
    return name


def _arg(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    axis = w.const(op, "dimension", op.get_attr("axis"), dtypes.int32)
    return (
        op.type,
        [_name(op.inputs[0]), axis],
        {"T": _t(op), "Tidx": dtypes.int32, "output_type": op.get_attr("output_type")},
    )


def _transpose(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    x = op.inputs[0]
    perm = op.get_attr("perm")
    if perm is None:
        if x.shape.rank is None:
            raise errors.UnimplementedError(
                None, op, f"op {op.name!r}: Transpose of unknown rank without perm"
            )
        perm = list(range(x.shape.rank))[::-1]
    p = w.const(op, "perm", perm, dtypes.int32)
    return "Transpose", [_name(x), p], {"T": x.dtype, "Tperm": dtypes.int32}


def _concat(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    axis = w.const(op, "axis", op.get_attr("axis"), dtypes.int32)
    return (
        "ConcatV2",
        [*(_name(x) for x in op.inputs), axis],
        {"N": len(op.inputs), "T": _t(op), "Tidx": dtypes.int32},
    )


def _gather(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    params, indices = op.inputs
    axis = w.const(op, "axis", op.get_attr("axis"), dtypes.int32)
    return (
        "GatherV2",
        [_name(params), _name(indices), axis],
        {
            "Tparams": params.dtype,
            "Tindices": indices.dtype,
            "Taxis": dtypes.int32,
            "batch_dims": 0,
        },
    )


def _expand_dims(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    dim = w.const(op, "dim", op.get_attr("axis"), dtypes.int32)
    return "ExpandDims", [_name(op.inputs[0]), dim], {"T": _t(op), "Tdim": dtypes.int32}


def _reshape(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    if len(op.inputs) == 2:
        shape = _name(op.inputs[1])
        tshape = op.inputs[1].dtype
    else:
        shape, tshape = w.const(op, "shape", op.get_attr("shape"), dtypes.int32), dtypes.int32
    return "Reshape", [_name(op.inputs[0]), shape], {"T": _t(op), "Tshape": tshape}


def _matmul(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    a, b = op.inputs
    ta, tb = bool(op.get_attr("transpose_a")), bool(op.get_attr("transpose_b"))
    if a.shape.rank == 2 and b.shape.rank == 2:
        return "MatMul", [_name(a), _name(b)], {"T": a.dtype, "transpose_a": ta, "transpose_b": tb}
    return "BatchMatMulV2", [_name(a), _name(b)], {"T": a.dtype, "adj_x": ta, "adj_y": tb}


def _softmax(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    x = op.inputs[0]
    axis = op.get_attr("axis")
    if axis != -1 and (x.shape.rank is None or axis != x.shape.rank - 1):
        raise errors.UnimplementedError(
            None,
            op,
            f"op {op.name!r}: TF's Softmax op takes the last axis only, this one uses axis {axis}",
        )
    return "Softmax", [_name(x)], {"T": x.dtype}


def _cast(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return (
        "Cast",
        [_name(op.inputs[0])],
        {"SrcT": _t(op), "DstT": op.get_attr("DstT"), "Truncate": False},
    )


def _with_types(tf_type: str, types: dict[str, int | str], *keep: str) -> Exporter:
    """Type attributes from input positions (int) or the first output ("out")."""

    def export(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
        attrs: dict[str, Any] = {k: op.get_attr(k) for k in keep}
        for key, where in types.items():
            attrs[key] = op.outputs[0].dtype if where == "out" else op.inputs[int(where)].dtype
        return tf_type, [_name(x) for x in op.inputs], attrs

    return export


def _n_inputs(tf_type: str, *keep: str) -> Exporter:
    def export(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
        attrs = {k: op.get_attr(k) for k in keep}
        attrs.update({"N": len(op.inputs), "T": _t(op)})
        return tf_type, [_name(x) for x in op.inputs], attrs

    return export


def _random(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    attrs: dict[str, Any] = {
        "seed": op.get_attr("seed"),
        "seed2": op.get_attr("seed2"),
        "T": op.inputs[0].dtype,
    }
    if op.type == "RandomUniformInt":
        attrs["Tout"] = op.outputs[0].dtype
    else:
        attrs["dtype"] = op.get_attr("dtype")
    return op.type, [_name(x) for x in op.inputs], attrs


def _print(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    attrs = {k: op.get_attr(k) for k in ("message", "first_n", "summarize")}
    attrs.update({"T": _t(op), "U": [x.dtype for x in op.inputs[1:]]})
    return "Print", [_name(x) for x in op.inputs], attrs


def _assert(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return (
        "Assert",
        [_name(x) for x in op.inputs],
        {"summarize": op.get_attr("summarize"), "T": [x.dtype for x in op.inputs[1:]]},
    )


def _batch_norm(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    attrs = {k: op.get_attr(k) for k in ("epsilon", "data_format", "is_training")}
    attrs["T"] = _t(op)
    if op.type != "FusedBatchNorm":
        attrs["U"] = dtypes.float32
    if op.type == "FusedBatchNormV3":
        attrs["exponential_avg_factor"] = float(op.attrs.get("exponential_avg_factor", 1.0))
    return op.type, [_name(x) for x in op.inputs], attrs


def _identity_n(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return "IdentityN", [_name(x) for x in op.inputs], {"T": [_type_of(x) for x in op.inputs]}


def _decode_jpeg(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return (
        "DecodeJpeg",
        [_name(op.inputs[0])],
        {
            "channels": op.get_attr("channels"),
            "ratio": 1,
            "fancy_upscaling": True,
            "try_recover_truncated": False,
            "acceptable_fraction": 1.0,
            "dct_method": "",
        },
    )


def _encode_jpeg(w: _Writer, op: Operation) -> tuple[str, list[str], dict[str, Any]]:
    return (
        "EncodeJpeg",
        [_name(op.inputs[0])],
        {
            "quality": op.get_attr("quality"),
            "format": op.get_attr("format"),
            "progressive": False,
            "optimize_size": False,
            "chroma_downsampling": True,
            "density_unit": "in",
            "x_density": 300,
            "y_density": 300,
            "xmp_metadata": "",
        },
    )


_TA = (
    "dtype",
    "element_shape",
    "dynamic_size",
    "clear_after_read",
    "identical_element_shapes",
    "tensor_array_name",
)
_RESIZE = ("align_corners", "half_pixel_centers")
_CONV = ("strides", "padding", "data_format", "dilations", "explicit_paddings")
_POOL = ("ksize", "strides", "padding", "data_format")
_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")
_UNARY = (
    "Identity",
    "Neg",
    "Abs",
    "Square",
    "Sqrt",
    "Rsqrt",
    "Exp",
    "Log",
    "Tanh",
    "Sigmoid",
    "Erf",
    "Relu",
    "Relu6",
    "Elu",
    "Selu",
    "LogSoftmax",
    "LogicalNot",
    "ZerosLike",
    "OnesLike",
    "Exit",
    "NextIteration",
    "Sub",
    "Mul",
    "RealDiv",
    "FloorDiv",
    "FloorMod",
    "Pow",
    "Maximum",
    "Minimum",
    "SquaredDifference",
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "Switch",
    "Rank",
    "ClipByValue",
    "SoftmaxCrossEntropyWithLogits",
    "Where",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Reciprocal",
    "Log1p",
    "Expm1",
    "Sin",
    "Cos",
    "Softplus",
    "Softsign",
    "IsNan",
    "IsFinite",
    "TruncateDiv",
    "TruncateMod",
    "Erfc",
)

_EXPORTERS: dict[str, Exporter] = {
    "Const": _const,
    "Placeholder": _placeholder,
    "PlaceholderWithDefault": _with_types("PlaceholderWithDefault", {"dtype": 0}, "shape"),
    "NoOp": _simple("NoOp", t=False),
    "Add": _simple("AddV2"),
    "LogicalAnd": _simple(t=False),
    "LogicalOr": _simple(t=False),
    "LogicalNot": _simple(t=False),
    "LoopCond": _simple(t=False),
    "LogicalXor": _simple("NotEqual"),  # TF has no LogicalXor op: x != y on bools
    "LeakyRelu": _simple(None, "alpha"),
    "Softmax": _softmax,
    "BiasAdd": _simple(None, "data_format"),
    "MatMul": _matmul,
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
    "Reshape": _reshape,
    "Transpose": _transpose,
    "ConcatV2": _concat,
    "Pack": _n_inputs("Pack", "axis"),
    "AddN": _n_inputs("AddN"),
    "Unpack": _simple(None, "num", "axis"),
    "GatherV2": _gather,
    "ExpandDims": _expand_dims,
    "Squeeze": _simple(None, "squeeze_dims"),
    "Shape": _simple(None, "out_type"),
    "Size": _simple(None, "out_type"),
    "Range": _with_types("Range", {"Tidx": 0}),
    "Fill": _with_types("Fill", {"T": 1, "index_type": 0}),
    "BroadcastTo": _with_types("BroadcastTo", {"T": 0, "Tidx": 1}),
    "SelectV2": _with_types("SelectV2", {"T": 1}),
    "Where": _simple(),
    "StridedSlice": _with_types("StridedSlice", {"T": 0, "Index": 1}, *_MASKS),
    "Slice": _with_types("Slice", {"T": 0, "Index": 1}),
    "Split": _with_types("Split", {"T": 1}, "num_split"),
    "SplitV": _with_types("SplitV", {"T": 0, "Tlen": 1}, "num_split"),
    "Tile": _with_types("Tile", {"T": 0, "Tmultiples": 1}),
    "Pad": _with_types("Pad", {"T": 0, "Tpaddings": 1}),
    "PadV2": _with_types("PadV2", {"T": 0, "Tpaddings": 1}),
    "MirrorPad": _with_types("MirrorPad", {"T": 0, "Tpaddings": 1}, "mode"),
    "OneHot": _with_types("OneHot", {"T": 2, "TI": 0}, "axis"),
    "GatherNd": _with_types("GatherNd", {"Tparams": 0, "Tindices": 1}),
    "ReverseV2": _with_types("ReverseV2", {"T": 0, "Tidx": 1}),
    "Cumsum": _with_types("Cumsum", {"T": 0, "Tidx": 1}, "exclusive", "reverse"),
    "TopKV2": _simple(None, "sorted"),
    "Einsum": _n_inputs("Einsum", "equation"),
    "Conv2D": _simple(None, *_CONV),
    "DepthwiseConv2dNative": _simple(None, *_CONV),
    "Conv2DBackpropInput": _with_types("Conv2DBackpropInput", {"T": 2}, *_CONV),
    "MaxPool": _simple(None, *_POOL),
    "AvgPool": _simple(None, *_POOL),
    "FusedBatchNorm": _batch_norm,
    "FusedBatchNormV2": _batch_norm,
    "FusedBatchNormV3": _batch_norm,
    "SparseSoftmaxCrossEntropyWithLogits": _with_types(
        "SparseSoftmaxCrossEntropyWithLogits", {"T": 0, "Tlabels": 1}
    ),
    "RandomUniform": _random,
    "RandomStandardNormal": _random,
    "TruncatedNormal": _random,
    "RandomUniformInt": _random,
    "Print": _print,
    "Assert": _assert,
    "Merge": _n_inputs("Merge"),
    "Enter": _simple(None, "frame_name", "is_constant", "parallel_iterations"),
    "Select": _with_types("Select", {"T": 1}),
    "IdentityN": _identity_n,
    "MatrixBandPart": _with_types("MatrixBandPart", {"T": 0, "Tindex": 1}),
    "TensorArrayV3": _simple(None, *_TA, t=False),
    "TensorArrayReadV3": _simple(None, "dtype", t=False),
    "TensorArrayWriteV3": _simple(None, "T", t=False),
    "TensorArrayGatherV3": _simple(None, "dtype", "element_shape", t=False),
    "TensorArrayScatterV3": _simple(None, "T", t=False),
    "TensorArrayConcatV3": _simple(None, "dtype", "element_shape_except0", t=False),
    "TensorArraySplitV3": _simple(None, "T", t=False),
    "TensorArraySizeV3": _simple(t=False),
    "TensorArrayCloseV3": _simple(t=False),
    "ResizeBilinear": _simple(None, *_RESIZE),
    "ResizeNearestNeighbor": _simple(None, *_RESIZE),
    "DecodePng": _simple(None, "channels", "dtype", t=False),
    "DecodeJpeg": _decode_jpeg,
    "EncodePng": _simple(None, "compression"),
    "EncodeJpeg": _encode_jpeg,
}
_EXPORTERS.update({t: _simple() for t in _UNARY if t not in _EXPORTERS})


def export_tf_graph_def(graph: Graph) -> bytes:
    """``graph`` as a serialized TensorFlow ``GraphDef`` (TF can import and run it).

    Op names, inputs, control inputs, devices and ``_class`` colocation are kept.
    Ops without a TensorFlow twin (``py_func``, async kernels, variables, function
    calls, ...) → one ``UnimplementedError`` naming each op and its type.
    """
    ops = graph.get_operations()
    bad = [op for op in ops if op.type not in _EXPORTERS]
    if bad:
        listed = ", ".join(f"{op.name!r} ({op.type})" for op in bad[:20])
        more = f" and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise errors.UnimplementedError(
            None,
            bad[0],
            f"cannot export {len(bad)} op(s) with no TensorFlow equivalent: {listed}{more}",
        )
    w = _Writer(graph)
    for op in ops:
        try:
            tf_type, inputs, attrs = _EXPORTERS[op.type](w, op)
        except (KeyError, ValueError) as exc:
            raise errors.UnimplementedError(
                None, op, f"cannot export op {op.name!r} ({op.type}): {exc}"
            ) from exc
        cls = op.attrs.get("_class")
        if cls:
            attrs["_class"] = list(cls)
        inputs += [f"^{c.name}" for c in op.control_inputs]
        w.node(op.name, tf_type, inputs, attrs, op.device)
    data: bytes = w.graph_def.SerializeToString()
    return data
