"""The executor: one :class:`Step` runs one partition of a plan, once.

State machine of a step (TensorFlow's ``ExecutorState``, on the event loop)::

    created ──run()──► draining ──(tasks / recvs outstanding, or budget used up)──► waiting
                          ▲                                                        │
                          └──── a task or recv finishes its node / the loop yields ◄┘
    draining/waiting ──(nothing ready, nothing outstanding)──► done
    any ──(first error | abort | cancel | deadline)──► failing ──(every task finished)──► failed

The step owns what is the same for every graph: dispatching nodes that do not run
inline (async kernels become tasks of the step's own task group — the first of
those a step waits on is awaited in the caller's task —, expensive ones tasks awaiting a worker thread of the
device, ``_Recv`` a waiter that the matching send completes, no task), the
first-error rule, cancellation, deadlines, yielding to the event loop on a budget.
A traced step runs the plan's traced copy (:mod:`asyncflow.runtime.observe.trace`): the
same engine, task mode and hand-offs, with kernels that record.  *Which nodes are ready* is the
propagator's business (:mod:`asyncflow.runtime.propagators`), chosen once per plan
at bind time: the plain propagator (no loop frames; dead tensors of ``cond``
handled off the fast path) or the frame propagator (loops: frames, iterations,
``parallel_iterations``).
The step calls ``propagator.drain(budget)`` and ``propagator.complete(token, value)``
and never looks at frames.

Invariants (each stated where its field is set):

* ``_outstanding`` counts dispatched nodes not finished yet (tasks, deferred tasks,
  waiting recvs).  The step is done when the propagator has nothing ready and
  ``_outstanding == 0``, or when it has an error and its task group has drained.
* ``_error`` is written once (the first error wins); after it, nothing new starts
  and late results are dropped.
* Every task lives in the step's task group and is discarded from ``_tasks`` when it
  ends, so a long loop holds no task of a finished iteration.

Cross-partition edges (the hand-off): the partitions of one step share a
:class:`HandoffQueue`.  A ``_Recv`` that waits leaves a :class:`RecvWaiter` in the
rendezvous (no future); the matching ``_Send`` completes it synchronously, and the
receiving partition's node finishes and its partition drains right away, on the
sender's stack, without a trip through the event loop.  To keep that stack flat, the
outermost send of such a chain owns the queue: completions made meanwhile (by the
sends of the partitions it drains) are queued and run one after the other by the
owner, and a completion for the owner itself only readies its node (the owner's own
drain, below the send, goes on with it).  However long the chain of device changes,
at most two drains are on the stack.  A waiter completed by anything else (a remote
pull, a partial run's feed, an abort) runs from the event loop instead.  Without a
queue (a lone step, or ``ExecutorOptions.handoffs`` off) every wait is an ``asyncio.Future``
with a done callback: the general path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from asyncflow import errors
from asyncflow.config import StepStats
from asyncflow.framework import registry
from asyncflow.runtime.bind import SEND_TOKEN, BoundNode, BoundPlan, RecvKernel, SendKernel
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.cancellation import CancellationManager, awaiting, running_step
from asyncflow.runtime.handoff import (
    HandoffQueue,
    RecvWaiter,
    TracedRecvWaiter,
    later,
    run_handoffs,
)
from asyncflow.runtime.interpreter import (
    PROGRAM_SLOTS,
    ProgramPropagator,
    lowering_due,
    program_of,
)
from asyncflow.runtime.kernel_env import (
    call_in_thread,
    quiet_numpy,
    restore_numpy,
)
from asyncflow.runtime.loop_fastpath import fast_loops
from asyncflow.runtime.observe.trace import StepTrace, observe_trace
from asyncflow.runtime.propagators import (
    GENERAL_SLOTS,
    Dead,
    PropagatorState,
)
from asyncflow.runtime.resources import WOULD_BLOCK

if TYPE_CHECKING:
    from asyncflow.runtime.devices import LocalDevice
    from asyncflow.runtime.rendezvous import Rendezvous

__all__ = [
    "RAISE_ON",
    "SLICE",
    "HandoffQueue",
    "Step",
    "abort_on_loop",
    "clear_frames",
    "current_step",
    "format_node_error",
    "run_through",
]

#: How long (seconds) a step drains before it yields to the event loop: long inline
#: work still honours deadlines and cancellation, and other tasks keep running.
SLICE = 0.001

#: What :meth:`Step.await_raised` answers when the frame awaiting the step's lone kernel
#: raises the kernel's exception on (a cancellation of the caller, a ``BaseException``).
RAISE_ON: Any = object()

#: Completed steps a compiled call keeps for its next steps (:meth:`Step.recycle`): a
#: service's steps in flight at once; beyond, a completed step is freed.
SPARE_STEPS = 64

#: Guards making a step's cancellation manager (kernels on threads may ask at once).
_CM_LOCK = threading.Lock()

_ASYNC = registry.ASYNC

#: The step of the work running in this context, for work outside the step's tasks:
#: a thread kernel's context and a hand-off callback's (:meth:`Step._kernel_context`).
#: An async kernel finds its step through ``cancellation.awaiting`` instead, and every
#: kernel through :func:`~asyncflow.runtime.cancellation.running` (a function call
#: kernel's nested step joins its caller's tracing; kernels find their cancellation
#: manager, :func:`~asyncflow.runtime.cancellation.get_cancellation_manager`).
current_step: contextvars.ContextVar[Step | None] = running_step


def _enter_context(step: Step) -> None:
    current_step.set(step)
    quiet_numpy()


_SEND = registry.SEND
_RECV = registry.RECV


def format_node_error(exc: BaseException, op: Any) -> errors.OpError:
    """The OpError for a kernel's exception: names the node, its type and creation site."""
    base = errors.from_exception(exc, op)
    return type(base)(
        base.node_def,
        op,
        f"{base.message}\n\t [[node {op.name} (op {op.type}, defined at {op.traceback})]]",
    )


def run_through(bound: BoundPlan, frame: CallFrame) -> list[Any] | None:
    """A step of ``bound`` over ``frame`` run to its end without making it, when it
    cannot suspend: its plan's program is ``through`` (one block of synchronous
    kernels, no loop; see :class:`~asyncflow.runtime.interpreter.BoundProgram`), so
    the step has nothing to keep between two calls — no clock to look at, no node to
    dispatch, nothing to cancel.  Returns its retvals, or None when the plan's steps
    must be made (not lowered yet, or a program that may suspend).  A kernel that
    raises fails the step as :meth:`Step.fail` says: the step is made then, and its
    error raised."""
    program = bound.derived.get("program")
    if program is None:
        # The run that lowers the plan may be this one (a step made next must not
        # count the run again, so only then).
        if not (bound.schedulable and lowering_due(bound)):
            return None
        program = program_of(bound, fast_loops)
    if program is None or not program.through:
        return None
    # (The program's own start and retvals, written out as ``ProgramPropagator`` has
    # them: this is every tiny run's path, and each call is ~60 ns of it.)
    vals = list(bound.plan.initial_values)
    args = frame.args
    for s, k in program.args:  # the _Arg nodes
        vals[s] = args[k]
    quiet = quiet_numpy()
    try:
        program.blocks[0](vals, None)  # type: ignore[misc]  # (made: it is through)
    except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
        raise _failed_step(bound, frame, program.node_at(0, exc), exc) from exc
    finally:
        restore_numpy(quiet)
    slots = bound.plan.retval_slots  # the _Retval nodes
    if len(slots) == 1:  # one fetch (most runs): no comprehension
        return [vals[slots[0]]]
    return [vals[s] for s in slots]


def _failed_step(bound: BoundPlan, frame: CallFrame, i: int, exc: BaseException) -> errors.OpError:
    """The error of a step of ``bound`` whose node ``i`` raised ``exc`` (the step made
    and failed only now; released, and not kept by the frame that raises it)."""
    step = Step(bound, frame)
    step.fail(i, exc)
    error = step.error
    step.release()
    assert error is not None
    return error


class Step:
    """One run of one partition: dispatch, tasks, first error, tracing; readiness is
    its engine's.

    A step *is* its engine: ``Step(...)`` makes a step of the plan's engine class,
    :class:`_ProgramStep` (the straight-line interpreter,
    :class:`~asyncflow.runtime.interpreter.ProgramPropagator`) or
    :class:`_GeneralStep` (the pending-count propagator,
    :class:`~asyncflow.runtime.propagators.PropagatorState`), whose state are slots of
    the same object: one object per step in flight, not two (every object a waiting
    step keeps is one more for the cycle collector, times the steps in flight).  The
    engine calls the step's side (``dispatch``, ``fail``, ``record``) on itself; the
    step calls the engine's (``drain``, ``complete``, ``has_ready``, ``clear``,
    ``idle``, ``retvals``) on itself."""

    __slots__ = (
        "_alone",
        "_alone_aborted",
        "_alone_cancels",
        "_alone_convert",
        "_alone_node",
        "_alone_outer",
        "_alone_token",
        "_bound",
        "_cm",
        "_ctx",
        "_deferred",
        "_done",
        "_error",
        "_finished",
        "_handoffs",
        "_loop",
        "_nodes",
        "_outstanding",
        "_parked",
        "_recvs",
        "_rendezvous",
        "_results",
        "_soon",
        "_spare",
        "_spawn",
        "_stopped",
        "_tasks",
        "_trace",
    )
    _alone: asyncio.Task[Any] | None
    _alone_aborted: bool
    _alone_cancels: int
    _alone_convert: Callable[[Any], Any] | None
    _alone_node: int
    _alone_outer: Step | None
    _alone_token: Any
    _bound: BoundPlan
    _cm: CancellationManager | None
    _ctx: contextvars.Context | None
    _deferred: list[tuple[Any, int, list[Any]]] | None
    _done: asyncio.Future[None] | None
    _error: errors.OpError | None
    _finished: bool
    _handoffs: HandoffQueue | None
    _loop: asyncio.AbstractEventLoop | None
    _nodes: Sequence[BoundNode]
    _outstanding: int
    _parked: tuple[Any, int, list[Any]] | None
    _recvs: set[asyncio.Future[Any]] | None
    _rendezvous: Rendezvous | None
    _results: list[Any] | None
    _soon: int
    _spare: RecvWaiter | None
    _spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None
    _stopped: bool
    _tasks: dict[asyncio.Task[None], int] | None
    _trace: StepTrace | None

    if TYPE_CHECKING:  # the engine's side, defined by the step's engine class

        def drain(self, until: float) -> bool:
            """Run ready nodes until none is left (True) or the clock passes ``until``
            (``time.perf_counter()`` seconds; checked every ``CHECK_EVERY`` nodes)."""
            raise NotImplementedError

        def complete(self, token: Any, value: Any) -> Any:
            """A dispatched node finished with ``value`` (a ``Dead`` when it is dead).
            False when that readied nothing and nothing else is ready (a program
            still waiting at a join for another node; a node of a wide layer whose
            consumer waits for the others): the step need not drain while another
            node runs.  (``Any``: the general propagator returns None or False, the
            program a bool.)"""
            raise NotImplementedError

        def has_ready(self) -> bool:
            """Whether nodes are ready to run."""
            raise NotImplementedError

        def clear(self) -> None:
            """The step failed: forget everything ready."""
            raise NotImplementedError

        def idle(self) -> None:
            """The step waits for a node with nothing ready: let go of what only running
            needs (one object less per step in flight); ``complete`` takes it back."""
            raise NotImplementedError

        def retvals(self) -> list[Any]:
            """The fetched values, in plan order (``InvalidArgumentError`` for a dead
            one)."""
            raise NotImplementedError

    def __new__(
        cls,
        bound: BoundPlan,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: Rendezvous | None = None,
        cancellation: CancellationManager | None = None,
        handoffs: HandoffQueue | None = None,
    ) -> Step:
        # A traced step runs the plan's traced copy: the same engine, other kernels.
        step_trace = None
        if trace:
            bound = observe_trace(bound)
            step_trace = StepTrace(bound)
        program = None
        if bound.schedulable:  # the straight-line interpreter, once the plan is lowered
            program = bound.derived.get("program") or program_of(bound, fast_loops)
        step: Step = object.__new__(_GeneralStep if program is None else _ProgramStep)
        step._bound = bound
        step._nodes = bound.nodes
        # The step's records (the observation layer's; None: nobody traces).
        step._trace = step_trace
        # The fetched values once the step finished (the frame itself is not kept: its
        # args are in the engine's values now, and one object less per step in flight).
        step._results = None
        step._rendezvous = rendezvous
        step._cm = cancellation
        # Shared by the partitions of the step (None: waits are futures, see module doc).
        step._handoffs = handoffs
        # A waiter the last recv offered but did not use (its value was there): the
        # next recv offers it again, so only a recv that waits allocates one.
        step._spare = None
        # The step's context (numpy quiet, cancellation, tracing), for hand-offs run
        # from the event loop; taken at the first recv that waits.
        step._ctx = None
        # The group's create_task while the step has a task group (see _run_tasks).
        step._spawn = None
        # The step's own task while an async node is awaited in it (see run),
        # else None; plain fields, not a list: no object per step for it.
        step._alone = None
        # The lone await's own fields are left unset until it starts (written by
        # ``start_waiting`` and ``_alone_start`` before anything reads them, which is
        # only while ``_alone`` is set): whether the step's abort cancelled the
        # awaiting task, the node and its token; while its kernel runs, the step
        # awaiting in that task before (a function call's caller), the caller's cancel
        # requests when it started (one more when the kernel returns: the caller was
        # cancelled meanwhile), the conversion of the kernel's result (``_async_work``).
        step._loop = None
        step._done = None
        # Dispatched, unfinished nodes: tasks (and deferred ones) and waiting recvs.
        step._outstanding = 0
        # The first node dispatched before the step had a task group, when it is async:
        # (token, i, args), what ``run`` awaits in its own frame when it is the step's
        # only work (no list, no search per run: the common step of a service).
        step._parked = None
        # The others dispatched before the step had a task group, made by the first one.
        step._deferred = None
        # The step's tasks, made by the first one (a step that awaits one lone node, the
        # common step of a service, never makes the dict).
        step._tasks = None
        # Futures of waiting recvs (no hand-off queue), made by the first one.
        step._recvs = None
        step._error = None  # the first error; written once
        step._stopped = False  # no new node may start, late results are dropped
        # Drains of the step due from the event loop (``_wake``): a step with one
        # still due is not kept for its plan's next step (:meth:`recycle`).
        step._soon = 0
        # Every node ran and nothing failed: the step's outcome is its results, whatever
        # deadline, close or abort arrives after this (written once, on the loop thread).
        step._finished = False
        if program is not None:
            step._init_program(program, frame.args)  # type: ignore[attr-defined]
        else:  # the general propagator; simple loop frames as straight-line programs
            loops = fast_loops(bound) if bound.frames else ()
            step._init_general(bound, frame.args, loops)  # type: ignore[attr-defined]
        return step

    # -- public -------------------------------------------------------------------------

    def run_inline(self, slice_s: float | None = None) -> list[Any] | None:
        """Run without an event loop, for at most ``slice_s`` seconds (to the end when None).

        Returns the retvals when the step finished, None when work is left (the caller
        continues with ``await run()``, which also starts the async kernels that could
        not finish at once).  Not for plans with receives.
        """
        quiet = quiet_numpy()
        tracing = self._trace.on() if self._trace is not None else None
        try:
            finished = self.drain(math.inf if slice_s is None else time.perf_counter() + slice_s)
        finally:
            if tracing is not None:
                StepTrace.off(tracing)
            restore_numpy(quiet)
        if self._error is not None:
            raise self._error
        if not finished or self._outstanding:
            return None
        return self._retvals()

    async def run(self) -> list[Any]:
        """Run the step; returns the frame's retvals (the fetched values, in plan order).

        Raises the step's first error as an ``OpError``.  Returns or raises only after
        every task the step started has finished.

        While the step's only work is async nodes, the first one's kernel is awaited
        right in the frame that awaits the step (:meth:`start_waiting`), the others run
        as tasks beside it: for one node no task group, no task, no wake-up future, no
        coroutine level of its own — the common step of a service (a few inline kernels
        around one I/O call) costs one await.  The task group takes what is left (the
        same loop awaits it: :meth:`_next_wait`).

        The loop below is the step's *await protocol*, every rule of it in the methods
        it calls; the session's driver writes the same loop in its own frame for the
        steps it makes (one coroutine level less per step in flight), everyone else
        awaits this.
        """
        # Traced kernels (shared by every traced step of the plan) find their step here;
        # tasks and recv callbacks made during the step inherit it.  Nothing else is
        # set in the caller's context: the kernels awaited find their step through
        # ``awaiting``, and numpy is quiet while the step's own code drains.
        tracing = self._trace.on() if self._trace is not None else None
        try:
            try:
                work = self.start_waiting()
                while work is not None:
                    try:
                        v = await work
                    except BaseException as exc:
                        if (work := self.await_raised(exc)) is RAISE_ON:
                            raise
                    else:
                        work = self.awaited(v)
                values = self.outcome()
            except BaseException as exc:
                await self.unwind(exc)
                raise
        finally:
            if tracing is not None:
                StepTrace.off(tracing)
        return values

    # -- the await protocol (``run``'s loop; the session's driver writes it out too) ------

    def start_waiting(self, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """The start of an awaited run: drain what is ready, take the running loop
        (``loop``, when the caller asked for it already: asking costs a system call);
        then what the awaiting frame awaits first — the lone async node's kernel,
        started in the caller's task (see :meth:`_alone_start`), or what the step's
        task group waits on (:meth:`_next_wait`) — or None: nothing is left to await
        (:meth:`outcome`)."""
        # (Nothing ready, the common case after the driver's inline slice: no drain.)
        finished = self._error is not None or not self.has_ready() or self._drain_quiet()
        if self._error is not None or (finished and not self._outstanding):
            return None
        if loop is None:
            loop = asyncio.get_running_loop()
        self._loop = loop
        if self._parked is None or not finished:  # (not finished: nodes are ready)
            return self._next_wait()
        # (Given the loop: asking for it again costs a system call.)
        task = asyncio.current_task(loop)
        assert task is not None
        # Its cancel requests before the first node: one more when a kernel returns
        # means the caller was cancelled meanwhile.
        self._alone_cancels = task.cancelling()
        return self._alone_start(task, True)  # (nothing failed, nothing is ready)

    def awaited(self, v: Any) -> Any:
        """What the awaiting frame awaited is over: the lone node's kernel returned
        ``v`` (the node is finished, and what it readies drained), or the step's task
        group woke it.  What to await next (the next lone node's kernel, or the task
        group again), or None: nothing is left (:meth:`outcome`)."""
        task = self._alone
        if task is None:  # a wake-up of the task group's (see _next_wait)
            return self._next_wait()
        self._awaited_by(task)
        try:
            try:
                convert = self._alone_convert
                if convert is not None:
                    self._alone_convert = None
                    v = convert(v)
                if not self._alone_aborted and task.cancelling() > self._alone_cancels:
                    # Returned although the caller was cancelled meanwhile: as with a
                    # task group, the cancellation wins and no further node starts.
                    raise asyncio.CancelledError
            except BaseException as exc:
                if self._alone_raised(self._alone_node, exc):
                    raise
            else:
                # Finished (a late value of an aborted step is dropped there, and the
                # abort's cancel of this task taken back).
                self._outstanding -= 1
                self._finish(self._alone_token, self._alone_node, v)
                if self._alone_aborted:
                    task.uncancel()
        finally:
            self._alone = None
        if self._alone_aborted or self._parked is None:  # the step's abort, taken back
            # (A finished step has nothing left: no call to ask, on the common path.)
            return None if self._finished and not self._tasks else self._next_wait()
        return self._alone_start(task)

    def await_raised(self, exc: BaseException) -> Any:
        """What the awaiting frame awaited raised ``exc``: ``RAISE_ON`` when the frame
        raises it on — the task group's wait raised it, or the lone node's kernel did
        and :meth:`_alone_raised` says so — else what to await next, or None."""
        task = self._alone
        if task is None:  # the task group's wait (a cancellation: see unwind)
            return RAISE_ON
        self._awaited_by(task)
        try:
            if self._alone_raised(self._alone_node, exc):
                return RAISE_ON
        finally:
            self._alone = None
        return self._next_wait() if self._alone_aborted else self._alone_start(task)

    def outcome(self) -> list[Any]:
        """The end of an awaited run (nothing left to await): the step's retvals, or
        its first error raised."""
        if self._loop is not None:
            # Closed: nothing new starts, no loop or group is kept.
            self._stopped = True
            self._spawn = None
            self._loop = None
        if self._error is not None:
            raise self._error
        return self._retvals()

    def _next_wait(self) -> Awaitable[None] | None:
        """What the awaiting frame awaits while work is left for the step's task group
        (it asks again after, :meth:`awaited`): with nothing ready, the step's wake-up
        future itself (a task or recv that finishes, fails or stops the step sets it,
        see :meth:`_wake`: no coroutine of a waiting loop around it); with nodes ready,
        the step's waiting loop (:meth:`_drive`), in its own group (no coroutine level
        for the group, see :meth:`_join`) or an ``asyncio.TaskGroup``, until the step
        is done, fails or stops; once it failed or stopped, the join of its tasks still
        stopping.  None: nothing is left (every node ran, or the step failed or stopped
        and its tasks are joined).  A cancellation of the caller while the frame awaits
        any of them is :meth:`unwind`'s."""
        if self._finished or self._settled():
            return self._join() if self._tasks else None
        if not self._bound.options.own_task_group:
            return self._in_task_group()
        if self._spawn is None:  # (started already when tasks started beside the kernel)
            self._start_deferred(self._loop.create_task)  # type: ignore[union-attr]
        if self.has_ready():
            return self._drive(self._loop)  # type: ignore[arg-type]
        done = self._done = self._loop.create_future()  # type: ignore[union-attr]
        return done

    async def unwind(self, exc: BaseException) -> None:
        """An awaited run raises ``exc`` (a cancellation, a ``BaseException`` of a
        kernel, the step's error): the tasks started beside a lone kernel are stopped
        and joined first, and the step is closed.  A cancellation that the step has
        not seen yet (the caller's, or its deadline, while the awaiting frame awaited
        the step's wake-up) stops it first: nothing new may start, kernels that poll
        the step's cancellation manager see it, recvs are cancelled too."""
        try:
            if isinstance(exc, asyncio.CancelledError) and not self._stopped:
                self._stopped = True
                self._cancel_manager()
                self._cancel_tasks()  # (and its recvs)
            elif self._tasks:
                self._cancel_tasks()
            if self._tasks:
                await self._join()
        finally:
            # Closed: nothing new starts, no loop or group is kept (as ``outcome``).
            self._stopped = True
            self._spawn = None
            self._loop = None
            if isinstance(exc, asyncio.CancelledError):
                clear_frames(exc)  # the task group's frames hold it: no cycle left behind

    @property
    def finished(self) -> bool:
        """Every node of the step ran and none failed (its results stand)."""
        return self._finished

    def results(self) -> list[Any]:
        """The retvals of a finished step (the outcome when a deadline or cancellation
        arrived after its last node ran, maybe before ``run`` handed them out: a
        hand-off finishes a partition on a peer's stack, and its own task may be
        cancelled before it resumes)."""
        retvals = self._results
        if retvals is None:
            assert self._finished
            retvals = self._retvals()
        return retvals

    def abort(self, error: errors.OpError) -> None:
        """Fail the step with ``error`` (if it has not failed yet).  Loop thread only."""
        self._fail_with(error)

    def release(self) -> None:
        """The caller is done with the step (results taken, error read): break its
        reference cycles (step -> error -> traceback -> frames -> step, a loop's frame
        tree) so it is freed by reference counting, not by the cycle collector."""
        self._error = None
        # (The manager stays: a thread kernel still running reads it off the step.)
        # A recv still waiting (the step was cancelled) holds the step from the
        # rendezvous (an aborted one holds the step's error), and the step's context may
        # hold the step: cut both; a released step never runs again (a late value is
        # dropped).
        self._stopped = True
        self._rendezvous = None
        self._ctx = None
        self._spare = None  # (it holds the step)
        if isinstance(self, PropagatorState) and self._root is not None:
            self.release_frames()  # the frame tree of a step that failed inside a loop

    @staticmethod
    def again(bound: BoundPlan, frame: CallFrame, spare: list[Step]) -> Step:
        """An untraced step of ``bound`` (one partition: no recv, no rendezvous) over
        ``frame``: one of ``spare``, steps of the plan's program that completed and
        were kept (:meth:`recycle`), its engine's state made anew (no object made per
        step, the step's slots not written again), else a new one."""
        if spare:
            try:
                step = spare.pop()
            except IndexError:  # (another thread's step took the last one)
                return Step(bound, frame)
            step._rerun(frame.args)  # type: ignore[attr-defined]
            return step
        return Step(bound, frame)

    def recycle(self, spare: list[Step]) -> None:
        """:meth:`release` a step of :meth:`again` that completed (its outcome taken:
        no error, no task left) — or, when nothing else holds it, keep it in ``spare``
        (its call's) for the call's next step, as ``__new__`` left it (its retvals are the
        caller's, its values dropped now).  Something may hold it when a kernel took
        its cancellation manager or a drain is due from the loop (``_wake``); a step of
        one partition has no recv, no hand-off and no context of its own.  Only a
        program's step is kept (the general engine's state is not made anew)."""
        if (
            not self._soon
            and self._cm is None
            and self.__class__ is _ProgramStep
            and len(spare) < SPARE_STEPS
        ):
            program_step: Any = self  # (its engine's values: dropped)
            program_step._vals = None
            self._results = self._done = None
            self._finished = self._stopped = False
            spare.append(self)
            return
        self.release()

    def abort_threadsafe(self, error: errors.OpError) -> None:
        """Fail the step from any thread (used by ``Session.close``)."""
        abort_on_loop(self, self._loop, error)

    @property
    def error(self) -> errors.OpError | None:
        """The step's first error, once it has one."""
        return self._error

    def running(self) -> list[str]:
        """The names of the async and thread nodes started and not finished: what a
        deadline landing now interrupts (TF names the pending op): the lone node, and
        the nodes of the tasks not done."""
        found = [self._alone_node] if self._alone is not None else []
        found += [i for task, i in (self._tasks or {}).items() if not task.done()]
        ops = self._bound.ops
        return sorted(getattr(ops[i], "name", str(i)) for i in found)

    def cancellation_manager(self) -> CancellationManager:
        """The step's cancellation manager, made when a kernel first asks for it (most
        steps never do: no object per step for it).  Any thread (a kernel on a worker
        thread)."""
        cm = self._cm
        if cm is None:
            with _CM_LOCK:
                cm = self._cm
                if cm is None:
                    cm = self._cm = CancellationManager()
        return cm

    def _cancel_manager(self) -> None:
        """Cancel the step's manager; one made only now (nobody asked before) is made
        cancelled, so a kernel asking later sees it so."""
        self.cancellation_manager().cancel()

    @property
    def device(self) -> LocalDevice:
        """The device the step's partition runs on (a kernel may size its work by it)."""
        return self._bound.device

    @property
    def frame(self) -> CallFrame:
        """The step's results as a call frame (its retvals are set when it finished;
        its args are not kept by the step)."""
        frame = CallFrame(())
        frame.retvals = self._results
        return frame

    @property
    def stats(self) -> StepStats | None:
        """The step's stats when it ran traced (one device: the partition's); its
        NodeExecStats are made from the raw records when first read."""
        return None if self._trace is None else self._trace.stats()

    # -- waiting for tasks ----------------------------------------------------------------

    def _settled(self) -> bool:
        """Nothing is left for the task group: failed, stopped, or every node ran."""
        return (
            self._error is not None
            or self._stopped
            or (not self._outstanding and not self.has_ready())
        )

    async def _in_task_group(self) -> None:
        """Run the step's remaining work in an ``asyncio.TaskGroup`` (the general path,
        ``ExecutorOptions(own_task_group=False)``) until it is done, fails or stops
        (``run`` sets the loop and resets the step's state after)."""
        loop = self._loop
        assert loop is not None
        try:
            async with asyncio.TaskGroup() as tg:
                self._start_deferred(tg.create_task)
                await self._drive(loop)
        except BaseExceptionGroup as group:
            # Only a BaseException that is not an Exception gets here (kernel errors
            # are caught in the tasks): re-raise it as itself, never as a group.
            raise group.exceptions[0] from None

    def _start_deferred(
        self, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]
    ) -> None:
        """Start the nodes dispatched before the step had a group; from now on
        ``dispatch`` starts tasks with ``spawn`` (the group's ``create_task``)."""
        self._spawn = spawn
        parked = self._parked  # (not taken by run: it was dispatched first)
        if parked is not None:
            self._parked = None
            self._start_task(spawn, *parked)
        deferred = self._deferred
        if deferred:
            for token, i, args in deferred:
                self._start_task(spawn, token, i, args)  # (never defers: spawn is set)
            deferred.clear()
        if self._error is not None:
            self._cancel_tasks()  # aborted from another thread before the loop was known

    async def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Drain what becomes ready and wait for the tasks and recvs, until the step is
        done, fails or stops; then cancel what is left (the group waits for it)."""
        prop = self
        try:
            while self._error is None and not self._stopped:
                if prop.has_ready():
                    if self._trace is not None:
                        self._trace.boundary()
                    if not self._drain_quiet():
                        await asyncio.sleep(0)  # deadlines, cancels and tasks run
                    continue
                if not self._outstanding:
                    break
                # Tasks and recv callbacks finish nodes and drain on their own;
                # they wake this loop when all is done, when an error happened,
                # or when a drain of theirs used up its budget.
                done = self._done = loop.create_future()
                await done
        except asyncio.CancelledError:
            # The caller was cancelled (or its deadline passed): nothing new may
            # start; the group cancels the running tasks and waits for them.
            self._stopped = True
            self._cancel_manager()
            raise
        finally:
            self._done = None
            if self._error is not None or self._stopped:
                self._cancel_tasks()

    async def _join(self) -> None:
        """The end of the step's own group (``ExecutorOptions.own_task_group``): wait until every task it
        started is done, then raise the first exception one of them ended with that is
        not a cancellation (what ``asyncio.TaskGroup.__aexit__`` does).

        A task leaves ``_tasks`` as the last thing its body does, so a task not in it
        is done by the time this task runs again: a step whose tasks all finished
        returns at once, without the extra trip through the event loop that a task
        group's done callbacks take.  Left in ``_tasks`` are only tasks cancelled before
        they started and tasks still stopping (the step failed or was cancelled), or
        ending with a ``BaseException``; all of them were cancelled (the step failed or
        stopped).  A cancellation of the caller while they stop is raised after they
        stopped, as a task group does; the kernels are not cancelled again.
        """
        tasks = self._tasks
        if tasks is None:
            return
        cancelled: asyncio.CancelledError | None = None
        while pending := [t for t in tasks if not t.done()]:
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError as exc:
                cancelled = exc  # the tasks were cancelled already: let them stop
        fatal: BaseException | None = None
        for task in tasks:  # every outcome retrieved: asyncio logs none of them
            outcome = None if task.cancelled() else task.exception()
            if fatal is None:
                fatal = outcome
        tasks.clear()
        if fatal is not None:
            raise fatal
        if cancelled is not None:
            raise cancelled

    # -- the lone async node, awaited in the caller's frame (see ``run``) ----------------------

    def _alone_start(self, task: asyncio.Task[Any], ready_checked: bool = False) -> Any:
        """The parked node (see ``_parked``) taken and its kernel started in ``task``
        (the caller's), for the awaiting frame to await, when the step's only work is
        async nodes dispatched before it had a task group, nothing is ready and nothing
        failed; the others (with ``ExecutorOptions.own_task_group``: the step's own
        group, which needs no ``async with``) start as tasks beside it.  Else the task
        group takes it all (:meth:`_next_wait`; so too when the kernel raised as it was
        called, failing its node).  ``ready_checked``: the caller knows a node is
        parked, nothing failed and nothing is ready (a drain just finished)."""
        parked = self._parked
        if not ready_checked and (parked is None or self._error is not None or self.has_ready()):
            return self._next_wait()
        assert parked is not None
        deferred = self._deferred
        n = len(deferred) if deferred else 0
        if self._outstanding != n + 1 or (n and not self._bound.options.own_task_group):
            return self._next_wait()  # a recv or a task is outstanding too, or no own group
        self._parked = None
        if n:  # the others: tasks of the step's own group, beside this one
            self._start_deferred(self._loop.create_task)  # type: ignore[union-attr]
        self._deferred = None  # (empty: not kept while the node runs)
        token, i, args = parked
        self._alone, self._alone_aborted, self._alone_node = task, False, i
        self._alone_token = token
        # The kernel's step, for ``running()`` and the kernel, in the task's entry of
        # ``awaiting`` (as a task of the step does in :meth:`_run_node`); the
        # step there before (a function call's caller) is put back after
        # (:meth:`_awaited_by`).
        self._alone_outer = awaiting.get(task)
        awaiting[task] = self
        try:
            work, self._alone_convert = self._async_work(self._nodes[i].kernel, args)
        except BaseException as exc:  # raised as it was called: fails its node too
            if (work := self.await_raised(exc)) is RAISE_ON:
                raise
            return work
        self.idle()  # (nothing ready: one object less held while the kernel runs)
        return work

    def _awaited_by(self, task: asyncio.Task[Any]) -> None:
        """The lone node's kernel is over: ``task`` is no longer awaiting it."""
        outer = self._alone_outer
        if outer is None:
            del awaiting[task]
        else:
            self._alone_outer = None
            awaiting[task] = outer

    def _alone_raised(self, i: int, exc: BaseException) -> bool:
        """The lone node ``i`` ended with ``exc``: True when ``run`` raises it on.

        The failing-kernel rule is :meth:`_kernel_raised`'s.  The caller's cancellation
        (or deadline) reaches the kernel as it would reach its task, and stops the step
        even when the kernel swallows it; an abort of the step (first error elsewhere,
        ``Session.close``) cancelled this task, and is taken back here: the step's
        error is the outcome.
        """
        if not self._kernel_raised(i, exc, alone=True)[0]:
            if self._alone_aborted:  # aborted, but the kernel failed anyway: take it back
                self._alone.uncancel()  # type: ignore[union-attr]
            return False
        if not isinstance(exc, asyncio.CancelledError):
            return True
        if not self._alone_aborted or self._alone.uncancel() > 0:  # type: ignore[union-attr]
            # The caller was cancelled (or its deadline passed): nothing new may start;
            # the kernel has seen the cancellation.
            self._stopped = True
            self._cancel_manager()
            return True
        return False

    def _wake(self) -> None:
        done = self._done
        if done is not None:
            if not done.done():
                done.set_result(None)
        elif self._alone is not None and self._tasks and self._loop is not None:
            # The step's own frame awaits its first kernel, beside tasks: no loop of
            # the step waits for this wake-up, so what a yield left is drained from
            # the event loop (the kernel awaited may wait for it).
            self._soon += 1
            self._loop.call_soon(self._drain_soon)

    def _drain_soon(self) -> None:
        """From the event loop (in the context of the task that yielded): go on
        draining, as the waiting loop of :meth:`_drive` would, while the step's own
        frame awaits a kernel beside its tasks."""
        self._soon -= 1
        if self._error is not None or self._stopped or not self.has_ready():
            return
        if self._trace is not None:
            self._trace.boundary()
        if not self._drain_quiet():
            self._wake()

    def _drain_quiet(self) -> bool:
        """``drain`` for one time slice, numpy quiet meanwhile (the step's code sets it
        only while it drains: a context holds nothing of a waiting step)."""
        quiet = quiet_numpy()
        try:
            return self.drain(time.perf_counter() + SLICE)
        finally:
            restore_numpy(quiet)

    def _kernel_context(self) -> contextvars.Context:
        """A context for work that runs outside the step's tasks (a thread kernel, a
        hand-off callback): the caller's, with this step running and numpy quiet."""
        ctx = contextvars.copy_context()
        ctx.run(_enter_context, self)
        return ctx

    # -- dispatching (called by the propagator) ---------------------------------------------

    def dispatch(
        self,
        token: Any,
        i: int,
        node: BoundNode,
        args: list[Any],
        frame_id: int = 0,
        iter_id: int = 0,
        is_dead: bool = False,
    ) -> None:
        """Start node ``i`` (``token`` to the propagator), which does not run inline."""
        kind = node.flow
        if kind == _ASYNC:  # (the common one first)
            # An async kernel with a ``nowait`` twin (queue ops) first tries to finish
            # at once, like an inline node: no task, no future.  Its error fails node i
            # through the drain.
            nowait = getattr(node.kernel, "nowait", None)
            if nowait is not None:
                v = nowait(*args)
                if v is not WOULD_BLOCK:
                    self.complete(token, v)
                    return
        elif kind == _SEND:
            self._send(token, i, node, args, frame_id, iter_id, is_dead)
            return
        elif kind == _RECV:
            self._recv(token, i, node, frame_id, iter_id)
            return
        self.start(token, i, args, kind == _ASYNC)

    def start(self, token: Any, i: int, args: list[Any], parkable: bool) -> None:
        """Start node ``i`` (``token`` to the engine), an async kernel (``parkable``)
        or a thread kernel: a task of the step's group, or, before the step has a
        group, noted for it (:meth:`_start_deferred`) — the first async one parked, for
        the awaiting frame to await (see :meth:`run`).  The dispatch hands such nodes
        here; a program's started calls come here directly (async, no twin)."""
        self._outstanding += 1
        spawn = self._spawn
        if spawn is None:
            if parkable and self._parked is None and not self._deferred:
                self._parked = (token, i, args)  # (see run)
                return
            deferred = self._deferred
            if deferred is None:
                deferred = self._deferred = []
            deferred.append((token, i, args))
        else:
            self._start_task(spawn, token, i, args)

    def _send(
        self,
        token: Any,
        i: int,
        node: BoundNode,
        args: list[Any],
        frame_id: int,
        iter_id: int,
        is_dead: bool,
    ) -> None:
        """Sends never block: done at once, like an inline node.  A dead value is sent
        too, flagged, so the receiving device sees the branch was not taken."""
        handoffs = self._handoffs
        if handoffs is None or handoffs.owner is not None:
            self._send_value(token, i, node, args, frame_id, iter_id, is_dead)
            return
        # The outermost send of a chain runs what the chain queues (module doc).
        handoffs.owner = self
        queue = handoffs.queue
        try:
            self._send_value(token, i, node, args, frame_id, iter_id, is_dead)
            if queue:  # most often one recv: run it here, the rest (if any) below
                until = time.perf_counter() + SLICE
                first = queue.popleft()
                first.step._handoff_drain(first, until)  # never this step
                if queue:
                    run_handoffs(queue, until)
        finally:
            handoffs.owner = None
            if queue:
                # (Only if this send raised after handing off: the loop runs them.)
                later(queue)

    def _send_value(
        self,
        token: Any,
        i: int,
        node: BoundNode,
        args: list[Any],
        frame_id: int,
        iter_id: int,
        is_dead: bool,
    ) -> None:
        trace = self._trace
        start = time.time() if trace is not None else 0.0
        kernel = node.kernel
        if type(kernel) is SendKernel and not (frame_id or iter_id):
            self._rendezvous.send(  # type: ignore[union-attr]
                kernel.key, args[0] if args else SEND_TOKEN, is_dead
            )
        else:
            kernel(self._rendezvous, frame_id, iter_id, *args, is_dead)
        if trace is not None:
            trace.transfer(i, start, frame_id, iter_id)
        self.complete(token, None)

    def _recv(self, token: Any, i: int, node: BoundNode, frame_id: int, iter_id: int) -> None:
        """A ``_Recv``: its value now, or a wait the matching send (or an abort) ends."""
        start = time.time() if self._trace is not None else 0.0
        if self._handoffs is not None:
            item = self._recv_or_wait(token, i, node, frame_id, iter_id, start)
        else:
            fut = asyncio.get_running_loop().create_future()
            item = node.kernel(self._rendezvous, frame_id, iter_id, fut)
            if item is None:
                # Wait without a task and without polling: the matching send (or an
                # abort) resolves the future, whose callback finishes the node.
                self._outstanding += 1
                if self._recvs is None:
                    self._recvs = set()
                self._recvs.add(fut)
                fut.add_done_callback(
                    functools.partial(self._recv_done, token, i, start, frame_id, iter_id)
                )
        if item is None:
            return
        # The value was there already (an abort raised: the drain fails node i).
        value, dead = item
        if self._trace is not None:
            self._trace.transfer(i, start, frame_id, iter_id)
        self.complete(token, Dead(self._bound.ops[i].name) if dead else value)

    def _recv_or_wait(
        self, token: Any, i: int, node: BoundNode, frame_id: int, iter_id: int, start: float
    ) -> tuple[Any, bool] | None:
        """A recv with hand-offs: its (value, is_dead), or None when it waits (a
        :class:`RecvWaiter` in the rendezvous, which the matching send completes)."""
        if self._trace is not None:
            waiter: RecvWaiter = TracedRecvWaiter(self, token, i, (start, frame_id, iter_id))
        else:
            waiter = self._spare  # type: ignore[assignment]
            if waiter is None:
                waiter = self._spare = RecvWaiter(self, token, i)
            else:
                waiter.token = token
                waiter.i = i
        kernel = node.kernel
        if type(kernel) is RecvKernel and not (frame_id or iter_id):
            item = self._rendezvous.recv_or_wait(kernel.key, waiter)  # type: ignore[union-attr]
        else:
            item = kernel(self._rendezvous, frame_id, iter_id, waiter)
        if item is None:  # the matching send (or an abort) completes the waiter
            self._spare = None  # the rendezvous holds it now
            self._outstanding += 1
            if self._ctx is None:
                self._ctx = self._kernel_context()
        return item

    def _start_task(
        self,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        token: Any,
        i: int,
        args: list[Any],
    ) -> None:
        if self._stopped:
            self._outstanding -= 1
            return
        # The task leaves _tasks itself when its body ends (no done callback to schedule);
        # one cancelled before it started stays until the step, which is failing, ends.
        # Its node beside it: what ``running`` names.
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = {}
        label = self._label() if self._trace is not None else None
        tasks[spawn(self._run_node(token, i, args, label))] = i

    async def _run_node(
        self,
        token: Any,
        i: int,
        args: list[Any],
        label: tuple[str, int] | None,
    ) -> None:
        """A task body: run one async or thread node and finish it (a lone async node
        is awaited by the step's own task instead: see :meth:`run`).

        The kernel's coroutine is made here, inside the task, so a task cancelled
        before it starts leaves no coroutine that was never awaited.
        """
        task = asyncio.current_task(self._loop)
        keep = False  # a task leaves _tasks as its body ends, unless it raises (below)
        try:
            try:
                # The kernel's step, for the kernel (its cancellation manager, a function
                # call's caller): a task of the step's own, so none was there before.
                awaiting[task] = self
                try:
                    node = self._nodes[i]
                    if node.flow == _ASYNC:  # (the common kind)
                        if label is not None:  # what a traced kernel records
                            self._trace.label = label  # type: ignore[union-attr]
                        work, convert = self._async_work(node.kernel, args)
                    else:  # a thread kernel, in a context made for it
                        convert = None
                        work = self._bound.device.run_in_thread(
                            call_in_thread, self._kernel_context(), node.kernel, args
                        )
                    v = await work
                finally:
                    del awaiting[task]
                if convert is not None:
                    v = convert(v)
            except BaseException as exc:
                reraise, keep = self._kernel_raised(i, exc, alone=False)
                if reraise:
                    raise
                return
            self._outstanding -= 1
            self._finish(token, i, v)
        finally:
            if not keep and self._tasks is not None:
                self._tasks.pop(task, None)  # type: ignore[arg-type]
            # (A failure's traceback keeps this frame: not the task too, whose
            # cancellation error would keep the traceback, a cycle.)
            del task

    def _kernel_raised(self, i: int, exc: BaseException, alone: bool) -> tuple[bool, bool]:
        """THE rule for an awaited kernel (async or thread node ``i``) that raised:
        an ``Exception``, or a ``CancelledError`` of its own while nobody cancels this
        task, fails the node (:meth:`fail`); a cancellation of the caller, or a
        ``BaseException`` that is neither, goes on up.  Returns (raise it on, keep the
        task in ``_tasks`` so the step's own group raises it)."""
        self._outstanding -= 1
        if isinstance(exc, Exception) or (
            isinstance(exc, asyncio.CancelledError) and not _being_cancelled()
        ):
            # (A CancelledError the kernel raised itself, nobody cancelling: its failure.)
            tb = exc.__traceback__
            if alone and tb is not None:
                # The awaiting frame is the step's own task's, holding that task: no
                # part of the kernel's failure, and the step's error (which the caller
                # may keep in that task's result) would hold it in a cycle.
                exc.__traceback__ = tb.tb_next
            self.fail(i, exc)
            return False, False
        if isinstance(exc, asyncio.CancelledError):
            return True, False
        return True, self._stop_for_base_exception(alone)

    def _async_work(
        self, kernel: Callable[..., Any], args: list[Any]
    ) -> tuple[Any, Callable[[Any], Any] | None]:
        """(what to await, the conversion of its result or None) for an async kernel.
        One with ``parts``, ``(func, convert)`` (a py_func:
        ``convert(await func(*args))``), runs as those: a coroutine less."""
        parts = getattr(kernel, "parts", None) if self._bound.options.kernel_parts else None
        if parts is None:
            return kernel(*args), None
        func, convert = parts
        return func(*args), convert

    def _stop_for_base_exception(self, alone: bool) -> bool:
        """A kernel raised neither an error nor a cancellation (KeyboardInterrupt,
        SystemExit, ...): the step stops; True when its task must keep its place in
        ``_tasks`` so that the step's own group raises it (a lone node's reaches the
        caller as it is; an ``asyncio.TaskGroup`` does this itself, and raises it)."""
        spawn = self._spawn  # the loop's create_task in the step's own group
        if alone or getattr(spawn, "__self__", None) is not self._loop:
            return False
        self._stopped = True
        self._cancel_tasks()
        self._wake()
        return True

    def _recv_done(
        self,
        token: Any,
        i: int,
        start: float,
        frame_id: int,
        iter_id: int,
        fut: asyncio.Future[Any],
    ) -> None:
        self._outstanding -= 1
        self._recvs.discard(fut)  # type: ignore[union-attr]
        if fut.cancelled():
            self._wake()
            return
        exc = fut.exception()  # always retrieved, so asyncio never logs it
        if exc is not None:
            self._fail(i, exc)
            return
        if self._trace is not None:
            self._trace.transfer(i, start, frame_id, iter_id)
        value, dead = fut.result()
        self._finish(token, i, Dead(self._bound.ops[i].name) if dead else value)

    # -- hand-offs (see the module docstring) ---------------------------------------------

    def _handoff_ready(self, waiter: RecvWaiter) -> None:
        """A recv of this step, whose send is the outermost of the running chain (so the
        step is draining below it): ready its consumers only, that drain goes on
        with them."""
        self._outstanding -= 1
        if self._error is not None or self._stopped:
            return
        value, dead = waiter.result  # type: ignore[misc]
        i = waiter.i
        if self._trace is not None:
            self._trace.transfer(i, *waiter.trace)  # type: ignore[attr-defined]
        try:
            self.complete(waiter.token, Dead(self._bound.ops[i].name) if dead else value)
        except Exception as exc:
            self._fail(i, exc)

    def _handoff_drain(self, waiter: RecvWaiter, until: float) -> None:
        """A recv of this step completed while the step was not draining: finish the
        node and drain until ``until`` (its own sends queue what they complete).
        ``_finish``, with the caller's time slice."""
        self._outstanding -= 1
        if self._error is not None or self._stopped:
            self._wake()
            return  # late result of a failed or cancelled step: discarded
        value, dead = waiter.result  # type: ignore[misc]
        i = waiter.i
        prop = self
        tracing = None
        if self._trace is not None:
            self._trace.transfer(i, *waiter.trace)  # type: ignore[attr-defined]
            tracing = self._trace.on()  # traced kernels record here, not in the sender
        try:
            prop.complete(waiter.token, Dead(self._bound.ops[i].name) if dead else value)
            drained = prop.drain(until)
        except Exception as exc:
            self._fail(i, exc)
            return
        finally:
            if tracing is not None:
                StepTrace.off(tracing)
        if not drained or self._error is not None:
            self._wake()  # the waiting loop goes on draining after a yield, or fails
        elif not self._outstanding:
            self._finished = True  # before any deadline or close can land
            self._wake()

    def _handoff_later(self, waiter: RecvWaiter) -> None:
        """From the event loop (in the step's context): a recv completed by something
        other than this step group's sends, or left over after a time slice."""
        result = waiter.result
        if isinstance(result, BaseException):
            self._outstanding -= 1
            if not self._stopped:
                self._fail(waiter.i, result)
            return
        self._handoff_drain(waiter, time.perf_counter() + SLICE)

    def _finish(self, token: Any, i: int, v: Any) -> None:
        """Complete a dispatched node with ``v``, then drain what became ready."""
        if self._error is not None or self._stopped:
            self._wake()
            return  # late result of a failed or cancelled step: discarded
        prop = self
        try:
            readied = prop.complete(token, v)
        except Exception as exc:
            self._fail(i, exc)
            return
        if self._trace is not None:
            self._trace.boundary()
        if readied is False and self._outstanding:
            return  # nothing to drain: another node is running, which wakes the step
        if not self._drain_quiet():
            self._wake()  # the waiting loop goes on draining after a yield
        elif self._error is not None:
            self._wake()
        elif not self._outstanding:
            self._finished = True  # before any deadline or close can land
            self._wake()

    def _cancel_tasks(self) -> None:
        alone = self._alone
        if (
            alone is not None
            and not self._alone_aborted
            and alone is not asyncio.current_task(self._loop)
        ):
            self._alone_aborted = True  # the lone node awaited in the step's own task
            alone.cancel()  # (see _alone_raised)
        for task in self._tasks or ():
            if not task.cancelling():  # once: a kernel's cleanup is not interrupted
                task.cancel()
        for fut in self._recvs or ():
            fut.cancel()

    # -- failure --------------------------------------------------------------------------

    def fail(self, i: int, exc: BaseException) -> None:
        """THE failing-kernel rule, every engine's: node ``i``'s kernel raised ``exc``,
        an ``Exception`` or a ``CancelledError`` of its own (it awaited a future
        someone else cancelled: a failure of the node, never a cancellation of the
        step); the step fails with the node's error (the first error wins)."""
        if isinstance(exc, asyncio.CancelledError):
            exc = errors.CancelledError(None, None, f"kernel raised {exc!r}")
        self._fail(i, exc)

    def _fail(self, i: int, exc: BaseException) -> None:
        op = self._bound.ops[i] if i >= 0 else None
        error = errors.from_exception(exc) if op is None else format_node_error(exc, op)
        error.__cause__ = exc
        self._fail_with(error)

    def _fail_with(self, error: errors.OpError) -> None:
        if self._error is not None or self._finished:
            return  # the first error wins; this one is derived, late, or the step is done
        self._error = error
        self.clear()
        self._cancel_manager()  # kernels polling or with callbacks stop too
        self._cancel_tasks()
        self._wake()

    # -- results --------------------------------------------------------------------------

    def _retvals(self) -> list[Any]:
        """The fetched values (the _Retval nodes); marks the step finished."""
        try:
            retvals = self._results = self.retvals()
        except errors.OpError as error:  # a fetched tensor is dead
            self._finished = False
            self._error = error
            raise
        self._finished = True
        return retvals

    # -- observation (the hooks of :mod:`asyncflow.runtime.observe`) ----------------------

    def _label(self) -> tuple[str, int] | None:
        """The (frame, iteration) a traced async kernel started now records (loops)."""
        return self._trace.label if self._trace is not None else None

    def record(
        self, i: int, kind: str, start: float, end: float, outputs: Sequence[Any], key: str = ""
    ) -> None:
        """Append node ``i``'s stats (traced steps only)."""
        self._trace.record(i, kind, start, end, outputs, key)  # type: ignore[union-attr]

    @property
    def tracing(self) -> bool:
        """Whether this step records node stats."""
        return self._trace is not None

    def merge_stats(self, stats: StepStats, prefix: str) -> None:
        """Add a nested step's node stats (a function call's body), names prefixed."""
        if self._trace is not None:
            self._trace.merge(stats, prefix)


class _Abortable(Protocol):
    _error: errors.OpError | None
    _finished: bool

    def _fail_with(self, error: errors.OpError) -> None: ...


def abort_on_loop(
    step: _Abortable, loop: asyncio.AbstractEventLoop | None, error: errors.OpError
) -> None:
    """Fail ``step`` from any thread: on its loop if it is waiting on one."""
    if loop is None:
        # Not waiting on a loop: finished, not started, or running synchronously; the
        # error is recorded and seen at its next check.
        if step._error is None and not step._finished:
            step._error = error
        return
    try:
        loop.call_soon_threadsafe(step._fail_with, error)
    except RuntimeError:  # loop closed: the step is over
        pass


def clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames ``exc`` (a cancellation on its way out of
    a step) and the exceptions it replaced went through.  Those frames (the step's, a
    task group's ``__aexit__`` holding ``exc`` itself) would otherwise make reference
    cycles the cycle collector has to find; the frames still running are kept."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__context__


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class _GeneralStep(Step, PropagatorState):
    """A step its plan's general propagator runs (see :class:`Step`)."""

    __slots__ = GENERAL_SLOTS


class _ProgramStep(Step, ProgramPropagator):
    """A step its plan's straight-line program runs (see :class:`Step`)."""

    __slots__ = PROGRAM_SLOTS
