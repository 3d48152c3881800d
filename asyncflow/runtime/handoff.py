"""Cross-partition hand-offs: a send that completes a peer partition's waiting recv
and drains that partition at once, on its own stack (see :mod:`asyncflow.runtime.step`,
whose module docstring states the protocol).

The partitions of one step share a :class:`HandoffQueue`; a waiting ``_Recv`` leaves a
:class:`RecvWaiter` in the rendezvous (no future).  The outermost send of a chain owns
the queue and runs what the sends it drains complete (:func:`run_handoffs`), so at
most two drains are on the stack however long the chain of device changes.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Any, Protocol

from asyncflow.runtime.propagators import slice_over

__all__ = ["HandoffQueue", "RecvWaiter", "TracedRecvWaiter", "later", "run_handoffs"]


class Step(Protocol):
    """What a hand-off asks of a receiving step (:class:`asyncflow.runtime.step.Step`)."""

    _ctx: contextvars.Context | None
    _error: Any
    _stopped: bool
    _handoffs: HandoffQueue | None

    def _handoff_drain(self, waiter: RecvWaiter, until: float) -> None: ...
    def _handoff_ready(self, waiter: RecvWaiter) -> None: ...
    def _handoff_later(self, waiter: RecvWaiter) -> None: ...


#: Hand-offs run between two looks at the clock by the send that runs them.
_HANDOFF_CHECK_EVERY = 32


def run_handoffs(queue: deque[RecvWaiter], until: float) -> None:
    """Run the rest of the completed recvs a chain of sends queued (the outermost send
    ran the first one), each in the slice ending at ``until``.  After the slice, the
    rest are left to the event loop."""
    count = 1
    while queue:
        if not count % _HANDOFF_CHECK_EVERY and slice_over(until):
            later(queue)  # the slice is over: yield to the loop
            return
        waiter = queue.popleft()
        # Never the outermost send's step (see RecvWaiter.set_result).
        waiter.step._handoff_drain(waiter, until)
        count += 1


def later(queue: deque[RecvWaiter]) -> None:
    """Leave the queued hand-offs to the event loop, each in its step's context."""
    loop = asyncio.get_running_loop()
    while queue:
        waiter = queue.popleft()
        step = waiter.step
        loop.call_soon(step._handoff_later, waiter, context=step._ctx)


class HandoffQueue:
    """The recvs completed inside a chain of sends, for the chain's outermost send to
    run (one per step, shared by its partitions; see the module docstring)."""

    __slots__ = ("owner", "queue")

    def __init__(self) -> None:
        #: The step whose send is the outermost of the running chain, or None.
        self.owner: Step | None = None
        #: Completed waiters not run yet; empty whenever ``owner`` is None.
        self.queue: deque[RecvWaiter] = deque()

    def __repr__(self) -> str:
        return f"<HandoffQueue owner={self.owner!r} queued={len(self.queue)}>"


class RecvWaiter:
    """A waiting ``_Recv`` of a step, as the rendezvous holds it (a future's three
    methods, :class:`~asyncflow.runtime.rendezvous.Waiter`), without a future."""

    __slots__ = ("i", "result", "step", "token")

    def __init__(self, step: Step, token: Any, i: int) -> None:
        self.step = step
        self.token = token
        self.i = i
        #: The (value, is_dead) or the error it got; None while it waits.
        self.result: tuple[Any, bool] | BaseException | None = None

    def done(self) -> bool:
        """Completed, or its step failed or stopped (then it gives up its turn)."""
        step = self.step
        return self.result is not None or step._error is not None or step._stopped

    def set_result(self, result: tuple[Any, bool], /) -> None:
        self.result = result
        step = self.step
        handoffs = step._handoffs
        assert handoffs is not None
        owner = handoffs.owner
        if owner is step:  # draining below the chain's outermost send: ready the node now
            step._handoff_ready(self)
        elif owner is not None:  # sent inside a chain: its outermost send runs it
            handoffs.queue.append(self)
        else:  # not sent by a partition of this step: from the loop, in the step's context
            asyncio.get_running_loop().call_soon(step._handoff_later, self, context=step._ctx)

    def set_exception(self, exception: BaseException, /) -> None:
        self.result = exception
        step = self.step
        asyncio.get_running_loop().call_soon(step._handoff_later, self, context=step._ctx)

    def __repr__(self) -> str:
        state = "waiting" if self.result is None else "completed"
        return f"<{type(self).__name__} node={self.i} {state}>"


class TracedRecvWaiter(RecvWaiter):
    """The waiter of a traced step's recv: also what its transfer record needs."""

    __slots__ = ("trace",)

    def __init__(self, step: Step, token: Any, i: int, trace: tuple[float, int, int]) -> None:
        super().__init__(step, token, i)
        #: (when the recv started, frame id, iteration).
        self.trace = trace
