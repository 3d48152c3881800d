"""The executor: one :class:`Step` runs one partition of a plan, once.

State machine of a step (TensorFlow's ``ExecutorState``, on the event loop)::

    created ──run()──► draining ──(tasks / recvs outstanding, or budget used up)──► waiting
                          ▲                                                        │
                          └──── a task or recv finishes its node / the loop yields ◄┘
    draining/waiting ──(nothing ready, nothing outstanding)──► done
    any ──(first error | abort | cancel | deadline)──► failing ──(every task finished)──► failed

The step owns what is the same for every graph: dispatching nodes that do not run
inline (async kernels become tasks of the step's ``asyncio.TaskGroup``, expensive
ones tasks awaiting a worker thread of the device, ``_Recv`` a waiter that the
matching send completes, no task), the first-error rule, cancellation, deadlines,
yielding to the event loop on a budget, tracing.  *Which nodes are ready* is the
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
:class:`HandoffQueue`.  A ``_Recv`` that waits leaves a :class:`_RecvWaiter` in the
rendezvous (no future); the matching ``_Send`` completes it synchronously, and the
receiving partition's node finishes and its partition drains right away, on the
sender's stack, without a trip through the event loop.  To keep that stack flat, the
outermost send of such a chain owns the queue: completions made meanwhile (by the
sends of the partitions it drains) are queued and run one after the other by the
owner, and a completion for the owner itself only readies its node (the owner's own
drain, below the send, goes on with it).  However long the chain of device changes,
at most two drains are on the stack.  A waiter completed by anything else (a remote
pull, a partial run's feed, an abort) runs from the event loop instead.  Without a
queue (a lone step, or ``barrier.HANDOFFS`` off) every wait is an ``asyncio.Future``
with a done callback: the general path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from asyncflow import errors
from asyncflow.compiler.keys import frame_key
from asyncflow.framework import registry
from asyncflow.runtime.bind import SEND_TOKEN, BoundNode, BoundPlan, RecvKernel, SendKernel
from asyncflow.runtime.cancellation import CancellationManager
from asyncflow.runtime.cancellation import _activate as _activate_cancellation
from asyncflow.runtime.cancellation import _deactivate as _deactivate_cancellation
from asyncflow.runtime.propagators import Dead, FramePropagator, PlainPropagator, Propagator
from asyncflow.step_stats import DeviceStepStats, NodeExecStats, NodeOutput, StepStats

if TYPE_CHECKING:
    from asyncflow.runtime.call_frame import CallFrame
    from asyncflow.runtime.rendezvous import Rendezvous

__all__ = ["SLICE", "HandoffQueue", "Step", "abort_on_loop", "current_step",
           "format_node_error"]

#: How long (seconds) a step drains before it yields to the event loop: long inline
#: work still honours deadlines and cancellation, and other tasks keep running.
SLICE = 0.001
#: Hand-offs run between two looks at the clock by the send that runs them.
_HANDOFF_CHECK_EVERY = 32

_ASYNC = registry.ASYNC

#: The step whose async kernel runs in this task (set in the kernel's own task, so
#: it is seen only there): a function call kernel runs its body as a nested step
#: that joins this one's tracing.
current_step: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "asyncflow_current_step", default=None)
_SEND = registry.SEND
_RECV = registry.RECV


# Kernels run with numpy's floating-point warnings off (TF does not warn either).
# np.errstate(all="ignore") costs ~1 us per step on a ~6 us tiny run, most of it
# building the same error object each time: set numpy's context variable to one
# prebuilt object instead, when this numpy has it (numpy >= 2), else use errstate.
try:
    from numpy._core._ufunc_config import (  # type: ignore[attr-defined]
        _extobj_contextvar,
        _make_extobj,
    )

    _QUIET = _make_extobj(all="ignore")

    def _quiet_numpy() -> Any:
        return _extobj_contextvar.set(_QUIET)

    def _restore_numpy(token: Any) -> None:
        _extobj_contextvar.reset(token)
except ImportError:  # pragma: no cover - older numpy
    def _quiet_numpy() -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def _restore_numpy(token: Any) -> None:
        token.__exit__(None, None, None)


def format_node_error(exc: BaseException, op: Any) -> errors.OpError:
    """The OpError for a kernel's exception: names the node, its type and creation site."""
    base = errors.from_exception(exc, op)
    return type(base)(base.node_def, op, f"{base.message}\n\t [[node {op.name} "
                      f"(op {op.type}, defined at {op.traceback})]]")


class Step:
    """One run of one partition: dispatch, tasks, first error, tracing; readiness is
    the propagator's."""

    __slots__ = (
        "_bound",
        "_cm",
        "_ctx",
        "_deferred",
        "_done",
        "_error",
        "_finished",
        "_frame",
        "_handoffs",
        "_label",
        "_loop",
        "_nodes",
        "_outstanding",
        "_prop",
        "_recvs",
        "_rendezvous",
        "_stats",
        "_stopped",
        "_tasks",
        "_tg",
    )

    def __init__(self, bound: BoundPlan, frame: CallFrame, trace: bool = False,
                 rendezvous: Rendezvous | None = None,
                 cancellation: CancellationManager | None = None,
                 handoffs: HandoffQueue | None = None) -> None:
        self._bound = bound
        self._frame = frame
        self._rendezvous = rendezvous
        self._cm = cancellation
        # Shared by the partitions of the step (None: waits are futures, see module doc).
        self._handoffs = handoffs
        # The step's context (numpy quiet, cancellation, tracing), for hand-offs run
        # from the event loop; taken at the first recv that waits.
        self._ctx: contextvars.Context | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None
        # Dispatched, unfinished nodes: tasks (and deferred ones) and waiting recvs.
        self._outstanding = 0
        self._deferred: list[tuple[Any, int, list[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._recvs: set[asyncio.Future[Any]] = set()
        self._error: errors.OpError | None = None  # the first error; written once
        self._stopped = False  # no new node may start, late results are dropped
        # Every node ran and nothing failed: the step's outcome is its results, whatever
        # deadline, close or abort arrives after this (written once, on the loop thread).
        self._finished = False
        #: The (frame name, iteration) the frame propagator is running a node in.
        self._label: tuple[str, int] | None = None
        # Traced steps: one raw record per node run (made into NodeExecStats only when
        # the stats are read, so a traced node costs little more than two clock reads).
        self._stats: list[Any] | None = None
        nodes = bound.nodes
        if trace:
            self._stats = []
            nodes = _traced_nodes(bound)
        self._nodes = nodes
        prop: Propagator = (FramePropagator if bound.frames else PlainPropagator)(
            self, bound, nodes, frame.args)
        self._prop = prop

    # -- public -------------------------------------------------------------------------

    def run_inline(self, slice_s: float | None = None) -> list[Any] | None:
        """Run without an event loop, for at most ``slice_s`` seconds (to the end when None).

        Returns the retvals when the step finished, None when work is left (the caller
        continues with ``await run()``).  Only for plans whose nodes are all inline.
        """
        quiet = _quiet_numpy()
        try:
            finished = self._prop.drain(
                math.inf if slice_s is None else time.perf_counter() + slice_s)
        finally:
            _restore_numpy(quiet)
        if self._error is not None:
            raise self._error
        if not finished or self._outstanding:
            return None
        return self._retvals()

    async def run(self) -> list[Any]:
        """Run the step; returns the frame's retvals (the fetched values, in plan order).

        Raises the step's first error as an ``OpError``.  Returns or raises only after
        every task the step started has finished.
        """
        cm = self._cm
        if cm is None:
            cm = self._cm = CancellationManager()
        token = _activate_cancellation(cm)
        # Traced kernels (shared by every traced step of the plan) find their step here;
        # tasks and recv callbacks made during the step inherit it.
        tracing = _TRACING.set(self) if self._stats is not None else None
        quiet = _quiet_numpy()
        try:
            finished = self._error is not None or self._prop.drain(time.perf_counter() + SLICE)
            if self._error is None and (not finished or self._outstanding):
                await self._run_tasks()
        finally:
            _restore_numpy(quiet)
            if tracing is not None:
                _TRACING.reset(tracing)
            _deactivate_cancellation(token)
        if self._error is not None:
            raise self._error
        return self._retvals()

    @property
    def finished(self) -> bool:
        """Every node of the step ran and none failed (its results stand)."""
        return self._finished

    def results(self) -> list[Any]:
        """The retvals of a finished step (the outcome when a deadline or cancellation
        arrived after its last node ran)."""
        assert self._finished
        return self._retvals()

    def abort(self, error: errors.OpError) -> None:
        """Fail the step with ``error`` (if it has not failed yet).  Loop thread only."""
        self._fail_with(error)

    def release(self) -> None:
        """The caller is done with the step (results taken, error read): break its
        reference cycles (step <-> propagator, step -> error -> traceback -> frames ->
        step) so it is freed by reference counting, not by the cycle collector."""
        self._prop._step = None  # type: ignore[attr-defined]
        self._error = None
        self._cm = None
        # A recv still waiting (the step was cancelled) holds the step from the
        # rendezvous, and the step's context may hold the step: cut both; a released
        # step never runs again (a late value is dropped).
        self._stopped = True
        self._rendezvous = None
        self._ctx = None

    def abort_threadsafe(self, error: errors.OpError) -> None:
        """Fail the step from any thread (used by ``Session.close``)."""
        abort_on_loop(self, self._loop, error)

    @property
    def error(self) -> errors.OpError | None:
        """The step's first error, once it has one."""
        return self._error

    @property
    def frame(self) -> CallFrame:
        """The step's call frame (its retvals are set when it finishes)."""
        return self._frame

    @property
    def stats(self) -> StepStats | None:
        """The step's stats when it ran traced (one device: the partition's)."""
        if self._stats is None:
            return None
        return StepStats([DeviceStepStats(self._bound.plan.device,
                                          [self._exec_stats(r) for r in self._stats])])

    # -- waiting for tasks ----------------------------------------------------------------

    async def _run_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        prop = self._prop
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                deferred, self._deferred = self._deferred, []
                for token, i, args in deferred:
                    self._start_task(tg, token, i, args)
                if self._error is not None:
                    self._cancel_tasks()  # aborted from another thread before the loop was known
                try:
                    while self._error is None:
                        if prop.has_ready():
                            if not prop.drain(time.perf_counter() + SLICE):
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
                    if self._cm is not None:
                        self._cm.cancel()
                    raise
                finally:
                    self._done = None
                    if self._error is not None or self._stopped:
                        self._cancel_tasks()
        except BaseExceptionGroup as group:
            # Only a BaseException that is not an Exception gets here (kernel errors
            # are caught in the tasks): re-raise it as itself, never as a group.
            raise group.exceptions[0] from None
        finally:
            self._stopped = True
            self._tg = None
            self._loop = None

    def _wake(self) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)

    # -- dispatching (called by the propagator) ---------------------------------------------

    def dispatch(self, token: Any, i: int, node: BoundNode, args: list[Any],
                 frame_id: int = 0, iter_id: int = 0, is_dead: bool = False) -> None:
        """Start node ``i`` (``token`` to the propagator), which does not run inline."""
        kind = node.flow
        if kind == _SEND:
            # Sends never block: done at once, like an inline node.  A dead value is
            # sent too, flagged, so the receiving device sees the branch was not taken.
            start = time.time() if self._stats is not None else 0.0
            handoffs = self._handoffs
            # The outermost send of a chain runs what the chain queues (module doc).
            owner = handoffs is not None and handoffs.owner is None
            if owner:
                handoffs.owner = self  # type: ignore[union-attr]
            try:
                kernel = node.kernel
                if type(kernel) is SendKernel and not (frame_id or iter_id):
                    self._rendezvous.send(  # type: ignore[union-attr]
                        kernel.key, args[0] if args else SEND_TOKEN, is_dead)
                else:
                    kernel(self._rendezvous, frame_id, iter_id, *args, is_dead)
                if self._stats is not None:
                    self._record_transfer(i, start, frame_id, iter_id)
                self._prop.complete(token, None)
                if owner and handoffs.queue:  # type: ignore[union-attr]
                    self._run_handoffs(handoffs.queue)  # type: ignore[union-attr]
            finally:
                if owner:
                    handoffs.owner = None  # type: ignore[union-attr]
                    if handoffs.queue:  # type: ignore[union-attr]
                        # (Only if this send raised after handing off: the loop runs them.)
                        _later(handoffs.queue)  # type: ignore[union-attr]
            return
        if kind == _RECV:
            start = time.time() if self._stats is not None else 0.0
            if self._handoffs is not None:
                waiter = (_RecvWaiter(self, token, i) if self._stats is None else
                          _TracedRecvWaiter(self, token, i, (start, frame_id, iter_id)))
                kernel = node.kernel
                if type(kernel) is RecvKernel and not (frame_id or iter_id):
                    item = self._rendezvous.recv_or_wait(  # type: ignore[union-attr]
                        kernel.key, waiter)
                else:
                    item = kernel(self._rendezvous, frame_id, iter_id, waiter)
                if item is None:  # the matching send (or an abort) completes the waiter
                    self._outstanding += 1
                    if self._ctx is None:
                        self._ctx = contextvars.copy_context()
                    return
            else:
                fut = asyncio.get_running_loop().create_future()
                item = node.kernel(self._rendezvous, frame_id, iter_id, fut)
                if item is None:
                    # Wait without a task and without polling: the matching send (or an
                    # abort) resolves the future, whose callback finishes the node.
                    self._outstanding += 1
                    self._recvs.add(fut)
                    fut.add_done_callback(functools.partial(self._recv_done, token, i, start,
                                                            frame_id, iter_id))
                    return
            # The value was there already (an abort raised: the drain fails node i).
            value, dead = item
            if self._stats is not None:
                self._record_transfer(i, start, frame_id, iter_id)
            self._prop.complete(token, Dead(self._bound.ops[i].name) if dead else value)
            return
        self._outstanding += 1
        tg = self._tg
        if tg is None:
            self._deferred.append((token, i, args))
        else:
            self._start_task(tg, token, i, args)

    def _start_task(self, tg: asyncio.TaskGroup, token: Any, i: int, args: list[Any]) -> None:
        if self._stopped:
            self._outstanding -= 1
            return
        task = tg.create_task(self._run_node(token, i, args, self._label))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_node(self, token: Any, i: int, args: list[Any],
                        label: tuple[str, int] | None) -> None:
        """Run one async or thread node and finish it (a task body).

        The kernel's coroutine is made here, inside the task, so a task cancelled
        before it starts leaves no coroutine that was never awaited.
        """
        try:
            node = self._nodes[i]
            if node.flow == _ASYNC:
                self._label = label  # what a traced kernel records (frame, iteration)
                current_step.set(self)
                work: Coroutine[Any, Any, Any] = node.kernel(*args)
            else:
                work = self._bound.device.run_in_thread(
                    _call_in_thread, contextvars.copy_context(), node.kernel, args)
            v = await work
        except Exception as exc:
            self._outstanding -= 1
            self._fail(i, exc)
            return
        except asyncio.CancelledError as exc:
            self._outstanding -= 1
            if not _being_cancelled():
                # The kernel raised CancelledError itself (e.g. it awaited a future
                # someone else cancelled): that is a failure of this node.
                self._fail(i, errors.CancelledError(None, None, f"kernel raised {exc!r}"))
                return
            raise
        self._outstanding -= 1
        self._finish(token, i, v)

    def _recv_done(self, token: Any, i: int, start: float, frame_id: int, iter_id: int,
                   fut: asyncio.Future[Any]) -> None:
        self._outstanding -= 1
        self._recvs.discard(fut)
        if fut.cancelled():
            self._wake()
            return
        exc = fut.exception()  # always retrieved, so asyncio never logs it
        if exc is not None:
            self._fail(i, exc)
            return
        if self._stats is not None:
            self._record_transfer(i, start, frame_id, iter_id)
        value, dead = fut.result()
        self._finish(token, i, Dead(self._bound.ops[i].name) if dead else value)

    # -- hand-offs (see the module docstring) ---------------------------------------------

    def _run_handoffs(self, queue: deque[_RecvWaiter]) -> None:
        """Run the completed recvs a chain of sends queued (this step's send is the
        outermost).  After a time slice, the rest are left to the event loop."""
        until = time.perf_counter() + SLICE
        count = 0
        while queue:
            waiter = queue.popleft()
            waiter.step._handoff_drain(waiter, until)  # never this step (see set_result)
            count += 1
            if not count % _HANDOFF_CHECK_EVERY and queue and time.perf_counter() >= until:
                _later(queue)  # the slice is over: yield to the loop
                return

    def _handoff_ready(self, waiter: _RecvWaiter) -> None:
        """A recv of this step, whose send is the outermost of the running chain (so the
        step is draining below it): ready its consumers only, that drain goes on
        with them."""
        self._outstanding -= 1
        if self._error is not None or self._stopped:
            return
        value, dead = waiter.result  # type: ignore[misc]
        i = waiter.i
        if self._stats is not None:
            self._record_transfer(i, *waiter.trace)  # type: ignore[attr-defined]
        try:
            self._prop.complete(waiter.token, Dead(self._bound.ops[i].name) if dead else value)
        except Exception as exc:
            self._fail(i, exc)

    def _handoff_drain(self, waiter: _RecvWaiter, until: float) -> None:
        """A recv of this step completed while the step was not draining: finish the
        node and drain until ``until`` (its own sends queue what they complete).
        ``_finish``, with the caller's time slice."""
        self._outstanding -= 1
        if self._error is not None or self._stopped:
            self._wake()
            return  # late result of a failed or cancelled step: discarded
        value, dead = waiter.result  # type: ignore[misc]
        i = waiter.i
        prop = self._prop
        tracing = None
        if self._stats is not None:
            self._record_transfer(i, *waiter.trace)  # type: ignore[attr-defined]
            tracing = _TRACING.set(self)  # traced kernels record here, not in the sender
        try:
            prop.complete(waiter.token, Dead(self._bound.ops[i].name) if dead else value)
            drained = prop.drain(until)
        except Exception as exc:
            self._fail(i, exc)
            return
        finally:
            if tracing is not None:
                _TRACING.reset(tracing)
        if not drained or self._error is not None:
            self._wake()  # the waiting loop goes on draining after a yield, or fails
        elif not self._outstanding:
            self._finished = True  # before any deadline or close can land
            self._wake()

    def _handoff_later(self, waiter: _RecvWaiter) -> None:
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
        prop = self._prop
        try:
            prop.complete(token, v)
        except Exception as exc:
            self._fail(i, exc)
            return
        if not prop.drain(time.perf_counter() + SLICE):
            self._wake()  # the waiting loop goes on draining after a yield
        elif self._error is not None:
            self._wake()
        elif not self._outstanding:
            self._finished = True  # before any deadline or close can land
            self._wake()

    def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for fut in self._recvs:
            fut.cancel()

    # -- failure --------------------------------------------------------------------------

    def fail(self, i: int, exc: BaseException) -> None:
        """Node ``i``'s kernel raised ``exc``: the step fails (first error wins)."""
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
        self._prop.clear()
        if self._cm is not None:
            self._cm.cancel()  # kernels polling or with callbacks stop too
        self._cancel_tasks()
        self._wake()

    # -- results --------------------------------------------------------------------------

    def _retvals(self) -> list[Any]:
        """The fetched values (the _Retval nodes); marks the step finished."""
        try:
            retvals = self._frame.retvals = self._prop.retvals()
        except errors.OpError as error:  # a fetched tensor is dead
            self._finished = False
            self._error = error
            raise
        self._finished = True
        return retvals

    # -- tracing --------------------------------------------------------------------------

    def record(self, i: int, kind: str, start: float, end: float, outputs: Sequence[Any],
               key: str = "") -> None:
        """Append node ``i``'s stats (traced steps only)."""
        self._stats.append((i, kind, start, end, threading.get_ident(),  # type: ignore[union-attr]
                            tuple(_output_info(o) for o in outputs), key, self._label))

    def _exec_stats(self, record: Any) -> NodeExecStats:
        """A raw record as TF's ``NodeExecStats`` (merged nested stats are already so)."""
        if isinstance(record, NodeExecStats):
            return record
        i, kind, start, end, tid, outputs, key, label = record
        op = self._bound.ops[i]
        outs = [NodeOutput(k, tuple(shape), _dtype_name(dtype), int(nbytes))
                for k, info in enumerate(outputs) if info is not None
                for shape, dtype, nbytes in (info,)]
        start_us = int(start * 1e6)
        dur = int((end - start) * 1e6)
        where = f" [frame {label[0]} iter {label[1]}]" if label is not None and label[0] else ""
        return NodeExecStats(
            node_name=op.name, op_type=op.type, kind=kind, scheduled_micros=start_us,
            all_start_micros=start_us, op_start_rel_micros=0, op_end_rel_micros=dur,
            all_end_rel_micros=dur, thread_id=tid,
            timeline_label=f"{op.name} = {op.type}(){where}", output=outs,
            rendezvous_key=key, frame_name=label[0] if label is not None else "",
            iter_id=label[1] if label is not None else 0)

    def _record_transfer(self, i: int, start: float, frame_id: int, iter_id: int) -> None:
        node = self._bound.plan.nodes[i]
        key = node.attrs["key"]
        if frame_id or iter_id:
            key = frame_key(key, frame_id, iter_id)
        self.record(i, "send" if node.op == "_Send" else "recv", start, time.time(), (),
                    key=key)

    @property
    def tracing(self) -> bool:
        """Whether this step records node stats."""
        return self._stats is not None

    def merge_stats(self, stats: StepStats, prefix: str) -> None:
        """Add a nested step's node stats (a function call's body), names prefixed."""
        if self._stats is None:
            return
        for dev in stats.dev_stats:
            for n in dev.node_stats:
                n.node_name = prefix + n.node_name
                n.timeline_label = prefix + n.timeline_label
                self._stats.append(n)  # already a NodeExecStats


def _later(queue: deque[_RecvWaiter]) -> None:
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
        self.queue: deque[_RecvWaiter] = deque()

    def __repr__(self) -> str:
        return f"<HandoffQueue owner={self.owner!r} queued={len(self.queue)}>"


class _RecvWaiter:
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


class _TracedRecvWaiter(_RecvWaiter):
    """The waiter of a traced step's recv: also what its transfer record needs."""

    __slots__ = ("trace",)

    def __init__(self, step: Step, token: Any, i: int, trace: tuple[float, int, int]) -> None:
        super().__init__(step, token, i)
        #: (when the recv started, frame id, iteration).
        self.trace = trace


#: The step a traced kernel records into (set by ``Step.run`` of a traced step).
_TRACING: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "asyncflow_tracing_step", default=None)
#: Traced kernels per bound plan, made once: a traced step allocates no closures (and
#: so no reference cycles) per node.
_TRACED: weakref.WeakKeyDictionary[BoundPlan, tuple[BoundNode, ...]] = (
    weakref.WeakKeyDictionary())


def _traced_nodes(bound: BoundPlan) -> tuple[BoundNode, ...]:
    nodes = _TRACED.get(bound)
    if nodes is None:
        nodes = _TRACED[bound] = tuple(_traced_node(i, n) for i, n in enumerate(bound.nodes))
    return nodes


def _traced_node(i: int, node: BoundNode) -> BoundNode:
    """``node`` with a kernel that records when it ran into the current traced step."""
    flow = node.flow
    if flow not in (registry.INLINE, registry.ASYNC, registry.EXPENSIVE):
        return node  # transfers are recorded by dispatch, control flow by the propagator
    kernel = node.kernel
    kind = registry.KERNEL_KINDS[flow]
    single = node.num_outputs == 1
    now = time.time
    current = _TRACING.get

    def info(v: Any) -> tuple[Any, ...]:
        return (_output_info(v),) if single else tuple(_output_info(o) for o in (v or ()))

    if flow == _ASYNC:
        async def timed(coro: Coroutine[Any, Any, Any], step: Step | None,
                        label: tuple[str, int] | None) -> Any:
            start = now()
            v = await coro
            if step is not None and step._stats is not None:
                step._stats.append((i, kind, start, now(), threading.get_ident(), info(v),
                                    "", label))
            return v

        def traced_async(*args: Any) -> Any:
            step = current()
            return timed(kernel(*args), step, step._label if step is not None else None)
        wrapped: Callable[..., Any] = traced_async
    else:
        ident = threading.get_ident

        def traced(*args: Any) -> Any:
            # The per-node cost of tracing: two clock reads, one lookup, one tuple.
            start = now()
            v = kernel(*args)
            end = now()
            step = current()
            if step is not None and step._stats is not None:
                step._stats.append((i, kind, start, end, ident(), info(v), "", step._label))
            return v
        wrapped = traced
    return BoundNode(wrapped, *node[1:])


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """The name of a dtype given by its scalar type, memoized (numpy computes
    ``dtype.name`` anew on every access, and hashing dtypes is slow)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def _output_info(o: Any) -> tuple[tuple[int, ...], Any, int] | None:
    """(shape, dtype, bytes) of a node's output, without keeping the value alive."""
    if o is None or isinstance(o, Dead):
        return None
    if not isinstance(o, np.ndarray | np.generic):
        o = np.asarray(o)
    return o.shape, o.dtype.type, o.nbytes  # the scalar type: hashed fast, named later


class _Abortable(Protocol):
    _error: errors.OpError | None
    _finished: bool

    def _fail_with(self, error: errors.OpError) -> None: ...


def abort_on_loop(step: _Abortable, loop: asyncio.AbstractEventLoop | None,
                  error: errors.OpError) -> None:
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


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _call_in_thread(ctx: contextvars.Context, kernel: Callable[..., Any],
                    args: list[Any]) -> Any:
    """Run a kernel on a worker thread, in the step's context.

    ``StopIteration`` cannot cross into an asyncio future (it would never complete),
    so it becomes ``OutOfRangeError`` here, as TensorFlow maps it.
    """
    try:
        return ctx.run(kernel, *args)
    except StopIteration as exc:
        raise errors.OutOfRangeError(None, None, f"StopIteration: {exc}") from exc

