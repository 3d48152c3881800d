"""The session's seams: how other modules plug into a :class:`~asyncflow.Session`.

Two plug-in points, each a small stated surface (``docs/internals.md``):

* :class:`SessionMaster` — what a session uses of a distributed master (made by a
  cluster target's ``_asyncflow_master(session)``): the extra devices, binding a
  compiled signature, the step runner of a call, closing.  The session checks the
  object against it when it is made, so a wrong master fails at the door.
* :class:`SessionInternals` — what modules outside the session (the distributed
  master, the SavedModel loader) use of a session: binding a plan to its devices
  and resources, its resource manager, whether it is distributed.  A session hands
  one out as ``session.internals``; nothing outside ``asyncflow.session`` reads a
  session's private attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from asyncflow.compiler.pipeline import Compiled
    from asyncflow.compiler.plan import Plan
    from asyncflow.framework.graph import Tensor
    from asyncflow.runtime.barrier import StepRunner
    from asyncflow.runtime.bind import BoundPlan
    from asyncflow.runtime.call_frame import CallFrame
    from asyncflow.runtime.rendezvous import LocalRendezvous
    from asyncflow.runtime.resources import ResourceMgr
    from asyncflow.session.call import CompiledCall
    from asyncflow.session.fetch_feed import Rebuild

__all__ = ["SessionInternals", "SessionMaster"]


@runtime_checkable
class SessionMaster(Protocol):
    """A distributed master as its session sees it.

    The session compiles over its own devices followed by ``device_names``; every
    compiled signature is bound by :meth:`prepared` (the master binds the partitions
    of the session's devices through :attr:`Session.internals` and registers the
    others with their tasks), and every step of such a call is made by :meth:`runner`
    and driven by the session's one driver, as a local step is.
    """

    #: The cluster's devices, after the session's own.
    device_names: tuple[str, ...]

    def prepared(
        self,
        compiled: Compiled,
        fetches: Sequence[Tensor],
        feed_keys: tuple[Any, ...],
        converters: tuple[Callable[[Any], Any], ...],
        rebuild: Rebuild,
    ) -> CompiledCall:
        """``compiled`` bound for this session and the cluster."""
        ...

    def runner(
        self,
        call: CompiledCall,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> StepRunner:
        """The step of one call of ``call`` (``rendezvous``: a partial run's)."""
        ...

    async def close(self) -> None:
        """Drop the session's state on every task (``Session.close``)."""
        ...

    def close_sync(self) -> None:
        """:meth:`close` from code without a running loop."""
        ...


class SessionInternals(Protocol):
    """What other modules of asyncflow use of a session (``session.internals``)."""

    @property
    def resources(self) -> ResourceMgr:
        """The session's variables and queues (plans bind their kernels to it)."""
        ...

    @property
    def distributed(self) -> bool:
        """Whether the session runs on a cluster (a distributed master plugged in)."""
        ...

    def bind(self, plan: Plan) -> BoundPlan:
        """``plan``'s kernels bound to this session's device of it and its resources."""
        ...
