"""The one evaluator of constant subgraphs (TensorFlow's ``tensor_util.constant_value``).

An op constructor that needs a static argument (a ``Transpose`` perm, reduction axes,
an ``ExpandDims`` axis), a shape function that wants a precise static shape, the TF
importer reading TF's static inputs, and the compiler's constant folder all decide
"is this a function of constants alone, and what is it" here, with the same rules:

* :func:`never_folded_reason` — the one predicate saying why an op is never
  evaluated ahead of a run (stateful ops, feeds, transfers, function calls);
* :func:`inline_kernel` — an op is evaluated with its own CPU kernel from the
  registry, only when that kernel is a cheap synchronous one (never async, a
  thread kernel, control flow routed by the executor, or one needing a session's
  resources);
* :func:`evaluate` — runs that kernel on constant inputs, and refuses a result a
  ``Const`` could not hold unchanged.

:func:`constant_value` walks a graph tensor's producers with those rules.  It also
knows what TF's ``constant_value`` knows without running anything: ``Shape``,
``Size`` and ``Rank`` of a tensor whose static shape answers them.  It lives in
``framework/`` because graph building uses it; the compiler imports it, never the
reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow import errors
from asyncflow.framework import registry

if TYPE_CHECKING:
    from asyncflow.dtypes import DType
    from asyncflow.framework.graph import Operation, Tensor

__all__ = ["blocking_op", "constant_value", "evaluate", "inline_kernel", "never_folded_reason"]

#: Op types whose value is not a function of their inputs, or that only exist to
#: move values (feeds, transfers): never evaluated ahead of a run.  (``Const`` is
#: its own value.)  Control flow is excluded by its kernel kind.
_NEVER = frozenset(
    {"Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "_Send", "_Recv", "Const"}
)

#: Ops whose value is their input's shape: known from the static shape or not at all.
_SHAPE_OPS = frozenset({"Shape", "Size", "Rank"})

#: How many ops the constant subgraph behind a graph tensor may have for
#: :func:`constant_value`: shape arithmetic is a few ops; a larger walk means the
#: value depends on real data.
MAX_OPS = 256
#: The largest value :func:`constant_value` computes (a static argument is small).
MAX_BYTES = 1 << 24


def never_folded_reason(
    op_type: str, *, stateful: bool, function_call: bool, outputs: int
) -> str | None:
    """Why an op is never evaluated ahead of a run (None: it may be, if its inputs are
    constant).  The single place the rules live; kernel-level reasons are
    :func:`inline_kernel`'s."""
    if stateful:
        return "stateful"
    if op_type in _NEVER:
        return f"{op_type} is never folded"
    if function_call:
        return "function call"
    if not outputs:
        return "no outputs"
    return None


def inline_kernel(node: Any, device_type: str = "CPU") -> Callable[..., Any] | None:
    """``node``'s INLINE kernel callable, or None (async / expensive / control flow /
    needs resources / no kernel / the factory rejects the node).

    ``node``: a graph ``Operation`` or an IR node (kernel factories read both)."""
    try:
        kdef = registry.get_kernel(node._type, device_type or "CPU")
    except errors.NotFoundError:
        return None
    if kdef.needs_resources:
        return None
    try:
        kernel, kind = kdef.instantiate(node)
    except Exception:  # the factory rejects the node: it fails at bind time, unevaluated
        return None
    return kernel if kind == registry.INLINE else None


def evaluate(
    kernel: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    out_dtypes: Sequence[DType],
    max_bytes: int,
) -> tuple[np.ndarray, ...] | None:
    """The read-only output values of ``kernel`` on constant ``inputs``, or None when it
    fails (it fails again at run time, naming its node) or gives what a ``Const`` of
    ``out_dtypes`` would not hold unchanged (too big, another dtype, not a tensor)."""
    try:
        with np.errstate(all="ignore"):
            result = kernel(*(_kernel_value(v) for v in inputs))
    except Exception:
        return None
    outs = (result,) if len(out_dtypes) == 1 else tuple(result)
    if len(outs) != len(out_dtypes):
        return None
    arrays = tuple(_frozen(v) for v in outs)
    for a, dt in zip(arrays, out_dtypes):
        if a is None or a.nbytes > max_bytes:
            return None
        if a.dtype != dt.np and not dt.is_string:
            return None  # e.g. a Python float from a py_func: a Const would change it
    return arrays  # type: ignore[return-value]  # no None left


def constant_value(
    t: Tensor, max_ops: int = MAX_OPS, max_bytes: int = MAX_BYTES
) -> np.ndarray | None:
    """The value of graph tensor ``t`` if it is a function of constants alone, else None.

    The subgraph behind ``t`` is walked back (at most ``max_ops`` ops, stopping at the
    first op never evaluated) and evaluated op by op with :func:`evaluate`.  Control
    inputs do not matter to a value.  The result is read-only.
    """
    op = t._op
    leaf = _leaf_value(op)
    if leaf is not None:
        return leaf[t._value_index] if t._value_index < len(leaf) else None
    order, _ = _constant_subgraph(op, max_ops)
    if order is None:
        return None
    values: dict[int, tuple[np.ndarray, ...]] = {}
    for current in order:
        found = _leaf_value(current)
        if found is None:
            kernel = inline_kernel(current)
            if kernel is None:
                return None
            found = evaluate(
                kernel,
                [values[id(i._op)][i._value_index] for i in current._inputs],
                [o._dtype for o in current._outputs],
                max_bytes,
            )
            if found is None:
                return None
        values[id(current)] = found
    return values[id(op)][t._value_index]


def blocking_op(t: Tensor, max_ops: int = MAX_OPS) -> Operation | None:
    """An op behind ``t`` that is never evaluated ahead of a run (a feed, a variable, a
    random op), for an error message; None if there is none within ``max_ops``."""
    return _constant_subgraph(t._op, max_ops)[1]


def _constant_subgraph(
    op: Operation, max_ops: int
) -> tuple[list[Operation] | None, Operation | None]:
    """The ops ``op``'s value depends on, in topological order (leaves not walked
    through), or None when there are too many or one is never evaluated (then
    returned second)."""
    order: list[Operation] = []
    seen: set[int] = set()
    stack: list[tuple[Operation, bool]] = [(op, False)]
    while stack:
        current, done = stack.pop()
        if done:  # every input is in ``order`` already: a topological order
            order.append(current)
            continue
        if id(current) in seen:
            continue
        seen.add(id(current))
        if len(seen) > max_ops:
            return None, None
        stack.append((current, True))
        if _leaf_value(current) is not None:
            continue
        if _never_evaluated(current) or current._type in _SHAPE_OPS:
            # A shape op its input's static shape does not answer: as TF, not a
            # constant (and the walk never goes back through a whole network).
            return None, current
        stack.extend((i._op, False) for i in current._inputs)
    return order, None


def _never_evaluated(op: Operation) -> bool:
    functions = op._graph._functions
    return (
        never_folded_reason(
            op._type,
            stateful=op._op_def.stateful,
            function_call=bool(functions) and op._type in functions,
            outputs=len(op._outputs),
        )
        is not None
    )


def _leaf_value(op: Operation) -> tuple[np.ndarray, ...] | None:
    """The outputs of ``op`` known without evaluating its inputs: a ``Const``'s value,
    or ``Shape`` / ``Size`` / ``Rank`` of a tensor whose static shape answers them."""
    kind = op._type
    if kind == "Const":
        return (op._attrs["value"],)
    if kind not in _SHAPE_OPS or len(op._inputs) != 1:
        return None
    shape = op._inputs[0]._shape
    dt = op._outputs[0]._dtype.np
    if kind == "Rank":
        return None if shape.rank is None else (_read_only(np.array(shape.rank, dt)),)
    if not shape.is_fully_defined():
        return None
    dims: list[int] = shape.as_list()  # type: ignore[assignment]  # fully defined
    value = np.array(dims if kind == "Shape" else shape.num_elements(), dt)
    return (_read_only(value),)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _kernel_value(array: np.ndarray) -> Any:
    # Inside a step, 0-d values are numpy scalars (as the Const kernel gives them).
    return array[()] if array.ndim == 0 else array


def _frozen(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    try:
        array = np.array(value)  # a copy: the kernel's result may view its input
    except Exception:
        return None
    if array.dtype.kind == "O" and not all(isinstance(v, bytes) for v in array.flat):
        return None  # not a tensor value a Const can hold
    return _read_only(array)
