"""Constant folding: evaluate constant subgraphs once, at compile time.

As TensorFlow's ``ConstantFold`` (``common_runtime/constant_folding.cc``): walking the
nodes in topological order, a node is *constant* when it may be folded at all
(:func:`never_folded` is the one predicate saying why not) and every data input comes
from a constant node.  Control inputs from non-constant nodes are allowed: they are
carried over to the replacement, so ordering (and deadness inside a ``cond`` branch
or a loop body, whose constants hang off the pivot) is preserved.

Each constant node is evaluated with its op's own kernel (instantiated from the
registry, never the runtime) and a single-output one is replaced by a ``Const`` of
the same name on the same device, so fetching it by name still works.  Nodes that
only fed folded nodes are then pruned.  A kernel error is swallowed here: the node
is not constant, stays in the plan and fails at run time naming itself, exactly as
without folding.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow import errors
from asyncflow.compiler.control_flow import CONTROL_FLOW_OPS
from asyncflow.compiler.ir import FUNCTION_ATTR, NodeDef, Ref, node_def_of
from asyncflow.framework import registry
from asyncflow.framework.device_spec import DeviceSpec

if TYPE_CHECKING:
    from asyncflow.framework.graph import Operation, Tensor

__all__ = ["constant_value", "constant_value_of", "fold_constants", "never_folded"]

#: Op types whose value is not a function of their inputs, or that only exist to
#: move values (feeds, transfers, frames): never evaluated at compile time.
_NEVER = frozenset({"Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "_Send",
                    "_Recv", "Const"}) | CONTROL_FLOW_OPS


def never_folded(node: NodeDef) -> str | None:
    """Why ``node`` is never folded (None: it may be, if its inputs are constant).

    The single place the rules live: stateful ops (variables, queues, random,
    stateful ``py_func``), feeds and control flow, function calls (inlined first, or
    run by their call kernel), ops without outputs.  Kernel-level reasons (async or
    expensive kernels, kernels needing session resources, no CPU kernel) are decided
    by :func:`_kernel_for`.
    """
    if node.stateful:
        return "stateful"
    if node.op in _NEVER:
        return f"{node.op} is never folded"
    if FUNCTION_ATTR in node.attrs:
        return "function call"
    if not node.outputs:
        return "no outputs"
    return None


def _kernel_for(node: NodeDef, device: str) -> Any:
    """The node's INLINE kernel callable, or None (async / expensive / resources / none)."""
    try:
        kdef = registry.get_kernel(node.op, DeviceSpec.from_string(device).device_type or "CPU")
    except errors.NotFoundError:
        return None
    if kdef.needs_resources:
        return None
    try:
        kernel, kind = kdef.instantiate(node)  # type: ignore[arg-type]
    except Exception:  # the factory rejects the node: it fails at bind time, unfolded
        return None
    return kernel if kind == registry.INLINE else None


def fold_constants(nodes: Sequence[NodeDef], placement: Sequence[int], devices: Sequence[str],
                   *, feeds: Collection[Ref], fetches: Sequence[Ref], targets: Sequence[str],
                   max_bytes: int) -> tuple[tuple[NodeDef, ...], tuple[int, ...], bool]:
    """Fold the constant subgraphs of placed ``nodes``; returns the new nodes, their
    placement and whether anything changed."""
    values: dict[str, tuple[Any, ...]] = {}    # constant node -> its output values
    carried: dict[str, tuple[str, ...]] = {}  # constant node -> non-constant control deps
    out: list[NodeDef] | None = None  # made at the first fold (before it: ``nodes``)
    with np.errstate(all="ignore"):
        for k, (node, d) in enumerate(zip(nodes, placement)):
            ins = node.inputs
            if ins and ins[0][0] not in values:
                # An input from a non-constant node: not constant (what _evaluate says
                # too), decided without a call (most nodes of a large graph).
                if out is not None:
                    out.append(node)
                continue
            result = _evaluate(node, devices[d], values, carried, feeds, max_bytes)
            if result is not None and len(result) == 1 and node.op != "Const":
                if out is None:
                    out = list(nodes[:k])
                out.append(_as_const(node, result[0], carried[node.name]))
            elif out is not None:
                out.append(node)
    if out is None:
        return tuple(nodes), tuple(placement), False
    return _live(out, placement, fetches, targets, feeds)


def constant_value(nodes: Sequence[NodeDef], ref: Ref, max_bytes: int = 1 << 26
                   ) -> np.ndarray | None:
    """The value of ``ref`` when it is a function of constants alone, else None.

    ``nodes``: the subgraph ``ref`` depends on, in topological order.  The same rules
    and kernels as :func:`fold_constants` (it is what an importer asks when an op needs
    a static argument, e.g. a ``Transpose`` perm made by ``ConcatV2`` of constants).
    """
    values: dict[str, tuple[Any, ...]] = {}
    carried: dict[str, tuple[str, ...]] = {}
    with np.errstate(all="ignore"):
        for node in nodes:
            if _evaluate(node, "", values, carried, (), max_bytes) is None:
                return None
    found = values.get(ref[0])
    return None if found is None or ref[1] >= len(found) else found[ref[1]]


#: How many ops the constant subgraph behind a graph tensor may have for
#: :func:`constant_value_of`: shape arithmetic is a few ops; a larger walk means the
#: value depends on real data.
_STATIC_WALK = 256


def constant_value_of(t: Tensor) -> np.ndarray | None:
    """The value of graph tensor ``t`` if it is a function of constants alone, else None.

    For a static argument an op needs when it is built (an importer's ``Transpose``
    perm, reduction axes): the subgraph behind ``t`` (Identity ops skipped) is walked
    back, at most ``_STATIC_WALK`` ops, stopping at the first op never folded, and
    evaluated by :func:`constant_value`.
    """
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    op = t.op
    if op.type == "Const":
        value: np.ndarray = op.get_attr("value")
        return value
    order: list[NodeDef] = []
    seen: set[int] = set()
    stack: list[tuple[Operation, bool]] = [(op, False)]
    while stack:
        current, done = stack.pop()
        if done:   # every input is in ``order`` already: a topological order
            order.append(node_def_of(current))
            continue
        if id(current) in seen:
            continue
        seen.add(id(current))
        if len(seen) > _STATIC_WALK or (
                current.type != "Const" and never_folded(node_def_of(current)) is not None):
            return None
        stack.append((current, True))
        stack.extend((i.op, False) for i in current.inputs)
    return constant_value(order, (op.name, t.value_index))


def _live(nodes: Sequence[NodeDef], placement: Sequence[int], fetches: Sequence[Ref],
          targets: Sequence[str], feeds: Collection[Ref]
          ) -> tuple[tuple[NodeDef, ...], tuple[int, ...], bool]:
    """Drop the nodes nothing needs any more (they only fed folded nodes)."""
    index = {n.name: k for k, n in enumerate(nodes)}
    stack = [r[0] for r in fetches if r not in feeds and r[0] in index]
    stack.extend(t for t in targets if t in index)
    needed: set[str] = set()
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        node = nodes[index[name]]
        stack.extend(r[0] for r in node.inputs if r not in feeds and r[0] in index)
        stack.extend(c for c in node.control_inputs if c in index)
    keep = [k for k, n in enumerate(nodes) if n.name in needed]
    return tuple(nodes[k] for k in keep), tuple(placement[k] for k in keep), True


def _evaluate(node: NodeDef, device: str, values: dict[str, tuple[Any, ...]],
              carried: dict[str, tuple[str, ...]], feeds: Collection[Ref],
              max_bytes: int) -> tuple[Any, ...] | None:
    """Node's output values if it is constant (recording it in ``values``), else None."""
    if node.op == "Const":
        if any((node.name, k) in feeds for k in range(len(node.outputs))):
            return None
        values[node.name] = (node.attrs["value"],)
        carried[node.name] = _carried(node, (), values, carried)
        return values[node.name]
    if never_folded(node) is not None:
        return None
    if any(r in feeds or r[0] not in values for r in node.inputs):
        return None
    if any((node.name, k) in feeds for k in range(len(node.outputs))):
        return None
    kernel = _kernel_for(node, device)
    if kernel is None:
        return None
    try:
        result = kernel(*(_kernel_value(values[r[0]][r[1]]) for r in node.inputs))
    except Exception:
        return None  # it fails again at run time, naming itself
    outs = (result,) if len(node.outputs) == 1 else tuple(result)
    if len(outs) != len(node.outputs):
        return None
    arrays = tuple(_frozen(v) for v in outs)
    for a, info in zip(arrays, node.outputs):
        if a is None or a.nbytes > max_bytes:
            return None
        if a.dtype != info.dtype.np and not info.dtype.is_string:
            return None  # e.g. a Python float from a py_func: folding would change it
    values[node.name] = arrays
    carried[node.name] = _carried(node, node.inputs, values, carried)
    return arrays


def _carried(node: NodeDef, inputs: Sequence[Ref], values: Mapping[str, Any],
             carried: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The non-constant control dependencies a replacement of ``node`` must keep: its
    own, and those its constant inputs carry (TF's ``constant_control_deps``)."""
    deps: dict[str, None] = {}
    for r in inputs:
        deps.update(dict.fromkeys(carried[r[0]]))
    for c in node.control_inputs:
        deps.update(dict.fromkeys(carried[c]) if c in values else {c: None})
    return tuple(deps)


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
    array.flags.writeable = False
    return array


def _as_const(node: NodeDef, value: np.ndarray, control_inputs: tuple[str, ...]) -> NodeDef:
    attrs: Mapping[str, Any] = {"value": value, "dtype": node.outputs[0].dtype}
    if "_class" in node.attrs:
        attrs = {**attrs, "_class": node.attrs["_class"]}
    return node._replace(op="Const", inputs=(), control_inputs=control_inputs, attrs=attrs,
                   input_types=(), stateful=False)
