"""Constant folding: evaluate constant subgraphs once, at compile time.

As TensorFlow's ``ConstantFold`` (``common_runtime/constant_folding.cc``): walking the
nodes in topological order, a node is *constant* when it may be folded at all
(:func:`never_folded` is the one predicate saying why not) and every data input comes
from a constant node.  Control inputs from non-constant nodes are allowed: they are
carried over to the replacement, so ordering (and deadness inside a ``cond`` branch
or a loop body, whose constants hang off the pivot) is preserved.

Each constant node is evaluated with its op's own kernel (instantiated from the
registry, never the runtime) by the evaluator graph building and the importer use
too (``framework/constant_eval``), and a single-output one is replaced by a ``Const`` of
the same name on the same device, so fetching it by name still works.  Nodes that
only fed folded nodes are then pruned.  A kernel error is swallowed here: the node
is not constant, stays in the plan and fails at run time naming itself, exactly as
without folding.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncflow.compiler.control_flow import CONTROL_FLOW_OPS
from asyncflow.compiler.ir import FUNCTION_ATTR, NodeDef, Ref
from asyncflow.framework.constant_eval import evaluate, inline_kernel, never_folded_reason
from asyncflow.framework.device_spec import DeviceSpec

if TYPE_CHECKING:
    import numpy as np

__all__ = ["fold_constants", "never_folded"]


def never_folded(node: NodeDef) -> str | None:
    """Why ``node`` is never folded (None: it may be, if its inputs are constant).

    The rules are :func:`~asyncflow.framework.constant_eval.never_folded_reason`'s
    (the graph-building evaluator applies the same), plus control flow: its ops are
    routed by the frame propagator.  Kernel-level reasons (async or expensive
    kernels, kernels needing session resources, no CPU kernel) are
    :func:`~asyncflow.framework.constant_eval.inline_kernel`'s.
    """
    if node.op in CONTROL_FLOW_OPS:
        return f"{node.op} is never folded"
    return never_folded_reason(
        node.op,
        stateful=node.stateful,
        function_call=FUNCTION_ATTR in node.attrs,
        outputs=len(node.outputs),
    )


def fold_constants(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    devices: Sequence[str],
    *,
    feeds: Collection[Ref],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    max_bytes: int,
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], bool]:
    """Fold the constant subgraphs of placed ``nodes``; returns the new nodes, their
    placement and whether anything changed."""
    values: dict[str, tuple[Any, ...]] = {}  # constant node -> its output values
    carried: dict[str, tuple[str, ...]] = {}  # constant node -> non-constant control deps
    out: list[NodeDef] | None = None  # made at the first fold (before it: ``nodes``)
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


def _live(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    feeds: Collection[Ref],
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


def _evaluate(
    node: NodeDef,
    device: str,
    values: dict[str, tuple[Any, ...]],
    carried: dict[str, tuple[str, ...]],
    feeds: Collection[Ref],
    max_bytes: int,
) -> tuple[Any, ...] | None:
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
    kernel = inline_kernel(node, DeviceSpec.from_string(device).device_type or "CPU")
    if kernel is None:
        return None
    arrays = evaluate(
        kernel,
        [values[r[0]][r[1]] for r in node.inputs],
        [info.dtype for info in node.outputs],
        max_bytes,
    )
    if arrays is None:
        return None
    values[node.name] = arrays
    carried[node.name] = _carried(node, node.inputs, values, carried)
    return arrays


def _carried(
    node: NodeDef,
    inputs: Sequence[Ref],
    values: Mapping[str, Any],
    carried: Mapping[str, tuple[str, ...]],
) -> tuple[str, ...]:
    """The non-constant control dependencies a replacement of ``node`` must keep: its
    own, and those its constant inputs carry (TF's ``constant_control_deps``)."""
    deps: dict[str, None] = {}
    for r in inputs:
        deps.update(dict.fromkeys(carried[r[0]]))
    for c in node.control_inputs:
        deps.update(dict.fromkeys(carried[c]) if c in values else {c: None})
    return tuple(deps)


def _as_const(node: NodeDef, value: np.ndarray, control_inputs: tuple[str, ...]) -> NodeDef:
    attrs: Mapping[str, Any] = {"value": value, "dtype": node.outputs[0].dtype}
    if "_class" in node.attrs:
        attrs = {**attrs, "_class": node.attrs["_class"]}
    return node._replace(
        op="Const",
        inputs=(),
        control_inputs=control_inputs,
        attrs=attrs,
        input_types=(),
        stateful=False,
    )
