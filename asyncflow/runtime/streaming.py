"""Watching retvals: a step that says when each fetched value is produced.

``Session.run_stream`` yields each fetch as soon as its value exists.  The executor
is not told about it: the hot loop of :mod:`asyncflow.runtime.propagators` stays
exactly as it is for ordinary runs (no per-node check).  Instead, a streaming step
runs a *copy* of the bound plan (made per step, cheap: a tuple of named tuples) in
which only the nodes that produce a retval slot have their kernel wrapped; the
wrapper hands the output to ``notify(k, value)`` and returns it unchanged.  Every
other node is the very same :class:`~asyncflow.runtime.bind.BoundNode`.

Covered: inline, async, worker-thread and ``_Recv`` nodes (a fetch produced on
another device is seen when it arrives).  A retval that no kernel produces — a
preloaded constant, a fed value, the output of control-flow routing (a ``cond``'s
Merge, a loop's Exit), a dead tensor — is not notified; the caller takes it from
the step's results when the step ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundNode, BoundPlan

__all__ = ["Notify", "watch_retvals"]

#: ``notify(k, value)``: retval ``k`` of the partition now has ``value``.  Called on
#: the step's loop thread.
Notify = Callable[[int, Any], None]


def watch_retvals(bound: BoundPlan, notify: Notify,
                  loop: asyncio.AbstractEventLoop) -> BoundPlan:
    """A copy of ``bound`` whose retval-producing nodes report their outputs."""
    plan = bound.plan
    by_slot: dict[int, list[int]] = {}
    for k, slot in enumerate(plan.retval_slots):
        by_slot.setdefault(slot, []).append(k)
    if not by_slot:
        return bound
    nodes = list(bound.nodes)
    for i, node in enumerate(nodes):
        outs = [(j, by_slot[node.out + j]) for j in range(node.num_outputs)
                if node.out + j in by_slot]
        if outs:
            nodes[i] = _watched(node, outs, notify, loop)
    return replace(bound, nodes=tuple(nodes))


def _watched(node: BoundNode, outs: list[tuple[int, list[int]]], notify: Notify,
             loop: asyncio.AbstractEventLoop) -> BoundNode:
    kernel = node.kernel
    single = node.num_outputs == 1

    nout = node.num_outputs

    def tell(v: Any) -> None:
        if not single and not (isinstance(v, list | tuple) and len(v) == nout):
            return  # a wrong output count: the step reports it
        for j, ks in outs:
            value = v if single else v[j]
            for k in ks:
                notify(k, value)

    flow = node.flow
    wrapped: Callable[..., Any]
    if flow == registry.INLINE:
        def inline(*args: Any) -> Any:
            v = kernel(*args)
            tell(v)
            return v
        wrapped = inline
    elif flow == registry.EXPENSIVE:
        def on_thread(*args: Any) -> Any:  # runs on a worker thread: tell on the loop
            v = kernel(*args)
            loop.call_soon_threadsafe(tell, v)
            return v
        wrapped = on_thread
    elif flow == registry.ASYNC:
        async def awaited(coro: Coroutine[Any, Any, Any]) -> Any:
            v = await coro
            tell(v)
            return v

        def start(*args: Any) -> Any:
            return awaited(kernel(*args))
        wrapped = start
    elif flow == registry.RECV:
        def received(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            value, dead = fut.result()
            if not dead:
                tell(value)

        def recv(*args: Any) -> Any:
            fut = kernel(*args)
            fut.add_done_callback(received)
            return fut
        wrapped = recv
    else:
        return node  # control-flow routing: no kernel call to watch
    return node._replace(kernel=wrapped)
