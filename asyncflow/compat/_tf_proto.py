"""TensorFlow's protobuf schemas, written here and compiled at run time.

The messages (``GraphDef``, ``NodeDef``, ``AttrValue``, ``TensorProto``,
``TensorShapeProto``, ``VersionDef``, ``FunctionDefLibrary``, ...) and the
``DataType`` enum mirror ``tensorflow/core/framework/*.proto``; ``SavedModel``,
``MetaGraphDef``, ``SignatureDef`` and the checkpoint index's ``BundleHeaderProto`` /
``BundleEntryProto`` mirror ``tensorflow/core/protobuf/*.proto``; field numbers are
public wire-format facts, so no TensorFlow is needed.  Fields asyncflow never reads
are left out; protobuf keeps them as unknown fields, so parsing is unaffected.

The schema is built as a ``FileDescriptorProto`` and turned into message classes by
``google.protobuf`` (``descriptor_pool`` + ``message_factory``) in a private pool, so it
never clashes with TensorFlow's own classes in the same process.  ``protobuf`` is the
optional extra ``asyncflow[tf]``; it is imported only when this module's
:func:`messages` is first called.
"""

from __future__ import annotations

import functools
import importlib
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["DATA_TYPES", "Messages", "messages"]

#: TF's ``DataType`` enum (``types.proto``): name -> number.  ``*_REF`` = number + 100.
DATA_TYPES: dict[str, int] = {
    "DT_INVALID": 0,
    "DT_FLOAT": 1,
    "DT_DOUBLE": 2,
    "DT_INT32": 3,
    "DT_UINT8": 4,
    "DT_INT16": 5,
    "DT_INT8": 6,
    "DT_STRING": 7,
    "DT_COMPLEX64": 8,
    "DT_INT64": 9,
    "DT_BOOL": 10,
    "DT_QINT8": 11,
    "DT_QUINT8": 12,
    "DT_QINT32": 13,
    "DT_BFLOAT16": 14,
    "DT_QINT16": 15,
    "DT_QUINT16": 16,
    "DT_UINT16": 17,
    "DT_COMPLEX128": 18,
    "DT_HALF": 19,
    "DT_RESOURCE": 20,
    "DT_VARIANT": 21,
    "DT_UINT32": 22,
    "DT_UINT64": 23,
}

# (field name, number, type, label, message/enum type name or None)
_OPT, _REP = "optional", "repeated"
_Field = tuple[str, int, str, str, str | None]

_MESSAGES: dict[str, list[_Field]] = {
    "TensorShapeProto.Dim": [("size", 1, "int64", _OPT, None), ("name", 2, "string", _OPT, None)],
    "TensorShapeProto": [
        ("dim", 2, "message", _REP, ".tensorflow.TensorShapeProto.Dim"),
        ("unknown_rank", 3, "bool", _OPT, None),
    ],
    "TensorProto": [
        ("dtype", 1, "enum", _OPT, ".tensorflow.DataType"),
        ("tensor_shape", 2, "message", _OPT, ".tensorflow.TensorShapeProto"),
        ("version_number", 3, "int32", _OPT, None),
        ("tensor_content", 4, "bytes", _OPT, None),
        ("float_val", 5, "float", _REP, None),
        ("double_val", 6, "double", _REP, None),
        ("int_val", 7, "int32", _REP, None),
        ("string_val", 8, "bytes", _REP, None),
        ("scomplex_val", 9, "float", _REP, None),
        ("int64_val", 10, "int64", _REP, None),
        ("bool_val", 11, "bool", _REP, None),
        ("dcomplex_val", 12, "double", _REP, None),
        ("half_val", 13, "int32", _REP, None),
        ("uint32_val", 16, "uint32", _REP, None),
        ("uint64_val", 17, "uint64", _REP, None),
    ],
    "AttrValue.ListValue": [
        ("s", 2, "bytes", _REP, None),
        ("i", 3, "int64", _REP, None),
        ("f", 4, "float", _REP, None),
        ("b", 5, "bool", _REP, None),
        ("type", 6, "enum", _REP, ".tensorflow.DataType"),
        ("shape", 7, "message", _REP, ".tensorflow.TensorShapeProto"),
        ("tensor", 8, "message", _REP, ".tensorflow.TensorProto"),
        ("func", 9, "message", _REP, ".tensorflow.NameAttrList"),
    ],
    # Every field of AttrValue is in the oneof "value" (see _ONEOFS).
    "AttrValue": [
        ("list", 1, "message", _OPT, ".tensorflow.AttrValue.ListValue"),
        ("s", 2, "bytes", _OPT, None),
        ("i", 3, "int64", _OPT, None),
        ("f", 4, "float", _OPT, None),
        ("b", 5, "bool", _OPT, None),
        ("type", 6, "enum", _OPT, ".tensorflow.DataType"),
        ("shape", 7, "message", _OPT, ".tensorflow.TensorShapeProto"),
        ("tensor", 8, "message", _OPT, ".tensorflow.TensorProto"),
        ("placeholder", 9, "string", _OPT, None),
        ("func", 10, "message", _OPT, ".tensorflow.NameAttrList"),
    ],
    "NameAttrList": [
        ("name", 1, "string", _OPT, None),
        ("attr", 2, "message", _REP, ".tensorflow.NameAttrList.AttrEntry"),
    ],
    "NodeDef": [
        ("name", 1, "string", _OPT, None),
        ("op", 2, "string", _OPT, None),
        ("input", 3, "string", _REP, None),
        ("device", 4, "string", _OPT, None),
        ("attr", 5, "message", _REP, ".tensorflow.NodeDef.AttrEntry"),
    ],
    "VersionDef": [
        ("producer", 1, "int32", _OPT, None),
        ("min_consumer", 2, "int32", _OPT, None),
        ("bad_consumers", 3, "int32", _REP, None),
    ],
    "OpDef": [("name", 1, "string", _OPT, None)],
    "FunctionDef": [
        ("signature", 1, "message", _OPT, ".tensorflow.OpDef"),
        ("node_def", 3, "message", _REP, ".tensorflow.NodeDef"),
    ],
    "GradientDef": [
        ("function_name", 1, "string", _OPT, None),
        ("gradient_func", 2, "string", _OPT, None),
    ],
    "FunctionDefLibrary": [
        ("function", 1, "message", _REP, ".tensorflow.FunctionDef"),
        ("gradient", 2, "message", _REP, ".tensorflow.GradientDef"),
    ],
    "GraphDef": [
        ("node", 1, "message", _REP, ".tensorflow.NodeDef"),
        ("library", 2, "message", _OPT, ".tensorflow.FunctionDefLibrary"),
        ("version", 3, "int32", _OPT, None),
        ("versions", 4, "message", _OPT, ".tensorflow.VersionDef"),
    ],
    # tensor_bundle.proto: a checkpoint's index entries.
    "BundleHeaderProto": [
        ("num_shards", 1, "int32", _OPT, None),
        ("endianness", 2, "int32", _OPT, None),  # enum: 0 LITTLE, 1 BIG
        ("version", 3, "message", _OPT, ".tensorflow.VersionDef"),
    ],
    "TensorSliceProto.Extent": [
        ("start", 1, "int64", _OPT, None),
        ("length", 2, "int64", _OPT, None),
    ],
    "TensorSliceProto": [("extent", 1, "message", _REP, ".tensorflow.TensorSliceProto.Extent")],
    "BundleEntryProto": [
        ("dtype", 1, "enum", _OPT, ".tensorflow.DataType"),
        ("shape", 2, "message", _OPT, ".tensorflow.TensorShapeProto"),
        ("shard_id", 3, "int32", _OPT, None),
        ("offset", 4, "int64", _OPT, None),
        ("size", 5, "int64", _OPT, None),
        ("crc32c", 6, "fixed32", _OPT, None),
        ("slices", 7, "message", _REP, ".tensorflow.TensorSliceProto"),
    ],
    # saved_model.proto, meta_graph.proto, saver.proto: what a SavedModel loader reads.
    # A sparse or composite TensorInfo has no name (its other encodings stay unknown).
    "TensorInfo": [
        ("name", 1, "string", _OPT, None),
        ("dtype", 2, "enum", _OPT, ".tensorflow.DataType"),
        ("tensor_shape", 3, "message", _OPT, ".tensorflow.TensorShapeProto"),
    ],
    "SignatureDef": [
        ("inputs", 1, "message", _REP, ".tensorflow.SignatureDef.InputsEntry"),
        ("outputs", 2, "message", _REP, ".tensorflow.SignatureDef.OutputsEntry"),
        ("method_name", 3, "string", _OPT, None),
    ],
    "SaverDef": [
        ("filename_tensor_name", 1, "string", _OPT, None),
        ("save_tensor_name", 2, "string", _OPT, None),
        ("restore_op_name", 3, "string", _OPT, None),
    ],
    "MetaGraphDef.MetaInfoDef": [
        ("meta_graph_version", 1, "string", _OPT, None),
        ("tags", 4, "string", _REP, None),
        ("tensorflow_version", 5, "string", _OPT, None),
    ],
    "MetaGraphDef": [
        ("meta_info_def", 1, "message", _OPT, ".tensorflow.MetaGraphDef.MetaInfoDef"),
        ("graph_def", 2, "message", _OPT, ".tensorflow.GraphDef"),
        ("saver_def", 3, "message", _OPT, ".tensorflow.SaverDef"),
        ("signature_def", 5, "message", _REP, ".tensorflow.MetaGraphDef.SignatureDefEntry"),
    ],
    "SavedModel": [
        ("saved_model_schema_version", 1, "int64", _OPT, None),
        ("meta_graphs", 2, "message", _REP, ".tensorflow.MetaGraphDef"),
    ],
}

#: map<string, V> fields: (owner message, entry message name, value message).
_MAP_ENTRIES = (
    ("NodeDef", "AttrEntry", "AttrValue"),
    ("NameAttrList", "AttrEntry", "AttrValue"),
    ("SignatureDef", "InputsEntry", "TensorInfo"),
    ("SignatureDef", "OutputsEntry", "TensorInfo"),
    ("MetaGraphDef", "SignatureDefEntry", "SignatureDef"),
)
_ONEOFS = {"AttrValue": "value"}


@dataclass(frozen=True, slots=True)
class Messages:
    """The generated message classes (and protobuf's text_format / DecodeError)."""

    GraphDef: Any
    NodeDef: Any
    AttrValue: Any
    TensorProto: Any
    TensorShapeProto: Any
    text_format: Any
    DecodeError: type[Exception]
    SavedModel: Any
    BundleHeaderProto: Any
    BundleEntryProto: Any


_lock = threading.Lock()


@functools.cache
def messages() -> Messages:
    """Compile the schema once; ``ImportError`` saying how to install protobuf."""
    try:
        # Imported by name: protobuf ships no type information, and a user's
        # `mypy --strict` would otherwise report its missing stubs from inside asyncflow.
        descriptor_pb2, descriptor_pool, message_factory, text_format = (
            importlib.import_module(f"google.protobuf.{name}")
            for name in ("descriptor_pb2", "descriptor_pool", "message_factory", "text_format")
        )
        DecodeError = importlib.import_module("google.protobuf.message").DecodeError
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading TensorFlow graphs needs the protobuf package: pip install 'asyncflow[tf]'"
        ) from exc
    with _lock:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(_file_proto(descriptor_pb2))

        def cls(name: str) -> Any:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{name}"))

        return Messages(
            cls("GraphDef"),
            cls("NodeDef"),
            cls("AttrValue"),
            cls("TensorProto"),
            cls("TensorShapeProto"),
            text_format,
            DecodeError,
            cls("SavedModel"),
            cls("BundleHeaderProto"),
            cls("BundleEntryProto"),
        )


def _file_proto(pb: Any) -> Any:
    fdp = pb.FileDescriptorProto(
        name="asyncflow/compat/tensorflow_graph.proto", package="tensorflow", syntax="proto3"
    )
    enum = fdp.enum_type.add(name="DataType")
    for name, number in DATA_TYPES.items():
        enum.value.add(name=name, number=number)
        if number:
            enum.value.add(name=name + "_REF", number=number + 100)
    types = {
        "int64": pb.FieldDescriptorProto.TYPE_INT64,
        "int32": pb.FieldDescriptorProto.TYPE_INT32,
        "uint32": pb.FieldDescriptorProto.TYPE_UINT32,
        "uint64": pb.FieldDescriptorProto.TYPE_UINT64,
        "fixed32": pb.FieldDescriptorProto.TYPE_FIXED32,
        "string": pb.FieldDescriptorProto.TYPE_STRING,
        "bytes": pb.FieldDescriptorProto.TYPE_BYTES,
        "bool": pb.FieldDescriptorProto.TYPE_BOOL,
        "float": pb.FieldDescriptorProto.TYPE_FLOAT,
        "double": pb.FieldDescriptorProto.TYPE_DOUBLE,
        "enum": pb.FieldDescriptorProto.TYPE_ENUM,
        "message": pb.FieldDescriptorProto.TYPE_MESSAGE,
    }
    labels = {
        _OPT: pb.FieldDescriptorProto.LABEL_OPTIONAL,
        _REP: pb.FieldDescriptorProto.LABEL_REPEATED,
    }
    built: dict[str, Any] = {}
    for full, fields in sorted(_MESSAGES.items(), key=lambda kv: kv[0].count(".")):
        outer, _, inner = full.rpartition(".")
        msg = built[outer].nested_type.add(name=inner) if outer else fdp.message_type.add(name=full)
        built[full] = msg
        oneof = _ONEOFS.get(full)
        if oneof:
            msg.oneof_decl.add(name=oneof)
        for name, number, kind, label, type_name in fields:
            field = msg.field.add(name=name, number=number, type=types[kind], label=labels[label])
            if type_name:
                field.type_name = type_name
            if oneof:
                field.oneof_index = 0
    for owner, entry_name, value in _MAP_ENTRIES:
        entry = built[owner].nested_type.add(name=entry_name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=types["string"], label=labels[_OPT])
        entry.field.add(
            name="value",
            number=2,
            type=types["message"],
            label=labels[_OPT],
            type_name=f".tensorflow.{value}",
        )
    return fdp
