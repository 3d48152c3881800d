"""Pruning: the operations a run needs, given its fetches, targets and feeds.

A fed tensor cuts the edge to its producer: the producer runs only if something
else (another output, a control edge, a target) needs it.  A feed nothing needs is
dropped.  The result is in topological order, which for an append-only graph is
creation order (an op's inputs always exist before it does).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncflow.framework.graph import Operation, Tensor

__all__ = ["prune"]


def prune(fetches: Iterable[Tensor], targets: Iterable[Operation],
          feeds: Collection[Tensor]) -> list[Operation]:
    """The ops needed to compute ``fetches`` and run ``targets`` when ``feeds`` are given.

    Returned in topological (creation) order.  Iterative: a 100,000-node chain must
    not hit the recursion limit.
    """
    fed = feeds if isinstance(feeds, set | frozenset) else set(feeds)
    stack: list[Operation] = [t._op for t in fetches if t not in fed]
    stack.extend(targets)
    needed: set[Operation] = set()
    add = needed.add
    push = stack.append
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        add(op)
        if fed:
            for t in op._inputs:
                if t not in fed:
                    push(t._op)
        else:
            for t in op._inputs:
                push(t._op)
        if op._control_inputs:
            if fed:
                # As TF's FeedInputs: a control edge from a fed Placeholder is carried
                # by the feed, so the Placeholder itself need not (and cannot) run.
                for c in op._control_inputs:
                    if not (c._type == "Placeholder" and c._outputs[0] in fed):
                        push(c)
            else:
                stack.extend(op._control_inputs)
    return sorted(needed, key=_op_id)


def _op_id(op: Operation) -> int:
    return op._id
