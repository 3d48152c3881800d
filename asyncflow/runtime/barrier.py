"""The ExecutorBarrier: the partitions of one step, run as one ``asyncio.TaskGroup``.

TensorFlow's ``ExecutorBarrier`` counts N executors down and reports the first
error.  Here each partition's :class:`~asyncflow.runtime.step.Step` is a task of
one task group.  The first partition to fail records its error (once), aborts the
step's rendezvous — so every recv waiting in a peer partition fails at once instead
of waiting forever — and aborts the other partitions.  Their errors are derived
(``AbortedError``, cancellations) and dropped: the caller sees the root error only,
never an ``ExceptionGroup``, and only after every partition has stopped.

The partitions share one :class:`~asyncflow.runtime.step.HandoffQueue`: a send
completes the peer partition's waiting recv and drains that partition at once, with
no trip through the event loop (see :mod:`asyncflow.runtime.step`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncflow import errors
from asyncflow.config import StepStats
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.cancellation import CancellationManager
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.runtime.step import HandoffQueue, Step, clear_frames

if TYPE_CHECKING:
    from asyncflow.runtime.bind import BoundPlan

__all__ = ["ExecutorBarrier", "StepRunner"]


class ExecutorBarrier:
    """Runs the partitions of one step; same interface as a single :class:`Step`."""

    __slots__ = ("_error", "_finished", "_frame", "_loop", "_rendezvous", "_retval_map", "_steps")

    def __init__(
        self,
        partitions: Sequence[BoundPlan],
        retval_map: Sequence[tuple[int, int]],
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> None:
        self._rendezvous = rendezvous if rendezvous is not None else LocalRendezvous()
        self._frame = frame
        self._retval_map = retval_map
        args = frame.args
        cancellation = CancellationManager()  # one for the whole step
        # One for the whole step, traced or not (a hand-off makes the receiving
        # partition's trace the current one while it drains it).  With
        # ``ExecutorOptions.handoffs`` off every cross-partition wait is a future.
        handoffs = HandoffQueue() if partitions and partitions[0].options.handoffs else None
        self._steps = [
            Step(
                plan,
                CallFrame(args),
                trace=trace,
                rendezvous=self._rendezvous,
                cancellation=cancellation,
                handoffs=handoffs,
            )
            for plan in partitions
        ]
        self._error: errors.OpError | None = None
        self._finished = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def rendezvous(self) -> LocalRendezvous:
        """The step's rendezvous."""
        return self._rendezvous

    @property
    def error(self) -> errors.OpError | None:
        """The step's root error, once it has one."""
        return self._error

    async def run(self) -> list[Any]:
        """Run every partition; returns the fetched values (run order), or raises the root error."""
        self._loop = asyncio.get_running_loop()
        try:
            async with asyncio.TaskGroup() as tg:
                for step in self._steps:
                    tg.create_task(self._run_partition(step))
                # The group holds the caller's task: the root error raised below has
                # this frame in its traceback, and the task holds the error.
                del tg
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        except asyncio.CancelledError as exc:
            # Cancelled (the caller, a deadline): the recvs still waiting fail now, and
            # the rendezvous lets go of them (and of their steps) at once.
            self._rendezvous.abort(errors.CancelledError(None, None, "step cancelled"))
            clear_frames(exc)  # the task group's frames hold it: no cycle left behind
            raise
        finally:
            self._loop = None
        if self._error is not None:
            raise self._error
        self._finished = True
        return self.results()

    def running(self) -> list[str]:
        """The nodes still running in any partition (see :meth:`Step.running`)."""
        return sorted(name for step in self._steps for name in step.running())

    @property
    def finished(self) -> bool:
        """Every partition finished and none failed."""
        return self._finished or all(step.finished for step in self._steps)

    def results(self) -> list[Any]:
        """The fetched values of a finished step, in run order.  Each partition's are
        asked of its step: a partition finished by a hand-off whose task was cancelled
        (a deadline landing as the step ends) never handed them to its frame."""
        retvals = [step.results() for step in self._steps]
        args = self._frame.args
        out = [args[k] if p < 0 else retvals[p][k] for p, k in self._retval_map]
        self._frame.retvals = out
        return out

    def release(self) -> None:
        """Break the reference cycles of every partition's step (see ``Step.release``),
        and forget the rendezvous: an aborted one holds the root error, whose traceback
        holds the frames that hold this barrier."""
        for step in self._steps:
            step.release()
        self._error = None
        self._rendezvous = _RELEASED

    async def _run_partition(self, step: Step) -> None:
        try:
            await step.run()
        except errors.OpError as exc:
            self._record(exc)

    def _record(self, error: errors.OpError) -> None:
        if self._error is not None or self.finished:
            return  # derived from the first error (an abort or a cancellation), or late
        self._error = error
        self._rendezvous.abort(error)
        derived = errors.CancelledError(None, None, f"step aborted: {error.message}")
        for step in self._steps:
            step.abort(derived)

    def abort(self, error: errors.OpError) -> None:
        """Fail the step with ``error`` (loop thread only)."""
        self._record(error)

    def abort_threadsafe(self, error: errors.OpError) -> None:
        """Fail the step from any thread (used by ``Session.close``)."""
        loop = self._loop
        if loop is None:
            if self._error is None and not self.finished:
                self._error = error
            for step in self._steps:
                step.abort_threadsafe(error)
            return
        try:
            loop.call_soon_threadsafe(self._record, error)
        except RuntimeError:  # loop closed: the step is over
            pass

    @property
    def stats(self) -> StepStats | None:
        """Every partition's node stats, merged per device."""
        merged: StepStats | None = None
        for step in self._steps:
            stats = step.stats
            if stats is None:
                continue
            if merged is None:
                merged = stats
                continue
            merged.dev_stats.extend(stats.dev_stats)
        return merged


#: The rendezvous of a released barrier: aborted, so any late use fails loudly.
_RELEASED = LocalRendezvous()
_RELEASED.abort(errors.CancelledError(None, None, "the step was released"))

#: What runs one step: one partition's Step, or the barrier over several partitions.
StepRunner = Step | ExecutorBarrier
