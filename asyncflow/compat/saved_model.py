"""``load_saved_model``: serve a TensorFlow 1.x SavedModel without TensorFlow.

A SavedModel directory holds ``saved_model.pb`` (a ``SavedModel`` proto: one
``MetaGraphDef`` per tag set, each with a ``GraphDef`` and named ``SignatureDef`` s) and
``variables/variables.{index,data-*}``, a checkpoint in TF's tensor-bundle format
(:mod:`asyncflow.compat.tensor_bundle`).

TF's loader imports the whole graph and runs its ``save/restore_all`` op.  That graph
also holds the saver's and the initializers' op types (``SaveV2``, ``RestoreV2``,
``AssignVariableOp``, ...), which serving never runs; here the graph def is pruned to
what the signatures need, each variable read (a ``VariableV2`` node, or a
``ReadVariableOp`` of a ``VarHandleOp``) becomes an asyncflow variable of the same name,
the rest is imported by :func:`asyncflow.compat.import_tf_graph_def`, and the
checkpoint's values are assigned to the variables in the session's resource manager.
That assignment needs no step, so loading works the same with or without a running
event loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncflow import errors
from asyncflow.compat._tf_proto import messages
from asyncflow.compat._values import dtype_from_enum, shape_from_proto
from asyncflow.compat.tensor_bundle import BundleReader
from asyncflow.compat.tf_import import import_tf_graph_def
from asyncflow.framework.graph import Graph, Operation, Tensor
from asyncflow.framework.shapes import TensorShape

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SavedModel", "Signature", "load_saved_model"]

#: Op types that hold a variable's value in TF's graphs.
_REF_VARIABLES = frozenset({"VariableV2", "Variable"})


@dataclass(frozen=True, slots=True)
class _Var:
    """A variable the pruned graph reads: its checkpoint key and where it is read."""

    key: str  # checkpoint key and asyncflow variable name
    dtype: Any
    shape: TensorShape
    read: str  # the graph-def node whose output 0 is the value


class Signature:
    """One ``SignatureDef``: ``await sig(name=value, ...)`` returns ``{output: array}``.

    ``sig.run_sync(...)`` does the same from code without a running event loop (as
    ``Session.run_sync``).  Every input of the signature must be given, by its key.
    """

    __slots__ = ("_callable", "_session", "inputs", "method_name", "name", "outputs")

    def __init__(
        self,
        session: Any,
        name: str,
        inputs: dict[str, Tensor],
        outputs: dict[str, Tensor],
        method_name: str,
    ) -> None:
        self._session = session
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.method_name = method_name
        self._callable: Any = None

    def _fn(self) -> Any:
        # Compiled on first use (a benign race compiles twice; the session caches plans).
        fn = self._callable
        if fn is None:
            fn = self._callable = self._session.make_callable(
                self.outputs, feed_list=list(self.inputs.values())
            )
        return fn

    def _values(self, feeds: Mapping[str, Any]) -> list[Any]:
        unknown = sorted(set(feeds) - set(self.inputs))
        missing = sorted(set(self.inputs) - set(feeds))
        if unknown or missing:
            raise TypeError(
                f"signature {self.name!r} takes inputs {sorted(self.inputs)}; "
                f"got unknown {unknown}, missing {missing}"
            )
        return [feeds[k] for k in self.inputs]

    async def __call__(self, **feeds: Any) -> dict[str, np.ndarray]:
        values = self._values(feeds)
        out: dict[str, np.ndarray] = await self._fn()(*values)
        return out

    def run_sync(self, **feeds: Any) -> dict[str, np.ndarray]:
        """Call the signature from plain code (no event loop running in this thread)."""
        values = self._values(feeds)
        out: dict[str, np.ndarray] = self._fn().run_sync(*values)
        return out

    def __repr__(self) -> str:
        return (
            f"<Signature {self.name!r} inputs={sorted(self.inputs)} outputs={sorted(self.outputs)}>"
        )


class _Signatures(Mapping[str, Signature]):
    """The signatures by key; a missing key's ``KeyError`` names the available ones."""

    def __init__(self, export_dir: str, items: dict[str, Signature]) -> None:
        self._dir = export_dir
        self._items = items

    def __getitem__(self, key: str) -> Signature:
        try:
            return self._items[key]
        except KeyError:
            raise KeyError(
                f"SavedModel {self._dir!r} has no signature {key!r}; available: "
                f"{sorted(self._items)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class SavedModel:
    """A loaded SavedModel: its session, tags, signatures and restored variables."""

    __slots__ = ("export_dir", "session", "signatures", "tags", "variables")

    def __init__(
        self,
        export_dir: str,
        session: Any,
        tags: tuple[str, ...],
        signatures: Mapping[str, Signature],
        variables: dict[str, Operation],
    ) -> None:
        self.export_dir = export_dir
        self.session = session
        self.tags = tags
        self.signatures = signatures
        #: Checkpoint key -> the asyncflow ``VariableV2`` op holding its value.
        self.variables = variables

    def __repr__(self) -> str:
        return (
            f"<SavedModel {self.export_dir!r} tags={list(self.tags)} "
            f"signatures={sorted(self.signatures)} variables={len(self.variables)}>"
        )


def load_saved_model(
    export_dir: str | os.PathLike[str], tags: Sequence[str] = ("serve",), session: Any = None
) -> SavedModel:
    """Load the TF1 SavedModel in ``export_dir`` into ``session`` (its graph).

    The meta graph whose tag set equals ``tags`` is imported (names as TF has them, no
    prefix) with its variables restored from ``variables/``.  Without ``session`` a new
    graph and session are made (``model.session``; close it when done).

    Errors: no SavedModel there → ``NotFoundError``; unknown ``tags`` →
    ``NotFoundError`` listing the tag sets the model has; a corrupt or truncated
    ``saved_model.pb`` or checkpoint → ``DataLossError`` naming the file; a signature
    that needs unsupported op types → ``UnimplementedError`` listing them.
    """
    from asyncflow.session import Session

    path = os.fspath(export_dir)
    meta = _meta_graph(path, tuple(tags))
    if session is not None:
        if not isinstance(session, Session):
            raise TypeError(f"session must be an af.Session, got {type(session).__name__}")
        if session.internals.distributed:
            # Variables live in the cluster's workers; restoring there needs a step.
            raise errors.UnimplementedError(
                None, None, "load_saved_model into a distributed session is not supported"
            )
        return _load(path, meta, tuple(tags), session)
    session = Session(graph=Graph())
    try:
        return _load(path, meta, tuple(tags), session)
    except BaseException:
        session.close_sync()  # (made here for the model: nobody else would close it)
        raise


def _load(path: str, meta: Any, tags: tuple[str, ...], session: Any) -> SavedModel:
    """The model of ``meta`` (read from ``path``) imported into ``session`` and its
    variables restored there; all or nothing (nothing changes when a value is bad)."""
    graph: Graph = session.graph
    signature_defs = {key: meta.signature_def[key] for key in sorted(meta.signature_def)}
    names = sorted(
        {
            _tensor_name(info, key, kind, path)
            for key, sig in signature_defs.items()
            for kind, infos in (("input", sig.inputs), ("output", sig.outputs))
            for info in infos.values()
        }
    )
    graph_def, variables = _prune(meta.graph_def, set(names))
    # Every value is read and checked before the graph changes: all or nothing.
    values = _read_values(os.path.join(path, "variables", "variables"), variables)
    with graph.as_default():
        var_ops = {v.key: _variable(graph, v) for v in variables}
        input_map = {f"{_stand_in(v)}:0": var_ops[v.key].outputs[0] for v in variables}
        # A signature tensor that is a variable's value is the variable's own output.
        reads = {f"{v.read}:0": var_ops[v.key].outputs[0] for v in variables}
        imported = [n for n in names if n not in reads]
        found = import_tf_graph_def(
            graph_def.SerializeToString(), input_map=input_map, return_elements=imported, name=""
        )
    tensors: dict[str, Tensor | Operation] = {**reads, **dict(zip(imported, found or ()))}
    _restore(session, values, var_ops)
    signatures = {
        key: Signature(
            session,
            key,
            {k: _as_tensor(tensors[i.name]) for k, i in sig.inputs.items()},
            {k: _as_tensor(tensors[o.name]) for k, o in sig.outputs.items()},
            sig.method_name,
        )
        for key, sig in signature_defs.items()
    }
    return SavedModel(path, session, tags, _Signatures(path, signatures), var_ops)


# -- reading ----------------------------------------------------------------------------------


def _meta_graph(path: str, tags: tuple[str, ...]) -> Any:
    m = messages()
    pb, pbtxt = os.path.join(path, "saved_model.pb"), os.path.join(path, "saved_model.pbtxt")
    saved = m.SavedModel()
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            raw = f.read()
        try:
            saved.ParseFromString(raw)
        except m.DecodeError as exc:
            raise errors.DataLossError(
                None, None, f"cannot parse SavedModel file {pb!r} ({len(raw)} bytes): {exc}"
            ) from None
    elif os.path.exists(pbtxt):
        with open(pbtxt, encoding="utf-8") as f:
            try:
                m.text_format.Parse(f.read(), saved)
            except m.text_format.ParseError as exc:
                raise errors.DataLossError(
                    None, None, f"cannot parse SavedModel file {pbtxt!r}: {exc}"
                ) from None
    else:
        raise errors.NotFoundError(
            None,
            None,
            f"no SavedModel in {path!r}: neither saved_model.pb nor saved_model.pbtxt exists",
        )
    for meta in saved.meta_graphs:
        if set(meta.meta_info_def.tags) == set(tags):
            return meta
    available = [sorted(meta.meta_info_def.tags) for meta in saved.meta_graphs]
    raise errors.NotFoundError(
        None,
        None,
        f"SavedModel {path!r} has no meta graph with "
        f"tags {sorted(tags)}; available tag sets: "
        f"{available}",
    )


def _tensor_name(info: Any, key: str, kind: str, path: str) -> str:
    if not info.name:
        raise errors.UnimplementedError(
            None,
            None,
            f"SavedModel {path!r}: signature {kind} "
            f"{key!r} is not a dense tensor (sparse "
            f"and composite tensors are not supported)",
        )
    name: str = info.name
    return name if ":" in name else f"{name}:0"


def _as_tensor(element: Tensor | Operation) -> Tensor:
    if not isinstance(element, Tensor):
        raise TypeError(f"signature element {element!r} is an operation, not a tensor")
    return element


# -- pruning ----------------------------------------------------------------------------------


def _stand_in(var: _Var) -> str:
    """The placeholder that takes a variable read's place in the pruned graph def; it is
    mapped to the asyncflow variable, so it is never run."""
    return f"{var.read}/_saved_model_value"


def _prune(graph_def: Any, outputs: set[str]) -> tuple[Any, list[_Var]]:
    """The nodes the ``outputs`` depend on, with each variable read replaced by a stand-in.

    Control edges into a variable read are dropped (a variable always exists; its value
    comes from the checkpoint, not from an initializer).
    """
    by_name = {nd.name: nd for nd in graph_def.node}
    keep: set[str] = set()
    variables: dict[str, _Var] = {}
    stack = [name.split(":")[0] for name in outputs]
    while stack:
        name = stack.pop()
        if name in keep or name in variables:
            continue
        node = by_name.get(name)
        if node is None:
            raise errors.InvalidArgumentError(
                None, None, f"SavedModel signature names {name!r}, which is not in the graph"
            )
        var = _variable_read(node, by_name)
        if var is not None:
            variables[name] = var
            continue
        keep.add(name)
        stack.extend(i.lstrip("^").split(":")[0] for i in node.input)
    pruned = type(graph_def)()
    pruned.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name in keep:
            copy = pruned.node.add()
            copy.CopyFrom(node)
            _rewire(copy, variables)
    for var in variables.values():
        stand_in = pruned.node.add(name=_stand_in(var), op="Placeholder")
        stand_in.attr["dtype"].type = var.dtype
    return pruned, sorted(variables.values(), key=lambda v: v.key)


def _variable_read(node: Any, by_name: dict[str, Any]) -> _Var | None:
    """A ``_Var`` when ``node``'s output 0 is a variable's value, else None."""
    if node.op in _REF_VARIABLES:
        return _Var(
            node.name,
            node.attr["dtype"].type,
            shape_from_proto(node.attr["shape"].shape),
            node.name,
        )
    if node.op == "VarHandleOp":
        raise errors.UnimplementedError(
            None, None, f"resource variable {node.name!r} is used other than by ReadVariableOp"
        )
    if node.op != "ReadVariableOp" or not node.input:
        return None
    handle = by_name.get(node.input[0].split(":")[0])
    if handle is None or handle.op != "VarHandleOp":
        return None
    key = handle.attr["shared_name"].s.decode() or handle.name
    return _Var(
        key, handle.attr["dtype"].type, shape_from_proto(handle.attr["shape"].shape), node.name
    )


def _rewire(node: Any, variables: dict[str, _Var]) -> None:
    inputs = []
    for i in node.input:
        producer = i.lstrip("^").split(":")[0]
        var = variables.get(producer)
        if var is None:
            inputs.append(i)
        elif not i.startswith("^"):
            inputs.append(_stand_in(var) + i[len(producer) :])
    del node.input[:]
    node.input.extend(inputs)


# -- variables --------------------------------------------------------------------------------


def _variable(graph: Graph, var: _Var) -> Operation:
    dt = dtype_from_enum(var.dtype, f"variable {var.key!r}")
    attrs = {
        "dtype": dt,
        "shape": var.shape,
        "var_name": var.key,
        "container": "",
        "shared_name": var.key,
    }
    with graph.name_scope(None), graph.control_dependencies(None):
        return graph.create_op("VariableV2", (), attrs, name=var.key)


def _read_values(prefix: str, variables: list[_Var]) -> dict[str, np.ndarray]:
    """Each variable's checkpoint value, its dtype and shape checked against the graph."""
    if not variables:
        return {}
    reader = BundleReader(prefix)
    values = {}
    for var in variables:
        want = dtype_from_enum(var.dtype, f"variable {var.key!r}")
        dt, shape = reader.dtype_and_shape(var.key)
        if dt is not want or not var.shape.is_compatible_with(shape):
            raise errors.InvalidArgumentError(
                None,
                None,
                f"variable {var.key!r} is {want.name} {var.shape}, checkpoint "
                f"{prefix!r} holds {dt.name} {list(shape)}",
            )
        values[var.key] = reader.read(var.key)
    return values


def _restore(session: Any, values: dict[str, np.ndarray], var_ops: dict[str, Operation]) -> None:
    """Assign each variable its value in the session's resource manager (no step needed)."""
    from asyncflow.ops.state_ops import _store

    for key, value in values.items():
        _store(var_ops[key], session.internals.resources).assign(value)
