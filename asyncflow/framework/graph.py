"""Graph building: :class:`Graph`, :class:`Operation`, :class:`Tensor` and scopes.

A Graph is append-only: operations are added, never changed or removed, so a plan
compiled for some fetches stays valid while the graph grows.  Reading a graph is
safe from any thread; adding to it takes the graph's lock.  The context stacks
(default graph, name scope, control dependencies, device) are per thread, as in
TensorFlow.

Each operation records where in user code it was created (``op.traceback``: the
first stack frame outside asyncflow), so runtime errors can point at that line.
"""

from __future__ import annotations

import collections.abc
import contextlib
import gc
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

from asyncflow import dtypes as _dtypes
from asyncflow._backend import require_asyncio
from asyncflow.framework import registry
from asyncflow.framework.shapes import TensorShape, as_shape

__all__ = [
    "Graph",
    "Operation",
    "Tensor",
    "TensorLike",
    "colocate_with",
    "control_dependencies",
    "convert_to_tensor",
    "device",
    "get_default_graph",
    "name_scope",
    "reset_default_graph",
]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_find_op_def = registry.find_op_def
_new_operation = object.__new__
_new_tensor = object.__new__
#: The attributes of an op made without any (the operator fast path): one read-only
#: mapping shared by all of them, not an empty dict per op (64 bytes each).
_NO_ATTRS: Any = types.MappingProxyType({})

#: A graph promotes the young objects every ``_PROMOTE_MASK + 1`` ops it adds.
_PROMOTE_MASK = (1 << 12) - 1


def _promote_young() -> None:
    """Move every young GC-tracked object to the oldest generation without a collection.

    A graph's ops and tensors live as long as the graph and reference each other: each
    young and middle collection scans them for nothing, and as they pile up in the
    oldest generation they trigger full collections of the whole heap (a fifth of the
    time to build a 100,000-op chain).  ``gc.freeze()`` + ``gc.unfreeze()`` moves them
    (and whatever else is young at that moment) to the oldest generation in constant
    time, without counting towards the next full collection, as ``gc_paused`` does after
    a large compile.  The application's young garbage cycles of that moment (at most a
    young and a middle generation's worth, every 4,096 ops) wait for the next full
    collection.  Not when the collector is off, nor when the application froze objects
    itself: unfreezing would thaw them.
    """
    if gc.isenabled() and gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


class SupportsTensor(Protocol):
    """Anything that stands for a tensor in an op's input (an ``af.Variable``)."""

    def _as_graph_element(self) -> Tensor: ...


if TYPE_CHECKING:
    import numpy.typing as npt

    #: What an op input or an operator operand may be: a tensor, a variable, or a
    #: constant value (a number, a string, a nested list, a numpy array).
    TensorLike: TypeAlias = "Tensor | SupportsTensor | npt.ArrayLike"
else:
    TensorLike = Any


def _not_installed(name: str) -> Callable[..., Tensor]:
    def operator(*args: Any) -> Tensor:
        raise RuntimeError(
            f"tensor operator {name!r} is not installed: import asyncflow "
            f"(asyncflow.ops.math_ops installs the operators)"
        )

    return operator


#: Python operators on tensors, filled by ``asyncflow.ops.math_ops`` (which owns the
#: ops they build) so that framework/ never imports ops/.  Keys: "add", "radd", ...
#: Every key is present from the start (a stub raising until the real one is set),
#: so an operator is one dict lookup and one call.
_OPERATORS: dict[str, Callable[..., Tensor]] = {
    name: _not_installed(name)
    for base in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "matmul",
        "and",
        "or",
        "xor",
    )
    for name in (base, f"r{base}")
}
_OPERATORS.update(
    (name, _not_installed(name))
    for name in ("lt", "le", "gt", "ge", "neg", "abs", "invert", "getitem")
)


class TensorOperators:
    """Python operators that build ops, shared by :class:`Tensor` and ``af.Variable``.

    Real, typed methods (a type checker sees ``x * 2.0`` as a ``Tensor``); each one
    looks up the op constructor ``asyncflow.ops.math_ops`` installed for it.
    """

    __slots__ = ()

    # numpy defers to us: ``ndarray + tensor`` calls ``tensor.__radd__``.
    __array_priority__ = 100
    __array_ufunc__ = None

    def __add__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["add"](self, other)

    def __radd__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["radd"](self, other)

    def __sub__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["sub"](self, other)

    def __rsub__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rsub"](self, other)

    def __mul__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["mul"](self, other)

    def __rmul__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rmul"](self, other)

    def __truediv__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["truediv"](self, other)

    def __rtruediv__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rtruediv"](self, other)

    def __floordiv__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["floordiv"](self, other)

    def __rfloordiv__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rfloordiv"](self, other)

    def __mod__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["mod"](self, other)

    def __rmod__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rmod"](self, other)

    def __pow__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["pow"](self, other)

    def __rpow__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rpow"](self, other)

    def __matmul__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["matmul"](self, other)

    def __rmatmul__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rmatmul"](self, other)

    def __and__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["and"](self, other)

    def __rand__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rand"](self, other)

    def __or__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["or"](self, other)

    def __ror__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["ror"](self, other)

    def __xor__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["xor"](self, other)

    def __rxor__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["rxor"](self, other)

    def __lt__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["lt"](self, other)

    def __le__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["le"](self, other)

    def __gt__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["gt"](self, other)

    def __ge__(self, other: TensorLike) -> Tensor:
        return _OPERATORS["ge"](self, other)

    def __neg__(self) -> Tensor:
        return _OPERATORS["neg"](self)

    def __abs__(self) -> Tensor:
        return _OPERATORS["abs"](self)

    def __invert__(self) -> Tensor:
        return _OPERATORS["invert"](self)

    def __getitem__(self, key: Any) -> Tensor:
        return _OPERATORS["getitem"](self, key)


class _Runner(Protocol):
    """What :meth:`Tensor.eval` and :meth:`Operation.run` need of a session."""

    def run(
        self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None
    ) -> collections.abc.Coroutine[Any, Any, Any]: ...

    def run_sync(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None) -> Any: ...


class _MustAwait(collections.abc.Coroutine[Any, Any, Any]):
    """What ``Tensor.eval`` / ``Operation.run`` return: their coroutine, which says what
    to do when it is used as a value.

    TF 1.x code calls ``y.eval(session=s)`` for the value; here that is a coroutine,
    and without ``await`` it would print as ``<coroutine ...>`` or fail far away in
    numpy.  Using it as a value is a ``TypeError`` naming the fix, and one never
    awaited warns (``RuntimeWarning``) with the same advice when it is collected.
    ``asyncio.run(...)`` and ``await`` take it as any coroutine.
    """

    __slots__ = ("_coro", "_started", "_what")

    def __init__(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        self._coro = coro
        self._what = what  # e.g. "tensor 'y:0'.eval"
        self._started = False

    def __await__(self) -> Generator[Any, None, Any]:
        self._started = True
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        self._started = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._started = True
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # (the deprecated three-argument form)

    def close(self) -> None:
        self._started = True
        self._coro.close()

    def _advice(self) -> str:
        sync = self._what.replace(".eval", ".eval_sync").replace(".run", ".run_sync")
        return (
            f"{self._what}(...) returns a coroutine: `await` it in async code, or "
            f"call {sync}(..., session=sess) in plain code"
        )

    def _misused(self, *args: Any) -> Any:
        raise TypeError(f"{self._advice()} (it was used as a value without await)")

    __bool__ = __float__ = __int__ = __index__ = __len__ = __iter__ = _misused
    __array__ = __getitem__ = __add__ = __radd__ = __sub__ = __rsub__ = _misused
    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _misused

    def __repr__(self) -> str:
        return f"<unawaited {self._what}(): {self._advice()}>"

    def __del__(self) -> None:
        if not self._started:
            self._coro.close()  # (instead of Python's warning without the advice)
            warnings.warn(
                f"{self._what}(...) was never awaited; {self._advice()}",
                RuntimeWarning,
                stacklevel=2,
            )


def _require_session(session: _Runner | None, what: str) -> _Runner:
    if session is None:
        raise ValueError(
            f"cannot evaluate {what}: asyncflow has no default session; pass session=sess"
        )
    return session


class Tensor(TensorOperators):
    """One output of an :class:`Operation`: a symbolic handle to a value of a step.

    Tensors hash and compare by identity; ``bool(tensor)`` is a ``TypeError``.
    Arithmetic and comparison operators build ops (``x + 1`` adds an ``Add``).
    """

    __slots__ = ("__weakref__", "_dtype", "_op", "_shape", "_value_index")

    def __init__(
        self, op: Operation, value_index: int, dtype: _dtypes.DType, shape: TensorShape
    ) -> None:
        self._op = op
        self._value_index = value_index
        self._dtype = dtype
        self._shape = shape

    @property
    def op(self) -> Operation:
        """The Operation that produces this tensor."""
        return self._op

    @property
    def value_index(self) -> int:
        """The index of this tensor among its op's outputs."""
        return self._value_index

    @property
    def name(self) -> str:
        """``"op_name:index"``."""
        return f"{self._op._name}:{self._value_index}"

    @property
    def dtype(self) -> _dtypes.DType:
        """The element type."""
        return self._dtype

    @property
    def shape(self) -> TensorShape:
        """The static shape (``None`` for unknown dimensions)."""
        return self._shape

    def get_shape(self) -> TensorShape:
        """The static shape (TensorFlow 1.x name)."""
        return self._shape

    def set_shape(self, shape: Any) -> None:
        """Refine the static shape with what the caller knows (as TF's ``set_shape``).

        The result is the shape merged with ``shape``; ops built afterwards see it.
        A ``py_func`` output (unknown shape) is the usual case.  ``ValueError`` naming
        the tensor when the shapes are incompatible.  Static information only: a
        step does not check values against it.
        """
        new = as_shape(shape)
        try:
            merged = self._shape.merge_with(new)
        except ValueError:
            raise ValueError(
                f"cannot set the shape of tensor {self.name!r} to {new}: it "
                f"is incompatible with its shape {self._shape}"
            ) from None
        self._shape = merged

    def eval(
        self, feed_dict: Mapping[Any, Any] | None = None, session: _Runner | None = None
    ) -> Coroutine[Any, Any, Any]:
        """The tensor's value in one step: ``await sess.run(tensor, feed_dict)`` (TF's
        shortcut).  In plain code use :meth:`eval_sync`; the coroutine used as a value
        without ``await`` is a ``TypeError`` saying so."""
        return _MustAwait(self._eval(feed_dict, session), f"tensor {self.name!r}.eval")

    async def _eval(self, feed_dict: Mapping[Any, Any] | None, session: _Runner | None) -> Any:
        require_asyncio(f"tensor {self.name!r}.eval()")
        return await _require_session(session, f"tensor {self.name!r}").run(self, feed_dict)

    def eval_sync(
        self, feed_dict: Mapping[Any, Any] | None = None, session: _Runner | None = None
    ) -> Any:
        """The tensor's value from plain code (TF's synchronous ``eval``):
        ``sess.run_sync(tensor, feed_dict)``."""
        return _require_session(session, f"tensor {self.name!r}").run_sync(self, feed_dict)

    @property
    def graph(self) -> Graph:
        """The graph this tensor belongs to."""
        return self._op._graph

    @property
    def device(self) -> str:
        """The device of the producing op."""
        return self._op._device

    def consumers(self) -> list[Operation]:
        """The operations that take this tensor as a data input (scans the graph)."""
        return [op for op in self._op._graph._ops if self in op._inputs]

    def __repr__(self) -> str:
        return f"<af.Tensor '{self.name}' shape={self._shape} dtype={self._dtype.name}>"

    def __bool__(self) -> bool:
        raise TypeError(
            f"using af.Tensor {self.name!r} as a Python bool is not allowed: its value "
            f"is only known when a step runs. Use af.cond for data-dependent control flow."
        )

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(
            f"af.Tensor {self.name!r} is not iterable; index or slice it "
            f"(tensor[i]) or use af.unstack-like ops instead"
        )

    def __index__(self) -> int:
        raise TypeError(f"af.Tensor {self.name!r} cannot be used as a Python index")

    if not TYPE_CHECKING:
        # Hidden from type checkers: with it, numpy's stubs would take a Tensor as
        # array-like and type `ndarray * tensor` as an ndarray (it is a Tensor:
        # __array_ufunc__ = None makes numpy defer to __rmul__).
        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            raise TypeError(
                f"cannot convert symbolic af.Tensor {self.name!r} to a numpy "
                f"array; fetch it with sess.run"
            )


class Operation:
    """A node of the graph: an op type, inputs, attributes, outputs and a device."""

    __slots__ = (
        "__weakref__",
        "_attrs",
        "_control_inputs",
        "_ctx",
        "_device",
        "_file",
        "_graph",
        "_in0",
        "_in1",
        "_ir",
        "_line",
        "_name",
        "_op_def",
        "_out",
        "_type",
    )

    # Inputs and outputs are kept without a tuple for the common cases: a large graph
    # is mostly ops of one or two inputs and one output, and every object kept per op
    # is one more for each garbage-collector pass over the graph while it is built
    # (a third of the build time of a 100,000-op chain).  ``_inputs`` / ``_outputs``
    # make the tuples.
    #: The inputs: ``_in0`` the first, ``_in1`` the second, for one or two inputs
    #: (``_in1`` None for one); ``_in0`` the tuple of them for none or more than two.
    _in0: Tensor | tuple[Tensor, ...]
    _in1: Tensor | None
    #: The output: the Tensor itself for a single-output op, else the tuple of outputs.
    _out: Tensor | tuple[Tensor, ...]

    _graph: Graph
    _name: str
    _type: str
    _control_inputs: tuple[Operation, ...]
    _attrs: dict[str, Any]
    _device: str
    _op_def: registry.OpDef
    #: Where the op was made, kept as two fields and formatted only when asked
    #: (op.traceback, an error message, the IR).
    _file: str
    _line: int
    #: The control-flow context (cond branch / while loop) the op was built in.
    _ctx: Any
    #: The op's compiler IR node, made on first compile (see compiler.ir).
    _ir: Any

    # No __init__: every op is made by Graph._add_op_locked, which sets the fields one
    # by one on a bare object (the one construction path; see its docstring).

    def _set_inputs(self, inputs: tuple[Tensor, ...]) -> None:
        n = len(inputs)
        if n == 2:
            self._in0, self._in1 = inputs
        elif n == 1:
            self._in0 = inputs[0]
            self._in1 = None
        else:
            self._in0 = inputs
            self._in1 = None

    @property
    def _inputs(self) -> tuple[Tensor, ...]:
        first = self._in0
        if isinstance(first, tuple):
            return first
        second = self._in1
        return (first,) if second is None else (first, second)

    @property
    def _outputs(self) -> tuple[Tensor, ...]:
        out = self._out
        return (out,) if type(out) is Tensor else out  # type: ignore[return-value]

    @property
    def name(self) -> str:
        """The unique name of this op in its graph."""
        return self._name

    @property
    def type(self) -> str:
        """The op type, e.g. ``"MatMul"``."""
        return self._type

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The data inputs."""
        return self._inputs

    @property
    def control_inputs(self) -> tuple[Operation, ...]:
        """The ops that must run before this one."""
        return self._control_inputs

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """The output tensors."""
        return self._outputs

    @property
    def device(self) -> str:
        """The requested device string ("" when none)."""
        return self._device

    @property
    def graph(self) -> Graph:
        """The graph this op belongs to."""
        return self._graph

    @property
    def traceback(self) -> str:
        """Where in user code this op was created, as ``"file:line"`` (``"file"`` for an
        op loaded from a graph file)."""
        return f"{self._file}:{self._line}" if self._line else self._file

    @property
    def stateful(self) -> bool:
        """True when the op has side effects or state (never folded or deduplicated)."""
        return self._op_def.stateful

    @property
    def attrs(self) -> Mapping[str, Any]:
        """A read-only view of the attributes."""
        return dict(self._attrs)

    def get_attr(self, name: str) -> Any:
        """The value of attribute ``name``; ``ValueError`` naming the op if absent."""
        try:
            return self._attrs[name]
        except KeyError:
            raise ValueError(
                f"operation {self._name!r} (type {self._type}) has no attr named {name!r}"
            ) from None

    def node_attrs(self) -> dict[str, Any]:
        """The attributes a kernel receives (those not starting with ``_``)."""
        return {k: v for k, v in self._attrs.items() if not k.startswith("_")}

    def values(self) -> tuple[Tensor, ...]:
        """The outputs (TensorFlow 1.x name)."""
        return self._outputs

    def run(
        self, feed_dict: Mapping[Any, Any] | None = None, session: _Runner | None = None
    ) -> Coroutine[Any, Any, None]:
        """Run this op in one step: ``await sess.run(op, feed_dict)`` (TF's shortcut).
        In plain code use :meth:`run_sync`."""
        return _MustAwait(self._run(feed_dict, session), f"operation {self._name!r}.run")

    async def _run(self, feed_dict: Mapping[Any, Any] | None, session: _Runner | None) -> None:
        require_asyncio(f"operation {self._name!r}.run()")
        await _require_session(session, f"operation {self._name!r}").run(self, feed_dict)

    def run_sync(
        self, feed_dict: Mapping[Any, Any] | None = None, session: _Runner | None = None
    ) -> None:
        """Run this op from plain code (TF's synchronous ``run``):
        ``sess.run_sync(op, feed_dict)``."""
        _require_session(session, f"operation {self._name!r}").run_sync(self, feed_dict)

    def __repr__(self) -> str:
        return f"<af.Operation '{self._name}' type={self._type}>"


@contextlib.contextmanager
def _pushed(graph: Graph, stack: list[Any], item: Any) -> Iterator[None]:
    """``item`` on top of a per-thread context stack for the duration of the block."""
    graph._scope_opened()
    stack.append(item)
    try:
        yield
    finally:
        stack.pop()
        graph._scope_closed()


@contextlib.contextmanager
def _cleared(graph: Graph, stacks: Any, name: str) -> Iterator[None]:
    """The per-thread stack ``name`` emptied for the duration of the block."""
    graph._scope_opened()
    saved = getattr(stacks, name)
    setattr(stacks, name, [])
    try:
        yield
    finally:
        setattr(stacks, name, saved)
        graph._scope_closed()


class _ThreadStacks(threading.local):
    def __init__(self) -> None:
        self.name_scope = ""
        self.control: list[list[Operation]] = []
        self.device: list[str] = []
        self.colocate: list[Operation] = []
        self.cf_context: list[Any] = []


class Graph:
    """A dataflow graph of :class:`Operation` objects (append-only, thread-safe to read)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._ops: list[Operation] = []
        self._by_name: dict[str, Operation] = {}
        self._names_in_use: dict[str, int] = {}
        self._finalized = False
        self._stacks = _ThreadStacks()
        #: How many scope blocks (name scope, control dependencies, device,
        #: colocation, control-flow context) are open on this graph in any thread.
        #: At zero every thread's stacks are empty: ``_create_op`` skips reading them.
        self._scopes = 0
        self._unfeedable: set[Tensor] = set()
        self._variables: list[Any] = []  # af.Variable objects, for global_variables()
        self._unfetchable: set[Operation] = set()
        #: The graph-level random seed (af.set_random_seed); None when unset.
        self._seed: int | None = None
        #: The function library (``af.Defun``): function name -> its definition.  A
        #: call op's type is the function's name (TF's FunctionLibraryDefinition).
        self._functions: dict[str, Any] = {}
        #: Ops dropped by a failed :meth:`_all_or_nothing` block (``version`` counts them).
        self._dropped = 0

    # -- building ---------------------------------------------------------------

    def create_op(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
        *,
        control_inputs: Iterable[Operation] = (),
    ) -> Operation:
        """Add an op of a registered type.  Runs its shape function.

        Build-time errors (bad dtypes → ``TypeError``, incompatible shapes →
        ``ValueError``) name the op.
        """
        return self._create_op(op_type, inputs, attrs, name, control_inputs, 2)

    def _create_op(
        self,
        op_type: str,
        inputs: Iterable[Tensor],
        attrs: Mapping[str, Any] | None,
        name: str | None,
        control_inputs: Iterable[Operation],
        depth: int,
        trusted: bool = False,
    ) -> Operation:
        """:meth:`create_op`, for the op constructors: ``depth`` frames above this one
        are asyncflow's own (the search for the user's line starts above them);
        ``trusted``: the caller checked that the inputs are tensors of this graph, and
        ``name`` is asyncflow's own, a valid name not ending in "/" (as an op type is).
        """
        functions = self._functions
        function = functions.get(op_type) if functions else None
        if function is not None:
            op_def = function.op_def
        else:
            op_def = _find_op_def(op_type) or registry.get_op_def(op_type)
        inputs = tuple(inputs)
        if not trusted:
            for t in inputs:
                if type(t) is not Tensor or t._op._graph is not self:
                    self._check_inputs(op_type, inputs)
                    break
        # No dict per op without attributes: they share one read-only mapping.
        own_attrs: dict[str, Any] = dict(attrs) if attrs else _NO_ATTRS
        if self._scopes or control_inputs:
            scoped = self._scoped(op_type, inputs, own_attrs, control_inputs)
            inputs, controls, own_attrs, device, ctx, scope = scoped
        else:
            controls, device, ctx, scope = (), "", None, ""
        with self._lock:
            if self._finalized:
                raise self._finalized_error(op_type)
            if trusted and not scope:
                full_name = self._reserve_name_locked(name or op_type)
            else:
                full_name = self._unique_name_locked(
                    name or op_type, explicit=name is not None and not trusted, scope=scope
                )
            op = self._add_op_locked(
                full_name,
                op_type,
                inputs,
                controls,
                own_attrs,
                device,
                sys._getframe(depth),
                op_def,
                ctx,
            )
        return op

    def _create_binary_op(self, op_type: str, x: Tensor, y: Tensor, name: str) -> Tensor:
        """``_create_op(op_type, (x, y), None, name, (), 3, True)``'s output, for the
        operator fast path (``x + y``) when no scope block is open on this graph and
        no function shadows ``op_type``: the caller checked that ``x`` and ``y`` are
        tensors of this graph and ``name`` is asyncflow's own.  The same construction
        (:meth:`_add_op_locked`), with the steps that cannot apply skipped (no control
        inputs, context, device, colocation, attributes, scope);
        tests/test_build_fast_paths.py compares every field.
        """
        op_def = _find_op_def(op_type) or registry.get_op_def(op_type)
        caller = sys._getframe(3)  # above this method, the operator, __add__
        with self._lock:
            if self._finalized:
                raise self._finalized_error(op_type)
            op = self._add_op_locked(
                self._reserve_name_locked(name),
                op_type,
                (x, y),
                (),
                _NO_ATTRS,
                "",
                caller,
                op_def,
                None,
            )
        return op._out  # type: ignore[return-value]  # the binary operators' ops have one output

    def _add_op_locked(
        self,
        full_name: str,
        op_type: str,
        inputs: tuple[Tensor, ...],
        controls: tuple[Operation, ...],
        attrs: dict[str, Any],
        device: str,
        caller: Any,
        op_def: registry.OpDef,
        ctx: Any,
    ) -> Operation:
        """THE construction of an op named ``full_name`` (reserved by the caller):
        where in user code it is made (the innermost frame from ``caller`` up outside
        asyncflow), its shape function's outputs, its fields (see
        :class:`Operation`) and its entries in the graph.  Objects are made with
        their fields set one by one (no ``__init__`` call): every op of a large graph
        comes through here."""
        while caller is not None:
            code = caller.f_code
            if not code.co_filename.startswith(_PACKAGE_DIR):
                file, line = code.co_filename, caller.f_lineno
                break
            caller = caller.f_back
        else:
            file, line = "<unknown>", 0
        try:
            specs = op_def.shape_fn(inputs, attrs)
        except (TypeError, ValueError) as exc:
            raise self._shape_error_locked(exc, full_name, op_type) from None
        except Exception:
            self._release_name_locked(full_name)  # a failed op leaves no trace
            raise
        op = _new_operation(Operation)
        op._graph = self
        op._name = full_name
        op._type = op_type
        n = len(inputs)  # one or two inputs without a tuple (see Operation)
        if n == 2:
            op._in0, op._in1 = inputs
        elif n == 1:
            op._in0 = inputs[0]
            op._in1 = None
        else:
            op._in0 = inputs
            op._in1 = None
        op._control_inputs = controls
        op._attrs = attrs
        op._device = device
        op._file = file
        op._line = line
        op._op_def = op_def
        op._ctx, op._ir = ctx, None
        if len(specs) == 1:
            ((dt, shape),) = specs
            op._out = out = _new_tensor(Tensor)
            out._op = op
            out._value_index = 0
            out._dtype = dt
            out._shape = shape if isinstance(shape, TensorShape) else as_shape(shape)
        else:
            op._out = tuple(
                Tensor(op, i, dt, shape if isinstance(shape, TensorShape) else as_shape(shape))
                for i, (dt, shape) in enumerate(specs)
            )
        ops = self._ops
        ops.append(op)
        self._by_name[full_name] = op
        if not len(ops) & _PROMOTE_MASK:
            _promote_young()
        return op

    def _finalized_error(self, op_type: str) -> RuntimeError:
        return RuntimeError(f"cannot add op of type {op_type!r}: graph {self!r} is finalized")

    def _shape_error_locked(
        self, exc: TypeError | ValueError, full_name: str, op_type: str
    ) -> TypeError | ValueError:
        """A shape function's TypeError / ValueError (bad dtypes, incompatible shapes)
        with the op named, its name reservation undone (a failed op leaves no trace)."""
        self._release_name_locked(full_name)
        return type(exc)(f"{exc} (while building op {full_name!r} of type {op_type})")

    def _scoped(
        self,
        op_type: str,
        inputs: tuple[Tensor, ...],
        attrs: dict[str, Any],
        control_inputs: Iterable[Operation],
    ) -> tuple[tuple[Tensor, ...], tuple[Operation, ...], dict[str, Any], str, Any, str]:
        """What the open scope blocks make of a new op: (inputs, control inputs, attrs,
        device, control-flow context, name scope)."""
        stacks = self._stacks
        controls: list[Operation] = []
        for frame in stacks.control:
            controls.extend(frame)
        explicit = len(controls)  # controls[explicit:] were given as control_inputs
        for c in control_inputs:
            if not isinstance(c, Operation):
                raise TypeError(
                    f"control input of new {op_type} op must be an "
                    f"af.Operation, got {type(c).__name__}"
                )
            controls.append(c)
        explicit_ops = controls[explicit:]
        cf_stack = stacks.cf_context
        ctx = cf_stack[-1] if cf_stack else None
        if ctx is not None:
            # Inside af.cond / af.while_loop: values from outside the branch or loop
            # enter through Switch / Enter, and input-less ops hang off the pivot.
            prepared, controls = ctx.prepare_op(op_type, inputs, controls)
            inputs = tuple(prepared)
        if controls:
            controls = self._distinct_controls(op_type, inputs, controls, explicit_ops)
        device_stack = stacks.device
        device = device_stack[-1] if device_stack else ""
        colocate = stacks.colocate
        if colocate and "_class" not in attrs:
            # As TF: colocation wins over the device scope; placement honours "_class".
            attrs = {**attrs, "_class": [f"loc:@{colocate[-1]._name}"]}
            device = colocate[-1]._device
        return inputs, tuple(controls), attrs, device, ctx, stacks.name_scope

    def _distinct_controls(
        self,
        op_type: str,
        inputs: tuple[Tensor, ...],
        controls: list[Operation],
        explicit_ops: list[Operation],
    ) -> list[Operation]:
        """Duplicates go; so do control_dependencies() ops the data inputs already wait
        for.  Control inputs given explicitly stay (as TF's importer keeps a graph
        def's "^x" beside a data input from x: the def round-trips)."""
        seen: set[Operation] = set()
        data_ops = {t._op for t in inputs}
        if explicit_ops:
            data_ops.difference_update(explicit_ops)
        controls = [c for c in controls if not (c in seen or c in data_ops or seen.add(c))]  # type: ignore[func-returns-value]
        for c in controls:
            if c._graph is not self:
                raise ValueError(
                    f"control input {c.name!r} of new {op_type} op is from a different graph"
                )
        return controls

    def _check_inputs(self, op_type: str, inputs: tuple[Any, ...]) -> None:
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"input {i} of new {op_type} op must be an af.Tensor, got {type(t).__name__}"
                )
            if t._op._graph is not self:
                raise ValueError(f"input {t.name!r} of new {op_type} op is from a different graph")

    def _unique_name_locked(self, name: str, *, explicit: bool, scope: str | None = None) -> str:
        """Reserve a unique name for ``name`` in the name scope (``scope``: the current
        one, when the caller has read it already)."""
        if explicit:
            if name.endswith("/") and len(name) > 1:
                # As TF: a name ending in "/" (a name scope's) is used exactly as given.
                exact = name[:-1]
                if exact in self._by_name:
                    raise ValueError(f"an op named {exact!r} already exists")
                self._names_in_use.setdefault(exact.lower(), 1)
                return exact
            _check_op_name(name)
        if scope is None:
            scope = self._stacks.name_scope
        return self._reserve_name_locked(scope + name if scope else name)

    def _reserve_name_locked(self, name: str) -> str:
        """``name`` if unused, else the first free ``name_<k>`` (as TF: names differing
        only in case collide)."""
        key = name.lower()
        names = self._names_in_use
        i = names.get(key, 0)
        names[key] = i + 1
        if i > 0:
            base = key
            key = f"{base}_{i}"
            while key in names:
                i += 1
                key = f"{base}_{i}"
            names[key] = 1
            name = key if name == base else f"{name}_{i}"
        return name

    def _release_name_locked(self, name: str) -> None:
        key = name.lower()
        count = self._names_in_use.get(key, 0)
        if count <= 1:
            self._names_in_use.pop(key, None)
        else:
            self._names_in_use[key] = count - 1

    def unique_name(self, name: str, mark_as_used: bool = True) -> str:
        """A name unique in this graph, scoped by the current name scope."""
        with self._lock:
            if mark_as_used:
                return self._unique_name_locked(name, explicit=False)
            saved = dict(self._names_in_use)
            try:
                return self._unique_name_locked(name, explicit=False)
            finally:
                self._names_in_use = saved

    @contextlib.contextmanager
    def name_scope(self, name: str | None) -> Iterator[str]:
        """Open a name scope; ops created inside are named ``scope/op``.

        A name ending in ``/`` re-enters that exact scope; ``None`` or ``""`` resets to
        the root scope.  Yields the scope prefix (ending in ``/``).
        """
        stacks = self._stacks
        old = stacks.name_scope
        if not name:
            new = ""
        elif name.endswith("/"):
            new = name
        else:
            with self._lock:
                new = self._unique_name_locked(name, explicit=True) + "/"
        self._scope_opened()
        stacks.name_scope = new
        try:
            yield new
        finally:
            stacks.name_scope = old
            self._scope_closed()

    def _scope_opened(self) -> None:
        with self._lock:
            self._scopes += 1

    def _scope_closed(self) -> None:
        with self._lock:
            self._scopes -= 1

    @contextlib.contextmanager
    def control_dependencies(self, control_inputs: Iterable[Any] | None) -> Iterator[None]:
        """Ops created inside run only after every op (or tensor's op) in ``control_inputs``.

        ``None`` clears the enclosing control dependencies.
        """
        if control_inputs is None:
            with _cleared(self, self._stacks, "control"):
                yield
            return
        with _pushed(self, self._stacks.control, [_as_operation(c, self) for c in control_inputs]):
            yield

    @contextlib.contextmanager
    def device(self, device_name: str | None) -> Iterator[None]:
        """Ops created inside request ``device_name`` (``None`` or ``""`` clears it)."""
        if device_name is not None and not isinstance(device_name, str):
            to_string = getattr(device_name, "to_string", None)
            if to_string is None:
                raise TypeError(f"device must be a string, got {device_name!r}")
            device_name = to_string()
        with _pushed(self, self._stacks.device, device_name or ""):
            yield

    @contextlib.contextmanager
    def colocate_with(self, op: Any, ignore_existing: bool = False) -> Iterator[None]:
        """Ops created inside are placed on the same device as ``op`` (an op or tensor).

        Recorded as the ``_class`` attribute ``["loc:@<op name>"]``; placement puts a
        colocation group on one device and rejects members that ask for different
        devices.  ``None`` clears the enclosing colocation.
        """
        if op is None:
            with _cleared(self, self._stacks, "colocate"):
                yield
            return
        target = _as_operation(op, self)
        if target._graph is not self:
            raise ValueError(f"cannot colocate with {target.name!r}: it is from another graph")
        with _pushed(self, self._stacks.colocate, target):
            yield

    @contextlib.contextmanager
    def _control_flow_context(self, ctx: Any) -> Iterator[None]:
        """Build ops inside a control-flow context (``None``: the root context)."""
        with _pushed(self, self._stacks.cf_context, ctx):
            yield

    def _can_capture(self, graph: Graph) -> bool:
        """Whether tensors of ``graph`` may be used here (a function body captures
        tensors of the graphs it is defined in; a plain graph never)."""
        return False

    def _current_control_flow_context(self) -> Any:
        stacks = self._stacks
        return stacks.cf_context[-1] if stacks.cf_context else None

    def _update_input(self, op: Operation, index: int, tensor: Tensor) -> None:
        """Rewire data input ``index`` of ``op``: only to close a while loop's back edge
        while the loop is being built or imported (no plan can have used ``op`` yet)."""
        inputs = list(op._inputs)
        inputs[index] = tensor
        op._set_inputs(tuple(inputs))
        op._ir = None

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Graph]:
        """Make this the default graph of the current thread inside the block."""
        stack = _default_stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    def finalize(self) -> None:
        """Make the graph read-only: adding an op raises ``RuntimeError``."""
        self._finalized = True

    @property
    def finalized(self) -> bool:
        """True after :meth:`finalize`."""
        return self._finalized

    def prevent_feeding(self, tensor: Tensor) -> None:
        """Mark ``tensor`` as not feedable."""
        self._unfeedable.add(tensor)

    def is_feedable(self, tensor: Tensor) -> bool:
        """True when ``tensor`` may be fed."""
        return tensor not in self._unfeedable and tensor._op._op_def.feedable

    def prevent_fetching(self, op: Operation) -> None:
        """Mark ``op``'s outputs as not fetchable."""
        self._unfetchable.add(op)

    def is_fetchable(self, tensor_or_op: Tensor | Operation) -> bool:
        """True when the op (or tensor's op) may be fetched."""
        op = tensor_or_op._op if isinstance(tensor_or_op, Tensor) else tensor_or_op
        return op not in self._unfetchable

    # -- reading ----------------------------------------------------------------

    def get_operations(self) -> list[Operation]:
        """Every op, in creation order (a snapshot list)."""
        return list(self._ops)

    def get_operation_by_name(self, name: str) -> Operation:
        """The op named ``name``; ``KeyError`` naming it when absent, ``ValueError`` for a tensor name."""
        if not isinstance(name, str):
            raise TypeError(f"operation name must be a string, got {type(name).__name__}")
        if ":" in name:
            raise ValueError(
                f"{name!r} looks like a tensor name, not an operation name; use get_tensor_by_name"
            )
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"the name {name!r} refers to an operation not in the graph") from None

    def get_tensor_by_name(self, name: str) -> Tensor:
        """The tensor named ``"op:index"``; ``ValueError`` for a malformed name, ``KeyError`` if absent."""
        if not isinstance(name, str):
            raise TypeError(f"tensor name must be a string, got {type(name).__name__}")
        op_name, sep, index = name.rpartition(":")
        if not sep or not index.isdigit():
            raise ValueError(
                f"the name {name!r} looks like an (invalid) operation name, "
                f"not a tensor name; tensor names look like 'op:0'"
            )
        op = self._by_name.get(op_name)
        if op is None:
            raise KeyError(
                f"the name {name!r} refers to a tensor which does not exist: "
                f"operation {op_name!r} is not in the graph"
            )
        i = int(index)
        if i >= len(op._outputs):
            raise KeyError(
                f"the name {name!r} refers to a tensor which does not exist: "
                f"operation {op_name!r} has {len(op._outputs)} outputs"
            )
        return op._outputs[i]

    def as_graph_element(
        self, obj: Any, allow_tensor: bool = True, allow_operation: bool = True
    ) -> Tensor | Operation:
        """Resolve a Tensor, Operation, tensor name or op name in this graph."""
        conv = getattr(obj, "_as_graph_element", None)
        if conv is not None and not isinstance(obj, Tensor | Operation):
            obj = conv()
        if isinstance(obj, Tensor) and allow_tensor:
            if obj.graph is not self:
                raise ValueError(f"tensor {obj.name!r} is not an element of this graph")
            return obj
        if isinstance(obj, Operation) and allow_operation:
            if obj.graph is not self:
                raise ValueError(f"operation {obj.name!r} is not an element of this graph")
            return obj
        if isinstance(obj, str):
            if ":" in obj and allow_tensor:
                try:
                    return self.get_tensor_by_name(obj)
                except KeyError as exc:
                    raise ValueError(exc.args[0]) from None
            if ":" not in obj and allow_operation:
                try:
                    return self.get_operation_by_name(obj)
                except KeyError as exc:
                    raise ValueError(exc.args[0]) from None
        raise TypeError(
            f"cannot interpret {obj!r} as an element of this graph "
            f"(expected a Tensor{', Operation' if allow_operation else ''} "
            f"or a name)"
        )

    @property
    def version(self) -> int:
        """Grows with every op added (never repeats, also after a failed import): a
        cache of what was derived from the graph is fresh while it is unchanged."""
        return len(self._ops) + self._dropped

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Ops and functions added inside the block stay only if it ends without an
        exception (``import_graph_def`` is all or nothing, as TF's).  The graph's lock
        is held throughout, so other threads add nothing in between."""
        with self._lock:
            mark = len(self._ops)
            functions = dict(self._functions)
            try:
                yield
            except BaseException:
                dropped = self._ops[mark:]
                del self._ops[mark:]
                self._dropped += len(dropped)  # (version never goes back)
                for op in dropped:
                    del self._by_name[op._name]
                    self._release_name_locked(op._name)
                    self._unfetchable.discard(op)
                    for t in op.outputs:
                        self._unfeedable.discard(t)
                self._functions.clear()
                self._functions.update(functions)
                raise

    def as_graph_def(self) -> dict[str, Any]:
        """A JSON-serializable description of the graph (see ``af.import_graph_def``)."""
        return _graph_def_writer[0](self)

    def __repr__(self) -> str:
        return f"<af.Graph ops={len(self._ops)}{' finalized' if self._finalized else ''}>"


def _no_writer(graph: Graph) -> dict[str, Any]:
    raise RuntimeError("asyncflow.framework.graph_def is not imported")


#: The writer behind ``Graph.as_graph_def``, installed by
#: :mod:`asyncflow.framework.graph_def` (serialization builds on graph building, not
#: the other way round, so this module does not import it).
_graph_def_writer: list[Callable[[Graph], dict[str, Any]]] = [_no_writer]


#: TensorFlow's op name pattern (``ops._VALID_OP_NAME_REGEX``; a leading "_" as its
#: importer allows for internal ops: partition graphs hold ``_arg_x_0``): names end up
#: in graph defs, tensor names ("op:0"), control inputs ("^op") and file paths, so a
#: space, a colon or a caret would make them ambiguous there.
_VALID_OP_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9_.\-/>]*")


def _check_op_name(name: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"op name must be a string, got {type(name).__name__}")
    if _VALID_OP_NAME.fullmatch(name) is None:
        raise ValueError(
            f"{name!r} is not a valid op name: it must match TensorFlow's "
            f"pattern {_VALID_OP_NAME.pattern!r} (letters, digits, '.', '_', and "
            f"after the first character also '-', '/', '>')"
        )


def _as_operation(obj: Any, graph: Graph) -> Operation:
    conv = getattr(obj, "_as_graph_element", None)
    if conv is not None and not isinstance(obj, Tensor | Operation):
        obj = conv()
    if isinstance(obj, Tensor):
        return obj._op
    if isinstance(obj, Operation):
        return obj
    op = getattr(obj, "op", None)
    if isinstance(op, Operation):
        return op
    raise TypeError(f"control input must be an Operation or a Tensor, got {obj!r}")


def _binary_operator(
    op_type: str, name: str, general: Callable[[Any, Any], Tensor]
) -> Callable[[Tensor, Any], Tensor]:
    """The operator method ``self <op> other`` for an op built as ``general`` builds it.

    Two tensors of the default graph (a chain of ``x + y``) go straight to
    ``_create_op``: there is nothing to convert, and ``general`` (the op's public
    constructor) would pick that graph and make the same op named ``name``.
    Only ever called as a TensorOperators method: both frames are asyncflow's.
    """

    def operator(self: Tensor, other: Any) -> Tensor:
        if type(other) is Tensor and type(self) is Tensor:
            graph = self._op._graph
            stack = _default.stack
            if (
                other._op._graph is graph
                and type(graph) is Graph
                and (stack[-1] if stack else _global_graph) is graph
            ):
                if not graph._scopes and not graph._functions:
                    return graph._create_binary_op(op_type, self, other, name)
                out = graph._create_op(op_type, (self, other), None, name, (), 3, True)._out
                return out if isinstance(out, Tensor) else out[0]
        return general(self, other)

    return operator


# -- default graph --------------------------------------------------------------


class _DefaultStack(threading.local):
    def __init__(self) -> None:
        self.stack: list[Graph] = []


_default = _DefaultStack()
_global_graph: Graph | None = None
_global_lock = threading.Lock()


def _default_stack() -> list[Graph]:
    return _default.stack


def get_default_graph() -> Graph:
    """The innermost graph of ``with g.as_default()`` in this thread, or the global graph."""
    stack = _default.stack
    if stack:
        return stack[-1]
    global _global_graph
    if _global_graph is None:
        with _global_lock:
            if _global_graph is None:
                _global_graph = Graph()
    return _global_graph


def reset_default_graph() -> None:
    """Replace the global default graph with a new empty one.

    ``AssertionError`` (as TensorFlow) when called inside ``with g.as_default()``.
    """
    if _default.stack:
        raise AssertionError(
            "Do not use reset_default_graph() inside a `with graph.as_default()` block"
        )
    global _global_graph
    with _global_lock:
        _global_graph = Graph()


def name_scope(
    name: str | None, default_name: str | None = None, values: Any = None
) -> contextlib.AbstractContextManager[str]:
    """Open a name scope on the default graph (see :meth:`Graph.name_scope`)."""
    return get_default_graph().name_scope(name if name is not None else default_name)


def control_dependencies(
    control_inputs: Iterable[Any] | None,
) -> contextlib.AbstractContextManager[None]:
    """Control dependencies on the default graph (see :meth:`Graph.control_dependencies`)."""
    return get_default_graph().control_dependencies(control_inputs)


def colocate_with(
    op: Any, ignore_existing: bool = False
) -> contextlib.AbstractContextManager[None]:
    """Place ops created inside with ``op`` (see :meth:`Graph.colocate_with`)."""
    graph = op.graph if isinstance(op, Tensor | Operation) else get_default_graph()
    return graph.colocate_with(op, ignore_existing)


def device(device_name: str | None) -> contextlib.AbstractContextManager[None]:
    """Request a device for ops created inside (see :meth:`Graph.device`)."""
    return get_default_graph().device(device_name)


# -- conversion -----------------------------------------------------------------


def convert_to_tensor(
    value: Any, dtype: Any = None, name: str | None = None, preferred_dtype: Any = None
) -> Tensor:
    """A Tensor for ``value``: tensors pass through (dtype checked), others become constants.

    ``TypeError`` when a tensor's dtype differs from ``dtype`` or the value does not
    convert.
    """
    if isinstance(value, Tensor):
        if dtype is not None and _dtypes.as_dtype(dtype) is not value._dtype:
            raise TypeError(
                f"Tensor conversion requested dtype {_dtypes.as_dtype(dtype).name} "
                f"for Tensor {value.name!r} with dtype {value._dtype.name}"
            )
        return value
    conv = getattr(value, "_as_graph_element", None)
    if conv is not None:
        return convert_to_tensor(conv(), dtype=dtype, name=name)
    if isinstance(value, Operation):
        raise TypeError(
            f"cannot convert operation {value.name!r} to a tensor; use one of its outputs"
        )
    target = None
    if dtype is not None:
        target = _dtypes.as_dtype(dtype)
    elif preferred_dtype is not None:
        preferred = _dtypes.as_dtype(preferred_dtype)
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            make_constant_value(value, preferred)
            target = preferred
    array = make_constant_value(value, target)
    graph = get_default_graph()
    dt = _dtypes.as_dtype(array.dtype)
    return graph.create_op(
        "Const", (), {"value": array, "dtype": dt}, name=name or "Const"
    ).outputs[0]


def make_constant_value(value: Any, dtype: _dtypes.DType | None) -> np.ndarray:
    """A read-only numpy array for a constant, with TensorFlow's default dtypes.

    ``TypeError`` when a value cannot be represented in ``dtype`` without loss of
    kind (e.g. ``1.5`` as int32, or a string as float).
    """
    if isinstance(value, Tensor):
        raise TypeError(f"expected a constant value, got Tensor {value.name!r}")
    if dtype is None:
        dtype = _dtypes.dtype_of_value(value)
    if dtype.is_string:
        array = _dtypes.as_string_array(value)
    else:
        source = np.asarray(value)
        if source.dtype.kind in "SUO" and source.size:
            raise TypeError(f"cannot convert {value!r} to a tensor of type {dtype.name}")
        if (
            dtype.is_integer
            and source.dtype.kind in "fc"
            and source.size
            and not np.array_equal(np.asarray(source, dtype=dtype.np), source)
        ):
            raise TypeError(
                f"cannot convert {value!r} to a tensor of type {dtype.name} "
                f"without losing precision"
            )
        if dtype.is_bool and source.dtype.kind not in "b" and source.size:
            raise TypeError(f"cannot convert {value!r} to a tensor of type bool")
        if source.dtype.kind == "c" and not dtype.is_complex and source.size:
            raise TypeError(f"cannot convert complex {value!r} to a tensor of type {dtype.name}")
        array = np.array(source, dtype=dtype.np)
    array.flags.writeable = False
    return array
