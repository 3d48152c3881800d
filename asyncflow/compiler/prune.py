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


def prune(ir: GraphIR, fetches: Iterable[Ref], targets: Iterable[str],
          feeds: Collection[Ref] = ()) -> tuple[NodeDef, ...]:
    """The nodes needed to compute ``fetches`` and run ``targets`` when ``feeds`` are given.

    Iterative: a 100,000-node chain must not hit the recursion limit.
    """
    fed = feeds if isinstance(feeds, set | frozenset) else set(feeds)
    by_name = ir.by_name
    stack: list[str] = [name for name, k in fetches if (name, k) not in fed]
    stack.extend(targets)
    needed: set[str] = set()
    add = needed.add
    push = stack.append
    fed_names = {r[0] for r in fed}  # a string test spares most inputs the tuple's
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        add(name)
        node = by_name[name]
        if fed:
            for r in node.inputs:
                source = r[0]
                if source not in needed and (source not in fed_names or r not in fed):
                    push(source)
            for c in node.control_inputs:
                # As TF's FeedInputs: a control edge from a fed Placeholder is carried
                # by the feed, so the Placeholder itself need not (and cannot) run.
                if not ((c, 0) in fed and by_name[c].op == "Placeholder"):
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
