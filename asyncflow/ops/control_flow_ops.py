"""Control flow: Switch / Merge / Enter / Exit / NextIteration / LoopCond, and the
``cond``, ``case`` and ``while_loop`` builders on top of them (TensorFlow 1.x's
"v1" control flow, executed with dead tensors and frames).

* ``switch(data, pred)`` → ``(output_false, output_true)``: the untaken output is
  *dead*.  Every non-Merge op with a dead input is dead and does not run.
* ``merge(inputs)`` → ``(output, value_index)``: forwards the first live input;
  dead only when every input is dead.
* ``enter`` / ``exit`` / ``next_iteration`` open, leave and advance a loop *frame*;
  the executor keeps per-frame, per-iteration state (see
  :mod:`asyncflow.runtime.propagators`).

The builders use *contexts* (``CondContext``, ``WhileContext``) while the user's
functions run: a tensor from outside a branch enters it through a ``Switch`` on the
predicate (so it is dead when the branch is not taken), a tensor from outside a
loop enters through a constant ``Enter``, a control input from outside a loop is
replaced by its value entered into the loop, and an op that nothing inside the
branch or loop would trigger (no inputs, or only loop constants) gets a control
edge from the pivot, so it runs only when (and as often as) the branch or loop
body does.  These are TensorFlow's ``ControlFlowContext.AddValue`` /
``_AddOpInternal`` rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import (
    Operation,
    Tensor,
    convert_to_tensor,
    get_default_graph,
)
from asyncflow.framework.shapes import TensorShape, as_shape, unknown_shape
from asyncflow.ops._base import define_op, make_op
from asyncflow.ops.math_ops import add, less, logical_and

__all__ = [
    "CondContext",
    "WhileContext",
    "case",
    "cond",
    "enter",
    "exit",
    "loop_cond",
    "merge",
    "next_iteration",
    "switch",
    "while_loop",
]

CONTROL_FLOW_TYPES = frozenset({"Switch", "Merge", "Enter", "Exit", "NextIteration"})


# -- primitives -------------------------------------------------------------------------


def _check_pred(pred: Tensor, what: str) -> None:
    if pred._dtype is not dtypes.bool:
        raise TypeError(f"{what}: the predicate must be a bool tensor, got {pred._dtype.name}")
    if pred._shape.rank not in (None, 0):
        raise ValueError(f"{what}: the predicate must be a scalar, got shape {pred._shape}")


def _switch_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    data, pred = inputs
    _check_pred(pred, "Switch")
    return [(data._dtype, data._shape), (data._dtype, data._shape)]


def _merge_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    if not inputs:
        raise ValueError("Merge needs at least one input")
    dtype = inputs[0]._dtype
    shape = inputs[0]._shape
    for t in inputs[1:]:
        if t._dtype is not dtype:
            raise TypeError(
                f"Merge inputs must have one dtype, got {dtype.name} and {t._dtype.name}"
            )
        shape = _loosen(shape, t._shape)
    return [(dtype, shape), (dtypes.int32, TensorShape(()))]


def _loosen(a: TensorShape, b: TensorShape) -> TensorShape:
    """The most specific shape that both ``a`` and ``b`` fit."""
    if a.dims is None or b.dims is None or len(a.dims) != len(b.dims):
        return unknown_shape()
    return TensorShape([x if x == y else None for x, y in zip(a.dims, b.dims)])


def _same_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    (x,) = inputs
    return [(x._dtype, x._shape)]


def _loop_cond_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    (p,) = inputs
    _check_pred(p, "LoopCond")
    return [(p._dtype, TensorShape(()))]


define_op("Switch", _switch_shape)
define_op("Merge", _merge_shape)


def _enter_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    # A while_loop variable's Enter records its shape invariant as an attribute, so
    # the loop's static shapes survive a graph def round trip.
    (x,) = inputs
    invariant = attrs.get("_shape_invariant")
    if invariant is None:
        return [(x._dtype, x._shape)]
    invariant = as_shape(invariant)
    if not invariant.is_compatible_with(x._shape):
        raise ValueError(
            f"shape invariant {invariant} is not compatible with the shape {x._shape} of {x.name!r}"
        )
    return [(x._dtype, invariant)]


define_op("Enter", _enter_shape)
define_op("Exit", _same_shape)
define_op("NextIteration", _same_shape)
define_op("LoopCond", _loop_cond_shape)


def _control_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    def not_callable(*args: Any) -> Any:  # the propagators route these themselves
        raise AssertionError(f"{op.type} is routed by the executor's propagator")

    return not_callable, registry.CONTROL


for _t in CONTROL_FLOW_TYPES:
    registry.register_kernel_factory(_t)(_control_kernel)
registry.register_kernel_factory("LoopCond")(lambda op: ((lambda p: p), registry.INLINE))


def switch(data: Any, pred: Any, name: str | None = None) -> tuple[Tensor, Tensor]:
    """Route ``data`` to ``output_true`` or ``output_false``; the other output is dead."""
    data = convert_to_tensor(data)
    pred = _as_pred(pred, "switch")
    op = make_op("Switch", (data, pred), name=name, default_name="Switch")
    return op.outputs[0], op.outputs[1]


def merge(inputs: Sequence[Any], name: str | None = None) -> tuple[Tensor, Tensor]:
    """Forward the first live input: ``(output, value_index)``."""
    tensors = [convert_to_tensor(x) for x in inputs]
    op = make_op("Merge", tensors, name=name, default_name="Merge")
    return op.outputs[0], op.outputs[1]


def enter(
    data: Any,
    frame_name: str,
    is_constant: bool = False,
    parallel_iterations: int = 10,
    name: str | None = None,
) -> Tensor:
    """Make ``data`` available in the child frame ``frame_name``."""
    if not isinstance(frame_name, str) or not frame_name:
        raise ValueError(f"frame_name must be a non-empty string, got {frame_name!r}")
    if not isinstance(parallel_iterations, int) or parallel_iterations < 1:
        raise ValueError(f"parallel_iterations must be a positive int, got {parallel_iterations!r}")
    data = convert_to_tensor(data)
    return make_op(
        "Enter",
        (data,),
        {
            "frame_name": frame_name,
            "is_constant": bool(is_constant),
            "parallel_iterations": parallel_iterations,
        },
        name=name,
        default_name="Enter",
    ).outputs[0]


def exit(data: Any, name: str | None = None) -> Tensor:
    """Make ``data`` available in the parent frame."""
    return make_op("Exit", (convert_to_tensor(data),), name=name, default_name="Exit").outputs[0]


def next_iteration(data: Any, name: str | None = None) -> Tensor:
    """Make ``data`` available to the next iteration of the frame."""
    return make_op(
        "NextIteration", (convert_to_tensor(data),), name=name, default_name="NextIteration"
    ).outputs[0]


def loop_cond(pred: Any, name: str | None = None) -> Tensor:
    """Mark ``pred`` as a loop's continuation condition."""
    return make_op(
        "LoopCond", (_as_pred(pred, "loop_cond"),), name=name, default_name="LoopCond"
    ).outputs[0]


def _as_pred(pred: Any, what: str) -> Tensor:
    if isinstance(pred, bool):
        raise TypeError(
            f"{what}: pred must be a bool Tensor, not a Python bool ({pred!r}); "
            f"use Python's `if` for a value known when building the graph"
        )
    t = convert_to_tensor(pred)
    _check_pred(t, what)
    return t


# -- nested structures ---------------------------------------------------------------


def _flatten(structure: Any) -> list[Any]:
    if isinstance(structure, Mapping):
        return [x for k in sorted(structure) for x in _flatten(structure[k])]
    if isinstance(structure, list | tuple):
        return [x for item in structure for x in _flatten(item)]
    return [structure]


def _pack(structure: Any, flat: Sequence[Any]) -> Any:
    it = iter(flat)

    def build(s: Any) -> Any:
        if isinstance(s, Mapping):
            built = {k: build(s[k]) for k in sorted(s)}
            kind: Any = type(s)
            return kind((k, built[k]) for k in s) if kind is not dict else {k: built[k] for k in s}
        if isinstance(s, list | tuple):
            items = [build(x) for x in s]
            if hasattr(type(s), "_fields"):
                return type(s)(*items)
            return type(s)(items)
        return next(it)

    return build(structure)


def _structure_signature(structure: Any) -> Any:
    if isinstance(structure, Mapping):
        return (
            type(structure),
            tuple((k, _structure_signature(structure[k])) for k in sorted(structure)),
        )
    if isinstance(structure, list | tuple):
        return (type(structure), tuple(_structure_signature(x) for x in structure))
    return None


# -- contexts ---------------------------------------------------------------------------


class _Context:
    """Common machinery of cond branches and while loops (TF's ``ControlFlowContext``)."""

    outer: _Context | None
    _values: dict[Tensor, Tensor]
    # External control inputs already pulled into this context (see _pull_control).
    _pulled: dict[Operation, Operation]

    def is_inside(self, op_ctx: Any) -> bool:
        """True when an op built in ``op_ctx`` is inside this context."""
        ctx = op_ctx
        while ctx is not None:
            if ctx is self:
                return True
            ctx = ctx.outer
        return False

    def while_context(self) -> WhileContext | None:
        """The innermost loop this context is in (itself for a loop)."""
        ctx: _Context | None = self
        while ctx is not None and not isinstance(ctx, WhileContext):
            ctx = ctx.outer
        return ctx

    def add_value(self, t: Tensor) -> Tensor:
        """``t`` (from outside this context) as seen inside it; made once per tensor."""
        cached = self._values.get(t)
        if cached is not None:
            return cached
        graph = t._op._graph
        # As TF's AddValue: the Switch / Enter carries no control input.  The control
        # scope active where the value is *used* may name ops inside this context,
        # and a shared Switch / Enter that waited for them would make every other
        # user of the value wait too (or be dead with them, when they are in a branch).
        with graph._control_flow_context(self.outer), graph.control_dependencies(None):
            source = t
            if self.outer is not None and not self.outer.is_inside(t._op._ctx):
                source = self.outer.add_value(t)
            out = self._admit(source)
        out._op._ctx = self  # the admitted value belongs to this context
        self._values[t] = out
        return out

    def _admit(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def pivot(self) -> Operation:
        raise NotImplementedError

    def prepare_op(
        self, op_type: str, inputs: tuple[Tensor, ...], controls: list[Operation]
    ) -> tuple[tuple[Tensor, ...], list[Operation]]:
        """The inputs and control inputs of a new op built in this context.

        As TF's ``_AddOpInternal``: external data inputs enter through
        :meth:`add_value`; a control input from outside the enclosing loop could
        fire only once, so it is replaced by a control edge from its value entered
        into the loop (:meth:`_pull_control`); and an op that nothing inside this
        context would trigger hangs off the pivot, so it runs once per taken branch
        or loop iteration, not once per value that reached the frame.
        """
        new_inputs = tuple(t if self.is_inside(t._op._ctx) else self.add_value(t) for t in inputs)
        loop = self.while_context()
        internal = [c for c in controls if loop is None or loop.is_inside(c._ctx)]
        external = [c for c in controls if loop is not None and not loop.is_inside(c._ctx)]
        if not any(self.is_inside(c._ctx) for c in internal) and self._needs_pivot(new_inputs):
            internal.append(self.pivot())
        internal.extend(self._pull_control(c) for c in external)
        return new_inputs, internal

    def _needs_pivot(self, inputs: tuple[Tensor, ...]) -> bool:
        """Whether an op with these inputs and no control input from inside this
        context needs the pivot.  Inputs from a cond branch are dead when the branch
        is not taken, so only input-less ops do; see WhileContext for loops."""
        return not inputs

    def _pull_control(self, c: Operation) -> Operation:
        """A control input standing for external op ``c`` inside this context: an
        ``Identity`` of ``c``'s output entered into the loop (TF: identity of
        ``Enter(c.outputs[0])``), made once per op.  ``c`` runs once, before the
        loop; the Identity fires in every iteration."""
        pulled = self._pulled.get(c)
        if pulled is not None:
            return pulled
        graph = c._graph
        if c._outputs:
            value = c._outputs[0]
        else:
            # TF drops a control input without outputs here (a TODO in its
            # _AddOpInternal), so the op never runs; give it an output instead: a
            # constant built after it, in the context the loop was built in.
            loop = self.while_context()
            assert loop is not None
            with (
                graph._control_flow_context(loop.outer),
                graph.control_dependencies(None),
                graph.control_dependencies([c]),
            ):
                value = convert_to_tensor(True, name="control_dependency_done")
        with graph.control_dependencies(None):
            pulled = make_op(
                "Identity", (self.add_value(value),), name="control_dependency"
            )  # built in this context
        self._pulled[c] = pulled
        return pulled


class CondContext(_Context):
    """The context of one branch of ``cond``: external values pass a Switch on ``pred``."""

    def __init__(self, pred: Tensor, pivot: Tensor, branch: int, outer: Any) -> None:
        self.pred = pred
        self._pivot = pivot
        self.branch = branch
        self.outer = outer
        self._values: dict[Tensor, Tensor] = {}
        self._pulled: dict[Operation, Operation] = {}

    def pivot(self) -> Operation:
        return self._pivot._op

    def _admit(self, t: Tensor) -> Tensor:
        # Dead when this branch is not taken.
        return switch(t, self.pred)[self.branch]


class WhileContext(_Context):
    """The context of a ``while_loop``'s frame: external values enter as loop constants."""

    def __init__(self, frame_name: str, parallel_iterations: int, outer: Any) -> None:
        self.frame_name = frame_name
        self.parallel_iterations = parallel_iterations
        self.outer = outer
        self._pivot: Tensor | None = None
        self._values: dict[Tensor, Tensor] = {}
        self._pulled: dict[Operation, Operation] = {}

    def pivot(self) -> Operation:
        assert self._pivot is not None
        return self._pivot._op

    def _needs_pivot(self, inputs: tuple[Tensor, ...]) -> bool:
        # As TF's _MaybeAddControlDependency: a loop constant reaches every
        # iteration, including the last one whose predicate is false, so an op fed
        # only by loop constants would run trips + 1 times (and a loop whose result
        # depends only on it would never end).  Hanging it off the pivot makes it
        # run exactly when the rest of the iteration does.
        return all(t._op._type == "Enter" and t._op._attrs.get("is_constant") for t in inputs)

    def _admit(self, t: Tensor) -> Tensor:
        # A loop constant: delivered to every iteration.
        return enter(
            t, self.frame_name, is_constant=True, parallel_iterations=self.parallel_iterations
        )


_frame_ids = itertools.count()


# -- cond / case ------------------------------------------------------------------------


def cond(
    pred: Any,
    true_fn: Callable[[], Any] | None = None,
    false_fn: Callable[[], Any] | None = None,
    name: str | None = None,
) -> Any:
    """``true_fn()`` if ``pred`` else ``false_fn()``; only the taken branch's ops run.

    Both functions must return the same nested structure (list / tuple / dict of
    tensors or values).  A Python ``bool`` predicate is a ``TypeError``.
    """
    if true_fn is None or false_fn is None or not callable(true_fn) or not callable(false_fn):
        raise TypeError("cond: true_fn and false_fn must both be callables")
    pred = _as_pred(pred, "cond")
    graph = get_default_graph()
    outer = graph._current_control_flow_context()
    with graph.name_scope(name or "cond"):
        p_false, p_true = switch(pred, pred)
        pivot_t = make_op("Identity", (p_true,), name="switch_t").outputs[0]
        pivot_f = make_op("Identity", (p_false,), name="switch_f").outputs[0]
        results = []
        for branch, pivot, fn in ((1, pivot_t, true_fn), (0, pivot_f, false_fn)):
            ctx = CondContext(pred, pivot, branch, outer)
            pivot._op._ctx = ctx
            with graph._control_flow_context(ctx):
                out = fn()
                flat = [_branch_output(ctx, x) for x in _flatten(out)]
            results.append((out, flat))
        (out_t, flat_t), (out_f, flat_f) = results
        if _structure_signature(out_t) != _structure_signature(out_f) or len(flat_t) != len(flat_f):
            raise ValueError(
                f"cond: true_fn and false_fn must return the same structure, "
                f"got {_describe(out_t)} and {_describe(out_f)}"
            )
        if not flat_t:
            return out_t
        merged = []
        for t, f in zip(flat_t, flat_f):
            if t._dtype is not f._dtype:
                raise TypeError(
                    f"cond: branch outputs have different dtypes: "
                    f"{t._dtype.name} ({t.name}) and {f._dtype.name} ({f.name})"
                )
            merged.append(merge([f, t])[0])
        return _pack(out_t, merged)


def _branch_output(ctx: _Context, value: Any) -> Tensor:
    if isinstance(value, Operation):
        raise TypeError(
            "cond/while_loop functions must return tensors, not operations "
            f"(got {value.name!r}); use af.control_dependencies"
        )
    t = convert_to_tensor(value)
    if not ctx.is_inside(t._op._ctx):
        t = ctx.add_value(t)
    return t


def _describe(structure: Any) -> str:
    sig = _structure_signature(structure)
    return repr(sig) if sig is not None else "a single value"


def case(
    pred_fn_pairs: Any,
    default: Callable[[], Any] | None = None,
    exclusive: bool = False,
    name: str = "case",
) -> Any:
    """The function of the first pair whose predicate is true, else ``default()``.

    With ``exclusive=True``, more than one true predicate is an error at run time
    (``InvalidArgumentError``), as in TensorFlow.
    """
    pairs = (
        list(pred_fn_pairs.items()) if isinstance(pred_fn_pairs, Mapping) else list(pred_fn_pairs)
    )
    if not pairs:
        if default is None:
            raise ValueError("case: needs at least one (pred, fn) pair or a default")
        return default()
    for p, fn in pairs:
        _as_pred(p, "case")
        if not callable(fn):
            raise TypeError(f"case: {fn!r} is not callable")
    graph = get_default_graph()
    with graph.name_scope(name):
        if default is None:
            # As TF: the last pair's function is the default, guarded by an assert that
            # its predicate holds, so that no true predicate fails the step.
            default = _asserted_default(pairs)
            pairs = pairs[:-1]
            if not pairs:
                return default()
        preds = [convert_to_tensor(p) for p, _ in pairs]
        if exclusive:
            default = _exclusive_guard(preds, default)
        result_fn: Callable[[], Any] = default
        for p, fn in reversed(pairs):
            result_fn = _nest(p, fn, result_fn)
        return result_fn()


def _asserted_default(pairs: list[tuple[Any, Callable[[], Any]]]) -> Callable[[], Any]:
    from asyncflow.framework.graph import control_dependencies
    from asyncflow.ops.array_ops import identity, stack
    from asyncflow.ops.logging_ops import Assert

    last_pred, last_fn = pairs[-1]
    preds = [convert_to_tensor(p) for p, _ in pairs]

    def default() -> Any:
        check = Assert(
            last_pred,
            ["Input error: None of conditions evaluated as True:", stack(preds, name="preds_c")],
            name="none_true",
        )
        with control_dependencies([check]):
            # identity() inside the block: the assert gates tensors made outside too.
            result = last_fn()
            return _pack(
                result,
                [
                    t if t is None or isinstance(t, Operation) else identity(t)
                    for t in _flatten(result)
                ],
            )

    return default


def _nest(pred: Any, fn: Callable[[], Any], otherwise: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: cond(pred, fn, otherwise)


def _check_exclusive(*values: Any) -> bool:
    """The kernel of ``case(exclusive=True)``'s guard (module level, so that graphs
    holding it can be serialized by reference)."""
    if sum(bool(v) for v in values) > 1:
        raise ValueError("case: more than one predicate is true with exclusive=True")
    return True


def _exclusive_guard(preds: list[Tensor], default: Callable[[], Any]) -> Callable[[], Any]:
    from asyncflow.framework.graph import control_dependencies
    from asyncflow.ops.py_func import py_func

    guard = py_func(_check_exclusive, preds, dtypes.bool, stateful=False, name="exclusive_check")

    def guarded() -> Any:
        with control_dependencies([guard]):
            return default()

    return guarded


# -- while_loop ---------------------------------------------------------------------------


def while_loop(
    cond: Callable[..., Any],
    body: Callable[..., Any],
    loop_vars: Any,
    shape_invariants: Any = None,
    parallel_iterations: int = 10,
    back_prop: bool = True,
    swap_memory: bool = False,
    maximum_iterations: Any = None,
    name: str | None = None,
    return_same_structure: bool = False,
) -> Any:
    """Repeat ``body`` while ``cond`` is true; returns the final loop variables.

    ``cond`` and ``body`` are called with the loop variables unpacked
    (``body(i, s)``), as in TensorFlow; ``body`` returns the same structure.  A loop
    variable whose static shape changes needs a ``shape_invariants`` entry
    (``ValueError`` otherwise).  ``parallel_iterations`` bounds how many iterations
    are in flight; ``maximum_iterations`` caps the iteration count.

    As TF 1.x, ``return_same_structure=False`` (the default) returns the one loop
    variable of ``while_loop(c, b, [x])`` as the bare tensor, not a one-element list
    (``n * 2`` of a list would silently be ``[t, t]``); ``True`` always returns the
    structure of ``loop_vars``.  (A one-entry dict stays a dict.)
    """
    _check_while_args(cond, body, parallel_iterations)
    # As TF: list/tuple loop_vars are passed unpacked (body(i, s)); anything else whole.
    unpack = isinstance(loop_vars, list | tuple)
    flat_vars, invariants = _loop_variables(loop_vars, shape_invariants)
    counted = maximum_iterations is not None
    graph = get_default_graph()
    outer = graph._current_control_flow_context()
    with graph.name_scope(name or "while"):
        limit = None
        if counted:
            limit = convert_to_tensor(maximum_iterations)
            if not limit._dtype.is_integer:
                raise TypeError("while_loop: maximum_iterations must be an integer tensor")
            flat_vars = [convert_to_tensor(0, dtype=limit._dtype), *flat_vars]
            invariants = [None, *invariants]
        frame_name = graph.unique_name("while_frame")
        ctx = WhileContext(frame_name, parallel_iterations, outer)
        enters = [
            _enter(v, inv, frame_name, parallel_iterations, ctx)
            for v, inv in zip(flat_vars, invariants, strict=True)
        ]
        user = slice(1, None) if counted else slice(None)

        def call(fn: Callable[..., Any], flat: Sequence[Tensor]) -> Any:
            packed = _pack(loop_vars, flat)
            return fn(*packed) if unpack else fn(packed)

        with graph._control_flow_context(ctx), graph.control_dependencies(None):
            merges = [merge([e, e])[0] for e in enters]
            ctx._pivot = merges[0]
            c = _branch_output(ctx, call(cond, merges[user]))
            if limit is not None:
                c = logical_and(less(merges[0], limit), c)
            pred = loop_cond(c)
            switches = [switch(m, pred) for m in merges]
        # The Enters carry the control scope the loop is built in; an Exit under it
        # would have an input from outside the frame it runs in.
        with graph._control_flow_context(outer), graph.control_dependencies(None):
            exits = [exit(sw[0]) for sw in switches]
        with graph._control_flow_context(ctx), graph.control_dependencies(None):
            body_in = [make_op("Identity", (sw[1],)).outputs[0] for sw in switches]
            ctx._pivot = body_in[0]
            result = _body_result(call(body, body_in[user]), loop_vars, unpack)
            flat_out = _body_outputs(ctx, result, len(flat_vars) - counted)
            if counted:
                one = convert_to_tensor(1, dtype=body_in[0]._dtype)
                flat_out = [add(body_in[0], one), *flat_out]
            nexts = [
                next_iteration(_checked_next(k, e, out, invariants[k], flat_vars[k]))
                for k, (e, out) in enumerate(zip(enters, flat_out, strict=True))
            ]
        for m, n in zip(merges, nexts, strict=True):
            graph._update_input(m._op, 1, n)
        packed = _pack(loop_vars, exits[user])
        if not return_same_structure and unpack and len(exits[user]) == 1:
            return packed[0]  # TF's rule: the one element of the list or tuple
        return packed


def _check_while_args(cond: Any, body: Any, parallel_iterations: Any) -> None:
    if not callable(cond) or not callable(body):
        raise TypeError("while_loop: cond and body must be callables")
    if (
        isinstance(parallel_iterations, bool)
        or not isinstance(parallel_iterations, int)
        or parallel_iterations < 1
    ):
        raise ValueError(
            f"while_loop: parallel_iterations must be a positive int, got {parallel_iterations!r}"
        )


def _loop_variables(
    loop_vars: Any, shape_invariants: Any
) -> tuple[list[Tensor], list[TensorShape | None]]:
    """The loop variables as tensors, flat, and their shape invariants (None: none)."""
    flat_vars = [convert_to_tensor(v) for v in _flatten(loop_vars)]
    if not flat_vars:
        raise ValueError("while_loop: loop_vars must not be empty")
    invariants: list[TensorShape | None] = [None] * len(flat_vars)
    if shape_invariants is not None:
        invariants = [as_shape(s) for s in _flatten(shape_invariants)]
        if len(invariants) != len(flat_vars):
            raise ValueError("while_loop: shape_invariants must match loop_vars' structure")
    return flat_vars, invariants


def _enter(
    v: Tensor,
    invariant: TensorShape | None,
    frame_name: str,
    parallel_iterations: int,
    ctx: WhileContext,
) -> Tensor:
    """Loop variable ``v`` entering the frame (its shape invariant, when it has one,
    in the Enter's ``_shape_invariant``)."""
    attrs: dict[str, Any] = {
        "frame_name": frame_name,
        "is_constant": False,
        "parallel_iterations": parallel_iterations,
    }
    if invariant is not None:
        if not invariant.is_compatible_with(v._shape):
            raise ValueError(
                f"while_loop: shape invariant {invariant} is not compatible "
                f"with loop variable {v.name} of shape {v._shape}"
            )
        attrs["_shape_invariant"] = invariant
    e = make_op("Enter", (v,), attrs, default_name="Enter").outputs[0]
    e._op._ctx = ctx
    return e


def _body_result(result: Any, loop_vars: Any, unpack: bool) -> Any:
    if (
        not unpack
        and not isinstance(loop_vars, Mapping)
        and isinstance(result, list | tuple)
        and len(result) == 1
    ):
        return result[0]  # TF allows body(x) -> [x] for a single loop variable
    return result


def _body_outputs(ctx: WhileContext, result: Any, expected: int) -> list[Tensor]:
    """The body's results, flat, as outputs of the loop's frame."""
    flat_result = _flatten(result)
    if len(flat_result) != expected:
        raise ValueError(
            f"while_loop: body must return the same structure as "
            f"loop_vars: {len(flat_result)} values for {expected} loop variables"
        )
    return [_branch_output(ctx, x) for x in flat_result]


def _checked_next(
    k: int, e: Tensor, out: Tensor, invariant: TensorShape | None, var: Tensor
) -> Tensor:
    """The body's value ``out`` of loop variable ``k`` (entered as ``e``), checked to
    keep its dtype, and its shape unless a shape invariant allows the change."""
    if out._dtype is not e._dtype:
        raise TypeError(
            f"while_loop: loop variable {k} changes dtype from {e._dtype.name} to {out._dtype.name}"
        )
    fixed = invariant is None and e._shape.is_fully_defined()
    if not e._shape.is_compatible_with(out._shape) or (fixed and out._shape != e._shape):
        raise ValueError(
            f"while_loop: loop variable {var.name} has shape "
            f"{e._shape} before the loop and {out._shape} after one iteration; "
            f"pass shape_invariants to allow the change"
        )
    return out
