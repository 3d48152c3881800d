"""A compiled run signature bound to a session: what every step of it starts from.

:class:`CompiledCall` is the value the session caches per signature (the fetch
structure and the feed keys) and hands to its one driver; a distributed master makes
its own kind (a subclass carrying the remote partitions) through the
:class:`~asyncflow.session.seam.SessionMaster` seam.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncflow.compiler.loop_schedule import runs_straight_line
from asyncflow.compiler.partition import partition_graph_def
from asyncflow.compiler.pipeline import Compiled
from asyncflow.framework import registry
from asyncflow.framework.graph import Tensor
from asyncflow.runtime.bind import BoundPlan
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.session.fetch_feed import Rebuild, retval_converter

__all__ = ["CompiledCall", "feed_name"]


class CompiledCall:
    """Everything one run signature needs: the compiled plans with their kernels bound
    to this session, the feed converters and the fetch rebuild."""

    __slots__ = (
        "bound",
        "compiled",
        "converters",
        "fast",
        "feed_keys",
        "inline_first",
        "lone",
        "rebuild",
        "retval_converters",
        "signature",
        "single",
        "spare",
        "step_less",
        "sync_first",
    )

    def __init__(
        self,
        compiled: Compiled,
        bound: Sequence[BoundPlan],
        fetches: Sequence[Tensor],
        feed_keys: tuple[Any, ...],
        converters: tuple[Callable[[Any], Any], ...],
        rebuild: Rebuild,
    ) -> None:
        self.compiled = compiled
        self.bound = tuple(bound)
        self.feed_keys = feed_keys
        self.converters = converters
        self.rebuild = rebuild
        self.retval_converters = tuple(retval_converter(t) for t in fetches)
        #: The converter of the one fetched tensor when the fetch is that tensor itself
        #: (not a structure holding it): results skip the rebuild.
        self.lone: Callable[[Any], Any] | None = None
        if len(fetches) == 1:
            probe = object()
            if rebuild([probe]) is probe:
                self.lone = self.retval_converters[0]
        #: A readable name of the signature (statistics): "fetches <- feeds".
        self.signature = (
            f"[{', '.join(t.name for t in fetches)}] <- "
            f"[{', '.join(feed_name(k) for k in feed_keys)}]"
        )
        #: One partition whose retvals are the fetches: one Step, no barrier.
        self.single = len(self.bound) == 1 and all(p == 0 for p, _ in compiled.retval_map)
        #: Steps of this call that finished, kept for its next ones (``Step.again``,
        #: ``Step.recycle``; here, not with the plan: a step holds its plan, and a
        #: plan holding its steps would be a cycle).
        self.spare: list[Any] = []
        #: The fast path, defined once: one partition made only of inline kernels runs
        #: synchronously (no task, no task group) unless it is traced or outlasts
        #: its first time slice.
        self.fast = self.single and self.bound[0].all_inline
        #: Its steps may run without being made once the plan is lowered
        #: (:func:`~asyncflow.runtime.step.run_through`): the fast path, run by this
        #: session (set by the session for its own calls; a master makes its steps).
        self.step_less = False
        #: Run the first time slice synchronously, before any loop registration: the
        #: fast path, and one partition whose async kernels may finish at once (queue
        #: ops, image decodes: a ``nowait`` twin); what is left goes on awaited.  Not
        #: with receives (their callbacks would outrun the step's registration), nor
        #: when an async or thread kernel has no twin: such a step awaits (its lone
        #: async node in the caller's task), and ``Step.run`` drains first what the
        #: slice would have.
        self.inline_first = (
            self.single
            and not any(b.receives for b in self.bound)
            and _may_finish_inline(self.bound[0])
        )
        #: The synchronous door (``run_sync``, a callable's ``run_sync``) runs that first
        #: slice on the caller's thread, with no event loop, and enters the thread's
        #: loop only for what is left: the fast path, and one partition whose only
        #: async nodes are ``offloads`` ones (an image decode: its ``nowait`` twin runs
        #: inline and needs no loop; the rare node that must hop goes on awaited) — the
        #: nodes a straight-line program may hold, whichever engine runs them.  Not
        #: other async kernels: a queue's twin may wake a waiter bound to a loop.
        self.sync_first = self.fast or (
            self.inline_first and runs_straight_line(self.bound[0].nodes, hops=True)
        )

    def frame(self, feed_dict: Mapping[Any, Any] | None) -> CallFrame:
        """The call frame of one step: the converted feed values, in plan order."""
        converters = self.converters
        if len(converters) == 1:  # the common case, without a comprehension
            for v in feed_dict.values():  # type: ignore[union-attr]
                return CallFrame((converters[0](v),))  # a tuple: not tracked by the GC
        if not converters:
            return CallFrame(())
        return CallFrame([conv(v) for conv, v in zip(converters, feed_dict.values())])  # type: ignore[union-attr]

    def results(self, values: Sequence[Any]) -> Any:
        if self.lone is not None:  # one tensor fetched, as itself
            return self.lone(values[0])
        return self.rebuild([c(v) for c, v in zip(self.retval_converters, values)])

    def graph_defs(self) -> list[dict[str, Any]]:
        """The partition graphs (``RunMetadata.partition_graphs``)."""
        return [partition_graph_def(p) for p in self.compiled.partitions]

    def with_plans(self, bound: Sequence[BoundPlan]) -> CompiledCall:
        """This call running ``bound`` instead: its plans with some kernels wrapped, per
        step (retval watchers for ``run_stream``, counters for progress)."""
        twin = copy.copy(self)
        twin.bound = tuple(bound)
        twin.spare = []  # (its steps run its plans, never this call's)
        return twin


def _may_finish_inline(bound: BoundPlan) -> bool:
    """Whether a step of ``bound`` may finish without awaiting: every async or thread
    kernel of it has a ``nowait`` twin (which finishes it inline when it can)."""
    return bound.all_inline or all(
        n.flow not in _AWAITED or getattr(n.kernel, "nowait", None) is not None for n in bound.nodes
    )


#: The kernel kinds a step awaits (on the loop or a worker thread).
_AWAITED = (registry.ASYNC, registry.EXPENSIVE)


def feed_name(key: Any) -> str:
    """A feed key as the signature's name shows it."""
    name = getattr(key, "name", key)
    return name if isinstance(name, str) else repr(key)
