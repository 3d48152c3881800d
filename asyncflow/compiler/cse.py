"""Common-subexpression elimination: one node per distinct computation.

As TensorFlow's ``OptimizeCSE`` (``graph/optimizer_cse.cc``): in topological order,
each node gets a structural key — op type, inputs (after earlier merges), the set
of control inputs, device and attributes — and a node whose key was seen before is
dropped, its consumers rewired to the first one.  Keys are compared for equality,
not only by hash (a dict does both).  Never merged: stateful ops (each runs as
often as it is written), placeholders (which one is unfed must stay visible), and
control-flow routing.  Targeted and fed nodes are never removed; targeted ones may
absorb later duplicates, fed ones never (their outputs are the fed values, not what a
duplicate computes).  A fetched node is merged like any other, as in TF: the caller
passes ``renames`` and serves the fetch from the survivor it names.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow.compiler.control_flow import CONTROL_FLOW_OPS
from asyncflow.compiler.ir import NodeDef, Ref

__all__ = ["eliminate_common_subexpressions"]

_NEVER = (
    frozenset({"Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "_Send", "_Recv"})
    | CONTROL_FLOW_OPS
)


def eliminate_common_subexpressions(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    feeds: Collection[Ref],
    protected: Collection[str],
    renames: dict[str, str] | None = None,
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], bool]:
    """Merge equivalent nodes; returns the nodes, their placement and whether any merged.

    ``protected`` nodes are never removed.  With ``renames``, every removed node's
    name is added to it with the name of the node that took its place (the caller
    remaps its fetches); without it, nothing is reported.

    Two nodes can only be equivalent when their inputs are: nodes are first grouped
    by the producer of their first input (a name, its hash cached), and the full key
    (op, inputs, control inputs, device, attributes) is made only in a group that
    gets a second node.  The result is exactly that of a dict on full keys.
    """
    # How many nodes each first input's producer ("" for none) starts: a node alone
    # in its group has no duplicate (until a merge rewires inputs), and a graph
    # where every node is alone has nothing to merge (counted in C, no Python loop).
    firsts = [n.inputs[0][0] if n.inputs else "" for n in nodes]
    sizes = collections.Counter(firsts)
    if len(sizes) == len(firsts):
        return tuple(nodes), tuple(placement), False
    merged = _merge(nodes, placement, feeds, protected, firsts, sizes)
    if merged is None:  # a merge: rewired inputs may pair a later node with a skipped one
        merged = _merge(nodes, placement, feeds, protected, renames=renames)
        assert merged is not None
    return merged


# The per-node hot loop of CSE (a large graph's first run passes every node through it),
# kept in one piece: one pass, no call per node for the common cases.
def _merge(  # noqa: C901
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    feeds: Collection[Ref],
    protected: Collection[str],
    firsts: Sequence[str] | None = None,
    sizes: Mapping[str, int] | None = None,
    renames: dict[str, str] | None = None,
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], bool] | None:
    """The pass; with ``firsts`` / ``sizes``, nodes alone in their group are skipped
    until the first merge, which then returns None (start again without skipping)."""
    # first input's producer -> the group's first node and device, until a second
    # node arrives; then full key -> the first node's name.
    groups: dict[str, tuple[NodeDef, int] | dict[Hashable, str]] = {}
    rename: dict[str, str] = {}
    # A fed node's outputs are the feed, not its computation: it absorbs nothing.
    fed_nodes = frozenset(r[0] for r in feeds)
    out: list[NodeDef] = []
    where: list[int] = []
    for k, (node, d) in enumerate(zip(nodes, placement)):
        if rename:
            node = _rewired(node, rename, feeds)
        elif sizes is not None and sizes[firsts[k]] == 1:  # type: ignore[index]
            continue  # alone in its group (no merge yet: its inputs are as counted)
        if node.stateful or node.op in _NEVER:
            if rename:
                out.append(node)
                where.append(d)
            continue
        group = node.inputs[0][0] if node.inputs else ""
        seen = groups.get(group)
        if seen is None:
            if node.name not in fed_nodes:
                groups[group] = (node, d)
            if rename:
                out.append(node)
                where.append(d)
            continue
        if not isinstance(seen, dict):  # the group's second node: now keys are needed
            first_node, first_d = seen
            seen = groups[group] = {_key(first_node, first_d): first_node.name}
        key = _key(node, d)
        first = seen.get(key)
        if first is not None and node.name not in protected:
            if not rename:  # the first merge: every node before it is unchanged
                if sizes is not None:
                    return None
                out = list(nodes[:k])
                where = list(placement[:k])
            rename[node.name] = first
            continue
        if node.name not in fed_nodes:
            seen.setdefault(key, node.name)
        if rename:
            out.append(node)
            where.append(d)
    if not rename:
        return tuple(nodes), tuple(placement), False
    if renames is not None:
        renames.update(rename)
    return tuple(out), tuple(where), True


def _key(node: NodeDef, device: int) -> Hashable:
    """What makes two nodes the same computation."""
    return (node.op, node.inputs, frozenset(node.control_inputs), device, _attrs_key(node))


def _rewired(node: NodeDef, rename: dict[str, str], feeds: Collection[Ref]) -> NodeDef:
    inputs = tuple((rename.get(r[0], r[0]), r[1]) if r not in feeds else r for r in node.inputs)
    controls = tuple(dict.fromkeys(rename.get(c, c) for c in node.control_inputs))
    if inputs == node.inputs and controls == node.control_inputs:
        return node
    return node._replace(inputs=inputs, control_inputs=controls)


def _attrs_key(node: NodeDef) -> Hashable:
    return tuple(sorted((k, _value_key(v)) for k, v in node.attrs.items()))


def _value_key(value: Any) -> Hashable:
    """A hashable key equal for equal attribute values (exact: bytes, not ==)."""
    if isinstance(value, np.ndarray | np.generic):
        a = np.asarray(value)
        if a.dtype.kind == "O":
            return ("objects", a.shape, tuple(_value_key(v) for v in a.flat))
        return ("array", a.dtype.str, a.shape, a.tobytes())
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, complex):
        return ("complex", value.real.hex(), value.imag.hex())
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_value_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), _value_key(v)) for k, v in value.items()))))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value).__name__, value)
