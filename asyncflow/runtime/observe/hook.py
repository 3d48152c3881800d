"""The hook every observer uses: an observed copy of a bound plan, and the one wrapper
of each kind of kernel.

An observer never asks the engines to run differently: it gives the step a copy of
the bound plan whose kernels are wrapped (:func:`observed`), and the step runs that
copy exactly as it runs the plan — the same engine (the plan's static order or loop
programs, with the wrapped kernels), the same task mode, the same hand-offs.  What a
wrapper does around its kernel is the observer's :class:`Probe`; how a kernel of each
kind is wrapped (:func:`observe_node`) is written once, here, for all of them.
Control-flow routing (Switch, Merge, frames) runs no kernel and is never wrapped:
the propagators report it to a traced step themselves, and an Exit to a retval
observer (``derived["on_exit"]``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundNode, BoundPlan, tap_recv

__all__ = ["Probe", "base_of", "observe_node", "observed"]

_SYNC = (registry.INLINE, registry.EXPENSIVE, registry.SEND)


def _no_state() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Probe:
    """What an observer records around one node's kernel (made per node, once per
    observed copy).

    * ``start()`` — the kernel is about to run (on the thread it runs on; for an async
      kernel in the step's task, when the kernel is called).  Its result, the *state*,
      is handed to ``end`` or ``abort``.
    * ``end(state, value)`` — the kernel returned ``value`` (an async kernel: its
      coroutine did; a worker-thread kernel: on the worker thread).  For a ``_Recv``
      node, ``value`` is the ``(value, is_dead)`` item when it arrives, and the state
      is None (a recv runs nothing: ``start`` and ``abort`` are not called).
    * ``abort(state)`` — the kernel raised (also cancellation); the exception goes on.
      None: nothing to undo (the wrapper then has no ``try``).
    """

    end: Callable[[Any, Any], None]
    start: Callable[[], Any] = _no_state
    abort: Callable[[Any], None] | None = None


def observe_node(node: BoundNode, probe: Probe) -> BoundNode:
    """``node`` with its kernel wrapped by ``probe`` (a control-flow node, which runs no
    kernel, as it is)."""
    flow = node.flow
    kernel = node.kernel
    if flow in _SYNC:
        wrapped = _sync_observed(kernel, probe)
    elif flow == registry.ASYNC:
        wrapped = _async_observed(kernel, probe)
    elif flow == registry.RECV:
        end = probe.end

        def arrived(item: tuple[Any, bool]) -> None:
            end(None, item)

        wrapped = tap_recv(kernel, arrived)
    else:
        return node  # control-flow routing runs no kernel
    return node._replace(kernel=wrapped)


def _sync_observed(kernel: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    """An inline, worker-thread or send kernel observed by ``probe``."""
    start, end, abort = probe.start, probe.end, probe.abort
    if abort is None:

        def observed_kernel(*args: Any) -> Any:
            state = start()
            v = kernel(*args)
            end(state, v)
            return v

        return observed_kernel

    def guarded_kernel(*args: Any) -> Any:
        state = start()
        try:
            v = kernel(*args)
        except BaseException:
            abort(state)
            raise
        end(state, v)
        return v

    return guarded_kernel


def _async_observed(kernel: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    """An async kernel observed by ``probe``: ``start`` when the step calls it, ``end``
    when its coroutine returned."""
    start, end, abort = probe.start, probe.end, probe.abort

    async def awaited(coro: Coroutine[Any, Any, Any], state: Any) -> Any:
        try:
            v = await coro
        except BaseException:
            if abort is not None:
                abort(state)
            raise
        end(state, v)
        return v

    def observed_kernel(*args: Any) -> Any:
        return awaited(kernel(*args), start())

    return observed_kernel


def observed(bound: BoundPlan, nodes: Sequence[BoundNode]) -> BoundPlan:
    """``bound`` running ``nodes`` (its own, some kernels wrapped by an observer).

    The copy's steps take the same engine as the plan's: its straight-line order is
    the plan's own (built once, for the plan, and given the copy's kernels), its loop
    programs are bound to the copy's kernels.  ``derived["base"]`` is a weak reference
    to the plan (the plan may keep its traced copy: no cycle, no leak)."""
    # (No op_lookup of its own: its ops are the plan's; a copy kept by a cache of the
    # plan's must not hold the user's graph.)
    return replace(
        bound, nodes=tuple(nodes), op_lookup=None, derived={"base": weakref.ref(base_of(bound))}
    )


def base_of(bound: BoundPlan) -> BoundPlan:
    """The plan an observed copy was made of (itself when it is no copy, or when its
    plan is gone)."""
    ref = bound.derived.get("base")
    base = ref() if ref is not None else None
    return bound if base is None else base
