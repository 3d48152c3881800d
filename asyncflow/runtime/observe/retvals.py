"""The retval observer: a step that says when each fetched value is produced.

``Session.run_stream`` yields each fetch as soon as its value exists.  The executor
is not told about it: the hot loop of :mod:`asyncflow.runtime.propagators` stays
exactly as it is for ordinary runs (no per-node check).  Instead, a streaming step
runs an observed *copy* of the bound plan (:func:`observe_retvals`, made per step,
cheap: a tuple of named tuples; the same engine as the plan's) in which only the
nodes that produce a retval slot are observed (the hook's
:func:`~asyncflow.runtime.observe.hook.observe_node`); their probe hands the output
to ``notify(k, value)``.  Every other node is the very same
:class:`~asyncflow.runtime.bind.BoundNode`.

Covered: inline, async, worker-thread and ``_Recv`` nodes (a fetch produced on
another device is seen when it arrives), a ``cond``'s output (its Merge runs
no kernel: the kernels computing the branch outputs are observed instead, see
:func:`observe_retvals`), and a ``while_loop``'s output: an Exit runs no kernel
either, so the copy names its observed Exits in ``derived["on_exit"]`` and the
frame propagator calls that when it delivers an Exit's live value into the root
frame (one ``is None`` check per Exit when nobody streams).  A retval that no
kernel or Exit produces — a preloaded constant, a fed value, a branch that
returns an outside tensor unchanged, a dead tensor — is not notified; the caller
takes it from the step's results when the step ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundPlan
from asyncflow.runtime.observe.hook import Probe, observe_node, observed

__all__ = ["Notify", "observe_retvals"]

#: ``notify(k, value)``: retval ``k`` of the partition now has ``value``.  Called on
#: the step's loop thread.
Notify = Callable[[int, Any], None]

_OBSERVED = (registry.INLINE, registry.EXPENSIVE, registry.ASYNC, registry.RECV)


def observe_retvals(bound: BoundPlan, notify: Notify, loop: asyncio.AbstractEventLoop) -> BoundPlan:
    """The observed copy of ``bound`` whose retval-producing nodes report their outputs."""
    plan = bound.plan
    if not plan.retval_slots:
        return bound
    producer = {
        node.out + j: (i, j) for i, node in enumerate(bound.nodes) for j in range(node.num_outputs)
    }
    told: dict[int, dict[int, list[int]]] = {}  # node -> output -> retvals it gives
    exits: dict[int, list[int]] = {}  # Exit node -> retvals it gives

    # Each retval's sources, walked with a stack (a nested function calling itself
    # would be a reference cycle per stream).
    for k, retval_slot in enumerate(plan.retval_slots):
        slots = [retval_slot]
        while slots:
            found = producer.get(slots.pop())
            if found is None:
                continue  # a preloaded constant or a fed value: taken from the results
            i, j = found
            if plan.nodes[i].op == "Exit":  # no kernel: the propagator tells
                exits.setdefault(i, []).append(k)
            elif bound.nodes[i].flow in _OBSERVED:
                told.setdefault(i, {}).setdefault(j, []).append(k)
            elif plan.nodes[i].op == "Merge" and j == 0:
                # A cond's output: its value is that of the one live input, and in a
                # branch only the taken side's kernels ever run (every op of a branch
                # hangs off its Switch or pivot; dead nodes run no kernel).  So the
                # first input kernel to finish gives the Merge's value.
                slots.extend(reversed(bound.nodes[i].inputs))
    nodes = list(bound.nodes)
    for i, outs in told.items():
        nodes[i] = observe_node(
            nodes[i],
            _probe(nodes[i].flow, nodes[i].num_outputs, sorted(outs.items()), notify, loop),
        )
    copy = observed(bound, nodes)
    if exits:
        copy.derived["on_exit"] = _exit_observer(exits, notify)
    return copy


def _exit_observer(exits: dict[int, list[int]], notify: Notify) -> Callable[[int, Any], None]:
    """``on_exit(i, value)``: Exit ``i`` delivered ``value`` into the root frame."""

    def on_exit(i: int, value: Any) -> None:
        for k in exits.get(i, ()):
            notify(k, value)

    return on_exit


def _probe(
    flow: int,
    num_outputs: int,
    outs: list[tuple[int, list[int]]],
    notify: Notify,
    loop: asyncio.AbstractEventLoop,
) -> Probe:
    """What a retval-producing node of kind ``flow`` does when it ends: ``notify`` each
    retval its outputs ``outs`` give, on the step's loop thread (a worker-thread
    kernel hands its value over to the loop; a recv tells only a live value)."""
    single = num_outputs == 1

    def tell(v: Any) -> None:
        if not single and not (isinstance(v, list | tuple) and len(v) == num_outputs):
            return  # a wrong output count: the step reports it
        for j, ks in outs:
            value = v if single else v[j]
            for k in ks:
                notify(k, value)

    if flow == registry.EXPENSIVE:

        def on_thread(_state: None, v: Any) -> None:
            loop.call_soon_threadsafe(tell, v)

        return Probe(on_thread)
    if flow == registry.RECV:

        def received(_state: None, item: tuple[Any, bool]) -> None:
            value, dead = item
            if not dead:
                tell(value)

        return Probe(received)

    def ended(_state: None, v: Any) -> None:
        tell(v)

    return Probe(ended)
