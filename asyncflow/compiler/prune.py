"""Pruning: the nodes a run needs, given its fetches, targets and feeds.

A fed tensor cuts the edge to its producer: the producer runs only if something
else (another output, a control edge, a target) needs it.  A feed nothing needs is
dropped.  The result is in the graph's topological order (creation order: an op's
inputs always exist before it does; a loop's back edge is the one exception, and it
points at a Merge that already exists).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from asyncflow.compiler.ir import GraphIR, NodeDef, Ref

__all__ = ["prune"]


def prune(
    ir: GraphIR, fetches: Iterable[Ref], targets: Iterable[str], feeds: Collection[Ref] = ()
) -> tuple[NodeDef, ...]:
    """The nodes needed to compute ``fetches`` and run ``targets`` when ``feeds`` are given.

    A walk from the fetches, which costs what it visits: a small part of a large
    graph is pruned in a time of its size.  Once the walk has visited a sixteenth of
    the graph, and the graph has no back edges (``ir.back_edges``: no while loop), it
    gives way to one scan of the nodes in reverse order, which is cheaper per node:
    every node comes before its inputs, so a node is needed exactly when a needed node
    seen before it names it, and the scan stops once nothing needed is left to reach.
    Both iterative: a 100,000-node chain must not hit the recursion limit.
    """
    fed = feeds if isinstance(feeds, set | frozenset) else set(feeds)
    roots = [name for name, k in fetches if (name, k) not in fed]
    roots.extend(targets)
    if not ir.back_edges:
        nodes = _walk(ir, list(roots), fed, budget=max(len(ir.nodes) // 16, 1))
        if nodes is None:
            nodes = _scan(ir, roots, fed)
        if nodes is not None:
            return nodes
    return _walk(ir, roots, fed)  # type: ignore[return-value]


def _carried(ir: GraphIR, control: str, fed: Collection[Ref]) -> bool:
    """As TF's FeedInputs: a control edge from a fed Placeholder is carried by the feed,
    so the Placeholder itself need not (and cannot) run."""
    return (control, 0) in fed and ir.by_name[control].op == "Placeholder"


def _scan(ir: GraphIR, roots: list[str], fed: Collection[Ref]) -> tuple[NodeDef, ...] | None:
    """:func:`prune` by one reverse scan (None: a needed node was never reached, an
    input made after its consumer: the caller walks instead)."""
    needed = set(roots)
    waiting = len(needed)  # needed and not reached yet
    if not waiting:
        return ()
    add = needed.add
    fed_names = {r[0] for r in fed}  # a string test spares most inputs the tuple's
    kept: list[NodeDef] = []
    keep = kept.append
    for node in reversed(ir.nodes):
        if node.name not in needed:
            continue
        keep(node)
        for r in node.inputs:
            source = r[0]
            if source not in needed and (source not in fed_names or r not in fed):
                add(source)
                waiting += 1
        for c in node.control_inputs:
            if c not in needed and not (fed and _carried(ir, c, fed)):
                add(c)
                waiting += 1
        waiting -= 1
        if not waiting:
            kept.reverse()
            return tuple(kept)
    return None


def _walk(
    ir: GraphIR, roots: list[str], fed: Collection[Ref], budget: int | None = None
) -> tuple[NodeDef, ...] | None:
    """:func:`prune` by a walk from the roots, then the needed nodes in graph order
    (None: more than ``budget`` nodes are needed)."""
    left = len(ir.nodes) + 1 if budget is None else budget
    by_name = ir.by_name
    stack = roots
    needed: set[str] = set()
    add = needed.add
    push = stack.append
    fed_names = {r[0] for r in fed}
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        add(name)
        left -= 1
        if not left:
            return None
        node = by_name[name]
        if fed:
            for r in node.inputs:
                source = r[0]
                if source not in needed and (source not in fed_names or r not in fed):
                    push(source)
            for c in node.control_inputs:
                if not _carried(ir, c, fed):
                    push(c)
        else:
            for r in node.inputs:
                if r[0] not in needed:
                    push(r[0])
            stack.extend(node.control_inputs)
    nodes = ir.nodes
    if len(needed) * 4 >= len(nodes):  # most of the graph: one ordered scan, no sort
        return tuple([n for n in nodes if n.name in needed])
    position = ir.position
    return tuple([by_name[name] for name in sorted(needed, key=position.__getitem__)])
