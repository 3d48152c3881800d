"""The static order of a plan: which node runs when, decided before any step runs.

A partition made only of inline kernels, without control flow, always runs its nodes
in the same order: nothing waits, nothing is dead, every node runs exactly once.
:func:`static_order` computes that order once — the very order the plain
propagator's ready stack would produce (LIFO, a node's first newly ready consumer
next), so values are freed as early as on the general path — and the executor
replays it as a straight line (:class:`asyncflow.runtime.propagators.SchedulePropagator`).
"""

from __future__ import annotations

from asyncflow.compiler.plan import Plan

__all__ = ["static_order"]


def static_order(plan: Plan) -> tuple[int, ...] | None:
    """Every scheduled node of ``plan`` once, producers before consumers (None when
    some node never becomes ready: the general path then reports what waits)."""
    pending = list(plan.initial_pending)
    consumers = plan.consumers
    ready = list(plan.initial_ready)
    order: list[int] = []
    emit = order.append
    push = ready.append
    while ready:
        i = ready.pop()
        while True:
            emit(i)
            nxt = -1
            for c in consumers[i]:
                p = pending[c] - 1
                pending[c] = p
                if not p:
                    if nxt < 0:
                        nxt = c
                    else:
                        push(c)
            if nxt < 0:
                break
            i = nxt
    return tuple(order) if len(order) == len(plan.nodes) else None
