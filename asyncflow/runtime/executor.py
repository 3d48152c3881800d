"""The executor: runs one step of an :class:`ExecutionPlan`.

State machine of a step (TensorFlow's ``ExecutorState``, on the event loop)::

    created ──run()──► draining ──(async/thread nodes outstanding)──► waiting
                          ▲                                             │
                          └────────── a task finishes its node ◄────────┘
    draining/waiting ──(ready empty, nothing outstanding)──► done
    any ──(first error | abort)──► failing ──(every task finished)──► failed

* **Ready stack.**  ``pending[i]`` counts the unfinished producers of node ``i``;
  when it reaches zero the node is pushed on ``ready``.  ``_drain`` pops and runs
  nodes until the stack is empty (LIFO: finishing a chain first frees its values
  sooner).
* **Inline nodes** (cheap sync kernels) run right inside ``_drain``: no Task, no
  Future, no thread hop.  A plan made only of inline nodes completes inside the
  first call to ``run`` without awaiting anything and without a task group.
* **Async nodes** become tasks of the step's ``asyncio.TaskGroup``; **expensive**
  nodes become tasks that await a worker thread of their device.  When such a task
  finishes its node it propagates the outputs and drains the newly ready nodes
  itself (like TF's executor, the thread that completes a node continues), so the
  step's main coroutine only waits for "done".
* **Failure.**  The first error wins (``_fail``): it is recorded once, every
  outstanding task is cancelled, and ``run`` raises it after the task group has
  waited for all of them — so ``run`` never returns while a kernel of the step is
  still running.  Later errors (derived cancellations) are dropped.
* **Values** live in one list indexed by slot; a node clears the slots whose last
  reader it is (``frees``/``counted`` in the plan), so memory follows the live set.

Everything here is per step; the plan is shared and never written.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from asyncflow import errors
from asyncflow.framework import registry
from asyncflow.runtime.cancellation import CancellationManager
from asyncflow.runtime.cancellation import _activate as _activate_cancellation
from asyncflow.runtime.cancellation import _deactivate as _deactivate_cancellation
from asyncflow.runtime.step_stats import DeviceStepStats, NodeExecStats, NodeOutput, StepStats

if TYPE_CHECKING:

    from asyncflow.compiler.plan import ExecutionPlan, NodeDef
    from asyncflow.framework.graph import Operation
    from asyncflow.runtime.call_frame import CallFrame
    from asyncflow.runtime.devices import LocalDevice
    from asyncflow.runtime.rendezvous import Rendezvous

__all__ = ["Step", "format_node_error"]

_INLINE = registry.INLINE
_ASYNC = registry.ASYNC
_SEND = registry.SEND
_RECV = registry.RECV


def format_node_error(exc: BaseException, op: Operation) -> errors.OpError:
    """The OpError for a kernel's exception: names the node, its type and creation site."""
    base = errors.from_exception(exc, op)
    return type(base)(base.node_def, op, f"{base.message}\n\t [[node {op.name} "
                      f"(op {op.type}, defined at {op.traceback})]]")


class Step:
    """One execution of a plan: values, pending counts, ready stack, tasks, first error."""

    __slots__ = (
        "_cm",
        "_deferred",
        "_devices",
        "_done",
        "_error",
        "_frame",
        "_loop",
        "_nodes",
        "_outstanding",
        "_pending",
        "_plan",
        "_ready",
        "_recvs",
        "_refs",
        "_rendezvous",
        "_stats",
        "_stopped",
        "_tasks",
        "_tg",
        "_trace",
        "_vals",
    )

    def __init__(self, plan: ExecutionPlan, frame: CallFrame,
                 devices: Sequence[LocalDevice], trace: bool = False,
                 rendezvous: Rendezvous | None = None,
                 cancellation: CancellationManager | None = None) -> None:
        self._plan = plan
        self._cm = cancellation
        self._rendezvous = rendezvous
        self._frame = frame
        self._nodes = plan.nodes
        vals = list(plan.initial_values)
        for s, v in zip(plan.arg_slots, frame.args):  # the _Arg nodes
            vals[s] = v
        self._vals = vals
        self._pending = list(plan.initial_pending)
        self._ready = list(plan.initial_ready)
        self._refs = list(plan.initial_refs) if plan.initial_refs is not None else None
        self._devices = devices
        self._tg: asyncio.TaskGroup | None = None
        self._deferred: list[int] = []
        self._outstanding = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._recvs: list[asyncio.Future[Any]] = []
        self._stopped = False
        self._done: asyncio.Future[None] | None = None
        self._error: errors.OpError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats: list[tuple[int, NodeExecStats]] | None = None
        self._trace = trace
        if trace:
            self._stats = []
            self._nodes = tuple(self._traced_node(i, n) for i, n in enumerate(plan.nodes))

    # -- public -------------------------------------------------------------------

    def run_inline(self) -> list[Any]:
        """Run an all-inline plan to completion synchronously; returns the frame's retvals."""
        with np.errstate(all="ignore"):
            self._drain()
        if self._error is not None:
            raise self._error
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
        try:
            with np.errstate(all="ignore"):
                self._drain()
                if self._error is None and self._outstanding:
                    await self._run_tasks()
        finally:
            _deactivate_cancellation(token)
        if self._error is not None:
            raise self._error
        return self._retvals()

    def abort(self, error: errors.OpError) -> None:
        """Fail the step with ``error`` (if it has not failed yet).  Loop thread only."""
        self._fail_with(error)

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
        """The step's stats when it ran traced."""
        if self._stats is None:
            return None
        out = StepStats([DeviceStepStats(device=name) for name in self._plan.devices])
        for device, ns in self._stats:
            out.dev_stats[device].node_stats.append(ns)
        return out

    # -- the scheduler core ----------------------------------------------------------

    def _drain(self) -> None:
        """Run ready nodes until none is left; async/expensive ones are dispatched.

        This is the per-node hot path and is kept in one piece on purpose: every
        attribute is hoisted into a local, and the common shapes (1 or 2 inputs, one
        output, one consumer) take the shortest branches.  The completion half
        (store outputs, release inputs, decrement consumers) is repeated in
        ``_finish`` for nodes completed by tasks; keep the two in sync.
        """
        ready = self._ready
        if not ready or self._error is not None:
            return
        nodes = self._nodes
        vals = self._vals
        pending = self._pending
        refs = self._refs
        pop = ready.pop
        push = ready.append
        i = -1
        try:
            while ready:
                i = pop()
                while True:
                    kernel, kind, n, ins, out, nout, cons, frees, counted, getter, _ = nodes[i]
                    if kind:
                        self._dispatch(i)
                        break
                    if n == 2:
                        v = kernel(vals[ins[0]], vals[ins[1]])
                    elif n == 1:
                        v = kernel(vals[ins[0]])
                    elif n == 0:
                        v = kernel()
                    else:
                        v = kernel(*getter(vals))  # type: ignore[misc]
                    if nout == 1:
                        vals[out] = v
                    elif nout:
                        vals[out:out + nout] = _check_outputs(v, nout)
                    for s in frees:
                        vals[s] = None
                    if counted:
                        for s in counted:
                            r = refs[s] - 1  # type: ignore[index]
                            refs[s] = r  # type: ignore[index]
                            if not r:
                                vals[s] = None
                    # Continue with the first consumer this node made ready, without a
                    # push/pop round trip (a chain runs entirely in this inner loop).
                    nxt = -1
                    for c in cons:
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
        except Exception as exc:
            self._fail(i, exc)
        if self._outstanding == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _finish(self, i: int, v: Any) -> None:
        """Complete node ``i`` with output ``v`` (from a task), then drain what became ready."""
        if self._error is not None or self._stopped:
            return  # late result of a failed or cancelled step: discarded
        try:
            self._complete(i, v)
        except Exception as exc:
            self._fail(i, exc)
            return
        self._drain()

    def _complete(self, i: int, v: Any) -> None:
        """Store node ``i``'s outputs, release its inputs, and ready its consumers."""
        node = self._nodes[i]
        vals = self._vals
        nout = node.num_outputs
        if nout == 1:
            vals[node.out] = v
        elif nout:
            vals[node.out:node.out + nout] = _check_outputs(v, nout)
        for s in node.frees:
            vals[s] = None
        refs = self._refs
        for s in node.counted:
            r = refs[s] - 1  # type: ignore[index]
            refs[s] = r  # type: ignore[index]
            if not r:
                vals[s] = None
        pending = self._pending
        push = self._ready.append
        for c in node.consumers:
            p = pending[c] - 1
            pending[c] = p
            if not p:
                push(c)

    # -- tasks -----------------------------------------------------------------------

    def _dispatch(self, i: int) -> None:
        """Start a node that does not run inline (called from ``_drain``)."""
        node = self._nodes[i]
        kind = node.kind
        if kind == _SEND:
            # Sends never block: done at once, like an inline node.
            start = time.time() if self._trace else 0.0
            node.kernel(self._rendezvous, *[self._vals[s] for s in node.inputs])
            if self._trace:
                self._record_rendezvous(i, start)
            self._complete(i, None)
            return
        if kind == _RECV:
            start = time.time() if self._trace else 0.0
            fut = node.kernel(self._rendezvous)
            if fut.done():
                value = fut.result()[0]  # an abort raises: _drain fails node i
                if self._trace:
                    self._record_rendezvous(i, start)
                self._complete(i, value)
                return
            # Wait without a task and without polling: the matching send (or an
            # abort) resolves the future, whose callback finishes the node.
            self._outstanding += 1
            self._recvs.append(fut)
            fut.add_done_callback(functools.partial(self._recv_done, i, start))
            return
        # Invariant: _outstanding counts dispatched nodes not finished yet (deferred
        # tasks and waiting recvs included): "done" is ready empty and zero here.
        self._outstanding += 1
        tg = self._tg
        if tg is None:
            self._deferred.append(i)
        else:
            self._start_task(tg, i)

    def _start_task(self, tg: asyncio.TaskGroup, i: int) -> None:
        node = self._nodes[i]
        vals = self._vals
        args = [vals[s] for s in node.inputs]
        if node.kind == _ASYNC:
            work = node.kernel(*args)
        else:
            work = self._devices[node.device].run_in_thread(
                _call_in_thread, contextvars.copy_context(), node.kernel, args)
        coro = self._run_node(i, work)
        # Tasks are kept (not discarded when done) so a failure can cancel them: a
        # done-callback per task would cost one more loop callback per async node.
        self._tasks.append(tg.create_task(coro))

    async def _run_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        done = self._done = loop.create_future()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                deferred, self._deferred = self._deferred, []
                for i in deferred:
                    self._start_task(tg, i)
                if self._error is not None:
                    # Aborted from another thread before this loop was known.
                    self._cancel_tasks()
                self._check_done()
                # Tasks finish nodes and drain on their own; wait for the last one, or
                # for the first error (which has already cancelled the others: leaving
                # the group then waits for them to stop).
                try:
                    await done
                except asyncio.CancelledError:
                    # The caller was cancelled (or its deadline passed): nothing new
                    # may start; the group cancels the running tasks and waits.
                    self._stopped = True
                    if self._cm is not None:
                        self._cm.cancel()
                    raise
        except BaseExceptionGroup as group:
            # Only a BaseException that is not an Exception gets here (kernel errors
            # are caught in the tasks): re-raise it as itself, never as a group.
            raise group.exceptions[0] from None
        finally:
            self._stopped = True
            self._tg = None
            self._loop = None

    async def _run_node(self, i: int, work: Coroutine[Any, Any, Any]) -> None:
        """Await one async or thread node's ``work`` and finish the node (a task body)."""
        try:
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
        self._finish(i, v)
        self._check_done()

    def _recv_done(self, i: int, start: float, fut: asyncio.Future[Any]) -> None:
        self._outstanding -= 1
        if fut.cancelled():
            return
        exc = fut.exception()  # always retrieved, so asyncio never logs it
        if exc is not None:
            self._fail(i, exc)
        else:
            if self._trace:
                self._record_rendezvous(i, start)
            self._finish(i, fut.result()[0])
        self._check_done()

    def _record_rendezvous(self, i: int, start: float) -> None:
        op = self._plan.ops[i]
        end = time.time()
        start_us = int(start * 1e6)
        dur = int((end - start) * 1e6)
        self._stats.append((self._nodes[i].device, NodeExecStats(  # type: ignore[union-attr]
            node_name=op.name, op_type=op.type, kind="send" if op.type == "_Send" else "recv",
            scheduled_micros=start_us, all_start_micros=start_us, op_end_rel_micros=dur,
            all_end_rel_micros=dur, thread_id=threading.get_ident(),
            timeline_label=f"{op.name} = {op.type}({op._attrs.get('tensor_name', '')})",
            rendezvous_key=op._attrs.get("key", ""))))

    def _check_done(self) -> None:
        done = self._done
        if done is not None and not done.done() and (
                self._outstanding == 0 or self._error is not None):
            done.set_result(None)

    def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for fut in self._recvs:
            fut.cancel()

    # -- failure ---------------------------------------------------------------------

    def _fail(self, i: int, exc: BaseException) -> None:
        op = self._plan.ops[i] if i >= 0 else None
        error = errors.from_exception(exc) if op is None else format_node_error(exc, op)
        error.__cause__ = exc
        self._fail_with(error)

    def _fail_with(self, error: errors.OpError) -> None:
        if self._error is not None:
            return  # the first error wins; this one is derived or late
        self._error = error
        self._ready.clear()
        if self._cm is not None:
            self._cm.cancel()  # kernels polling or with callbacks stop too
        self._cancel_tasks()
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)

    # -- results ---------------------------------------------------------------------

    def _retvals(self) -> list[Any]:
        vals = self._vals
        retvals = self._frame.retvals = [vals[s] for s in self._plan.retval_slots]  # _Retval nodes
        return retvals

    # -- tracing ---------------------------------------------------------------------

    def _traced_node(self, i: int, node: NodeDef) -> NodeDef:
        if node.kind in (_SEND, _RECV):
            return node  # rendezvous traffic is not a kernel call; not timed here
        op = self._plan.ops[i]
        device = node.device
        stats = self._stats
        assert stats is not None
        kernel = node.kernel
        kind = node.kind

        def record(start: float, end: float, v: Any) -> None:
            outputs = v if node.num_outputs != 1 else (v,)
            outs = []
            if node.num_outputs and outputs is not None:
                for k, o in enumerate(outputs):
                    a = np.asarray(o)
                    outs.append(NodeOutput(k, tuple(a.shape), a.dtype.name, int(a.nbytes)))
            start_us = int(start * 1e6)
            dur = int((end - start) * 1e6)
            stats.append((device, NodeExecStats(
                node_name=op.name, op_type=op.type, kind=registry.KERNEL_KINDS[kind],
                scheduled_micros=start_us, all_start_micros=start_us,
                op_start_rel_micros=0, op_end_rel_micros=dur, all_end_rel_micros=dur,
                thread_id=threading.get_ident(), timeline_label=f"{op.name} = {op.type}()",
                output=outs)))

        if kind == _ASYNC:
            async def traced_async(*args: Any) -> Any:
                start = time.time()
                v = await kernel(*args)
                record(start, time.time(), v)
                return v
            wrapped: Callable[..., Any] = traced_async
        else:
            def traced(*args: Any) -> Any:
                start = time.time()
                v = kernel(*args)
                record(start, time.time(), v)
                return v
            wrapped = traced
        return node._replace(kernel=wrapped)


class _Abortable(Protocol):
    _error: errors.OpError | None

    def _fail_with(self, error: errors.OpError) -> None: ...


def abort_on_loop(step: _Abortable, loop: asyncio.AbstractEventLoop | None,
                  error: errors.OpError) -> None:
    """Fail ``step`` from any thread: on its loop if it is waiting on one."""
    if loop is None:
        # Not waiting on a loop: finished, not started, or running synchronously; the
        # error is recorded and seen at its next check.
        if step._error is None:
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


def _check_outputs(v: Any, nout: int) -> Any:
    if not isinstance(v, list | tuple) or len(v) != nout:
        got = f"{len(v)} values" if isinstance(v, list | tuple) else type(v).__name__
        raise errors.InternalError(None, None, f"kernel returned {got}, expected {nout} outputs")
    return v
