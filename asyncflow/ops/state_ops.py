"""Variables: state that persists across the runs of a session.

``af.Variable(initial_value)`` adds a ``VariableV2`` op (whose output is the
variable's value in a step), an ``Assign`` initializer, and records itself for
``af.global_variables_initializer()``.  The value lives in the session's resource
manager (one value per session, as in TensorFlow), so it persists across runs and
is shared by concurrent steps on any loop or thread; ``assign_add`` /
``assign_sub`` are atomic read-modify-writes.  Reading before initialization is a
``FailedPreconditionError`` naming the variable.  Assign ops are colocated with
their variable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import (
    Graph,
    Operation,
    Tensor,
    TensorOperators,
    convert_to_tensor,
    get_default_graph,
)
from asyncflow.framework.shapes import TensorShape, as_shape
from asyncflow.ops._base import define_op
from asyncflow.runtime.resources import ResourceMgr, VariableStore

__all__ = ["Variable", "global_variables", "global_variables_initializer", "variables_initializer"]


def _variable_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return [(attrs["dtype"], attrs["shape"])]


def _assign_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    (value,) = inputs
    if value._dtype is not attrs["dtype"]:
        raise TypeError(
            f"cannot assign a {value._dtype.name} value to variable "
            f"{attrs['var_name']!r} of dtype {attrs['dtype'].name}"
        )
    if not attrs["shape"].is_compatible_with(value._shape):
        raise ValueError(
            f"cannot assign a value of shape {value._shape} to variable "
            f"{attrs['var_name']!r} of shape {attrs['shape']}"
        )
    return [(attrs["dtype"], attrs["shape"])]


define_op("VariableV2", _variable_shape, stateful=True)
define_op("ReadVariableOp", _variable_shape, stateful=True)
for _t in ("Assign", "AssignAdd", "AssignSub"):
    define_op(_t, _assign_shape, stateful=True)


def _store(op: Operation, resources: ResourceMgr) -> VariableStore:
    name = op._attrs["var_name"]
    np_dtype = op._attrs["dtype"].np
    return resources.lookup_or_create(
        "", name, VariableStore, lambda: VariableStore(name, np_dtype)
    )


@registry.register_kernel_factory("VariableV2", needs_resources=True)
@registry.register_kernel_factory("ReadVariableOp", needs_resources=True)
def _read_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    return _store(op, resources).read, registry.INLINE


@registry.register_kernel_factory("Assign", needs_resources=True)
def _assign_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    return _store(op, resources).assign, registry.INLINE


@registry.register_kernel_factory("AssignAdd", needs_resources=True)
def _assign_add_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    store = _store(op, resources)
    return (lambda delta: store.update(lambda v: v + delta)), registry.INLINE


@registry.register_kernel_factory("AssignSub", needs_resources=True)
def _assign_sub_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    store = _store(op, resources)
    return (lambda delta: store.update(lambda v: v - delta)), registry.INLINE


class Variable(TensorOperators):
    """A value that persists across runs of a session (TF 1.x ``tf.Variable``).

    Usable wherever a Tensor is (it converts to its value); fetching it gives its
    value, feeding it replaces its value for one step.  ``assign``, ``assign_add``
    and ``assign_sub`` return the new value and can be control dependencies.
    """

    def __init__(
        self,
        initial_value: Any = None,
        trainable: bool = True,
        name: str | None = None,
        dtype: Any = None,
        shape: Any = None,
    ) -> None:
        if initial_value is None:
            raise ValueError("af.Variable needs an initial_value")
        graph = get_default_graph()
        with graph.name_scope(name or "Variable") as scope, graph.control_dependencies(None):
            if callable(initial_value):
                initial_value = initial_value()
            init = convert_to_tensor(initial_value, dtype=dtype, name="initial_value")
            var_shape = as_shape(shape) if shape is not None else init.shape
            self._graph: Graph = graph
            self._dtype = init.dtype
            self._shape = var_shape
            self._name = scope[:-1]
            attrs = {
                "dtype": init.dtype,
                "shape": var_shape,
                "var_name": self._name,
                "container": "",
                "shared_name": self._name,
            }
            self._variable = graph.create_op("VariableV2", (), attrs, name=scope)
            self._attrs = attrs
            with graph.colocate_with(self._variable):
                self._initializer = graph.create_op("Assign", (init,), attrs, name="Assign")
        self._initial_value = init
        graph._variables.append(self)

    # -- TF's attributes -----------------------------------------------------------------

    @property
    def name(self) -> str:
        """``"name:0"``, as TensorFlow."""
        return f"{self._name}:0"

    @property
    def op(self) -> Operation:
        """The ``VariableV2`` operation."""
        return self._variable

    @property
    def dtype(self) -> dtypes.DType:
        """The element type."""
        return self._dtype

    @property
    def shape(self) -> TensorShape:
        """The static shape."""
        return self._shape

    def get_shape(self) -> TensorShape:
        """The static shape."""
        return self._shape

    @property
    def graph(self) -> Graph:
        """The graph the variable belongs to."""
        return self._graph

    @property
    def device(self) -> str:
        """The variable's requested device."""
        return self._variable.device

    @property
    def initializer(self) -> Operation:
        """The op that assigns the initial value."""
        return self._initializer

    @property
    def initial_value(self) -> Tensor:
        """The tensor the variable is initialized from."""
        return self._initial_value

    def value(self) -> Tensor:
        """The variable's value in a step (its ``VariableV2`` output)."""
        return self._variable.outputs[0]

    def _as_graph_element(self) -> Tensor:
        return self._variable.outputs[0]

    def read_value(self) -> Tensor:
        """A new read of the variable: runs after the current control dependencies."""
        with self._graph.colocate_with(self._variable):
            return self._graph.create_op("ReadVariableOp", (), self._attrs, name="read").outputs[0]

    def _update(self, op_type: str, value: Any, name: str | None) -> Tensor:
        v = convert_to_tensor(value, dtype=self._dtype)
        with self._graph.colocate_with(self._variable):
            return self._graph.create_op(op_type, (v,), self._attrs, name=name or op_type).outputs[
                0
            ]

    def assign(
        self,
        value: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Tensor:
        """Set the value; returns the new value (a tensor usable as a dependency)."""
        return self._update("Assign", value, name)

    def assign_add(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Tensor:
        """Add ``delta`` atomically; returns the new value."""
        return self._update("AssignAdd", delta, name)

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool = False,
        name: str | None = None,
        read_value: bool = True,
    ) -> Tensor:
        """Subtract ``delta`` atomically; returns the new value."""
        return self._update("AssignSub", delta, name)

    def __repr__(self) -> str:
        return f"<af.Variable '{self.name}' shape={self._shape} dtype={self._dtype.name}>"

    def __bool__(self) -> bool:
        raise TypeError(f"using af.Variable {self.name!r} as a Python bool is not allowed")

    def __iter__(self) -> Any:
        raise TypeError(f"af.Variable {self.name!r} is not iterable")


def global_variables(graph: Graph | None = None) -> list[Variable]:
    """Every variable created in the (default) graph, in creation order."""
    return list((graph or get_default_graph())._variables)


def variables_initializer(var_list: Sequence[Variable], name: str = "init") -> Operation:
    """One op that runs every variable's initializer."""
    from asyncflow.ops.array_ops import group, no_op

    if not var_list:
        return no_op(name=name)
    return group(*[v.initializer for v in var_list], name=name)


def global_variables_initializer() -> Operation:
    """Initialize every variable of the default graph (``sess.run(init)``)."""
    return variables_initializer(global_variables(), name="init")
