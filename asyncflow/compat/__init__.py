"""TensorFlow compatibility: read and write TensorFlow's own ``GraphDef`` protobufs.

``import_tf_graph_def`` runs frozen TF 1.x graphs (``.pb`` / ``.pbtxt``);
``export_tf_graph_def`` writes an asyncflow graph of TF-equivalent ops as a ``GraphDef``
TensorFlow can load; ``load_saved_model`` serves a TF1 SavedModel's signatures.  All
need ``protobuf`` (``pip install 'asyncflow[tf]'``), imported only when they are called.
"""

from __future__ import annotations

from asyncflow.compat.saved_model import SavedModel, Signature, load_saved_model
from asyncflow.compat.tf_export import export_tf_graph_def
from asyncflow.compat.tf_import import import_tf_graph_def, supported_tf_op_types

__all__ = [
    "SavedModel",
    "Signature",
    "export_tf_graph_def",
    "import_tf_graph_def",
    "load_saved_model",
    "supported_tf_op_types",
]
