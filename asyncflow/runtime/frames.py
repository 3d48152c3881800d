"""The frame executor: runs plans with control flow (dead tensors, loop frames).

TensorFlow's executor keeps, per step, a tree of *frame instances* (one per loop
entered, per parent iteration) each holding *iteration states*.  So does this one:

* A **token** ``(node, frame, iteration)`` is ready when every producer of the node
  in that iteration has finished.  Values live in the iteration's ``vals``.
* **Dead tensors.**  A Switch puts a live value on one output and a :class:`Dead`
  marker on the other.  A non-Merge node with a dead data or control input is dead:
  its kernel does not run and its outputs are dead.  A Merge fires on its first live
  data input, or dead once all expected data inputs are dead (a loop Merge expects
  one per iteration: the Enter's in iteration 0, the NextIteration's after).
* **Frames.**  An Enter delivers into iteration 0 of the child frame (a constant
  Enter into every iteration); NextIteration delivers into the next iteration (a dead
  one is dropped: that is how a loop ends), creating it if fewer than
  ``parallel_iterations`` are in flight, else queueing it; an Exit delivers its live
  value to the parent frame.  When a frame instance has no work left, Exits that
  never delivered deliver *dead* (a loop inside an untaken branch is dead).
* An iteration is done when nothing is outstanding in it, no child frame it started
  is alive, and no more input can reach it (iteration 0: every Enter arrived;
  later ones: the previous iteration is done).

Cheap kernels run inline; async and expensive ones run as tasks, as in the plain
executor.  The ready loop yields to the event loop every few thousand tokens, so a
long (or endless) loop still honours deadlines, cancellation and ``close()``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow import errors
from asyncflow.compiler.frames import CF_ENTER, CF_EXIT, CF_MERGE, CF_NEXT, CF_NONE, CF_SWITCH
from asyncflow.framework import registry
from asyncflow.runtime.cancellation import CancellationManager
from asyncflow.runtime.cancellation import _activate as _activate_cancellation
from asyncflow.runtime.cancellation import _deactivate as _deactivate_cancellation
from asyncflow.runtime.executor import (
    _being_cancelled,
    _call_in_thread,
    abort_on_loop,
    format_node_error,
)

if TYPE_CHECKING:
    from asyncflow.compiler.frames import FrameInfo
    from asyncflow.compiler.plan import ExecutionPlan
    from asyncflow.runtime.call_frame import CallFrame
    from asyncflow.runtime.devices import LocalDevice

__all__ = ["Dead", "FrameStep"]

_YIELD_EVERY = 2000  # tokens run between two yields to the event loop


class Dead:
    """The marker of a dead tensor; remembers the Switch whose untaken output it is."""

    __slots__ = ("origin",)

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def __repr__(self) -> str:
        return f"<dead from {self.origin!r}>"


class _Iteration:
    __slots__ = ("children", "dead", "merges", "outstanding", "pending", "vals")

    def __init__(self) -> None:
        self.vals: dict[int, Any] = {}
        self.pending: dict[int, int] = {}
        self.dead: dict[int, Dead] = {}
        # Merge node -> [controls left, dead inputs, first live input position, fired]
        self.merges: dict[int, list[int]] = {}
        self.outstanding = 0
        self.children = 0


class _Frame:
    __slots__ = (
        "children",
        "dead_exits",
        "delivered",
        "invariants",
        "iters",
        "parent",
        "parent_iter",
        "pending_enters",
        "static",
        "waiting",
    )

    def __init__(self, static: int, parent: _Frame | None, parent_iter: int,
                 pending_enters: int) -> None:
        self.static = static
        self.parent = parent
        self.parent_iter = parent_iter
        self.iters: dict[int, _Iteration] = {0: _Iteration()}
        self.pending_enters = pending_enters
        self.invariants: list[tuple[int, Any]] = []
        self.waiting: deque[tuple[int, int, Any]] = deque()  # (iteration, node, value)
        self.delivered: set[int] = set()
        self.dead_exits: dict[int, Dead] = {}
        self.children: dict[tuple[int, int], _Frame] = {}


class FrameStep:
    """One step of a control-flow plan.  Same interface as ``Step``."""

    def __init__(self, plan: ExecutionPlan, frame: CallFrame,
                 devices: Sequence[LocalDevice], trace: bool = False) -> None:
        assert plan.frames is not None
        self._plan = plan
        self._info: FrameInfo = plan.frames
        self._frame = frame
        self._devices = devices
        self._initial = plan.initial_values
        self._root = _Frame(0, None, 0, 0)
        root_vals = self._root.iters[0].vals
        for s, v in zip(plan.arg_slots, frame.args):
            root_vals[s] = v
        self._ready: deque[tuple[int, _Frame, int]] = deque()
        self._outstanding = 0
        self._error: errors.OpError | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wakeup: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self._cm = CancellationManager()
        for i in plan.initial_ready:
            self._push(i, self._root, 0)

    # -- interface shared with Step --------------------------------------------------

    @property
    def error(self) -> errors.OpError | None:
        """The step's first error, once it has one."""
        return self._error

    @property
    def frame(self) -> CallFrame:
        """The step's call frame."""
        return self._frame

    @property
    def stats(self) -> None:
        """Tracing of control-flow steps is not recorded yet."""
        return None

    def abort(self, error: errors.OpError) -> None:
        """Fail the step with ``error`` (loop thread only)."""
        self._fail_with(error)

    def abort_threadsafe(self, error: errors.OpError) -> None:
        """Fail the step from any thread."""
        abort_on_loop(self, self._loop, error)

    async def run(self) -> list[Any]:
        """Run the step to completion; returns the fetched values."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        token = _activate_cancellation(self._cm)
        try:
            with np.errstate(all="ignore"):
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg
                    try:
                        await self._main(loop)
                    except asyncio.CancelledError:
                        self._stopped = True
                        self._cm.cancel()
                        raise
                    finally:
                        if self._error is not None or self._stopped:
                            self._cancel_tasks()
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        finally:
            _deactivate_cancellation(token)
            self._stopped = True
            self._loop = None
        if self._error is not None:
            raise self._error
        return self._retvals()

    async def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._error is None:
            budget_left = self._drain(_YIELD_EVERY)
            if self._error is not None:
                return
            if self._ready:
                if not budget_left:
                    await asyncio.sleep(0)  # let deadlines, cancels and tasks run
                continue
            if self._outstanding == 0:
                return
            self._wakeup = loop.create_future()
            await self._wakeup

    def _wake(self) -> None:
        w = self._wakeup
        if w is not None and not w.done():
            w.set_result(None)

    # -- the ready loop ----------------------------------------------------------------

    def _push(self, i: int, frame: _Frame, it: int) -> None:
        frame.iters[it].outstanding += 1
        self._outstanding += 1
        self._ready.append((i, frame, it))

    def _drain(self, budget: int) -> bool:
        """Run up to ``budget`` ready tokens; False when the budget ran out."""
        ready = self._ready
        nodes = self._plan.nodes
        info = self._info
        while ready and self._error is None:
            if budget <= 0:
                return False
            budget -= 1
            i, frame, it = ready.popleft()
            try:
                self._execute(i, frame, it, nodes[i], info.kind[i])
            except Exception as exc:
                self._fail(i, exc)
        return True

    def _read(self, st: _Iteration, slot: int) -> Any:
        vals = st.vals
        return vals[slot] if slot in vals else self._initial[slot]

    def _execute(self, i: int, frame: _Frame, it: int, node: Any, kind: int) -> None:
        st = frame.iters[it]
        if kind == CF_MERGE:
            m = st.merges.pop(i)
            if m[2] < 0:
                all_dead = st.dead.get(i) or Dead(self._plan.ops[i].name)
                self._complete(i, frame, it, (all_dead, all_dead), all_dead)
            else:
                value = self._read(st, node.inputs[m[2]])
                self._complete(i, frame, it, (value, np.int32(m[2])), None)
            return
        dead = st.dead.get(i)
        if kind == CF_NONE:
            if dead is not None:
                self._complete(i, frame, it, (dead,) * node.num_outputs, dead)
                return
            args = [self._read(st, s) for s in node.inputs]
            if node.kind == registry.INLINE:
                v = node.kernel(*args)
                outs = (v,) if node.num_outputs == 1 else tuple(v or ())
                self._complete(i, frame, it, outs, None)
            else:
                self._start_task(i, frame, it, node, args)
            return
        if kind == CF_SWITCH:
            if dead is None:
                data = self._read(st, node.inputs[0])
                pred = self._read(st, node.inputs[1])
                marker = Dead(self._plan.ops[i].name)
                outs = (marker, data) if pred else (data, marker)
            else:
                outs = (dead, dead)
            self._complete(i, frame, it, outs, dead)
            return
        value = dead if dead is not None else self._read(st, node.inputs[0])
        if kind == CF_ENTER:
            child = self._child(frame, it, self._info.child[i])
            if self._info.constant[i]:
                child.invariants.append((i, value))
                for k in list(child.iters):
                    self._deliver(i, value, child, k)
            else:
                self._deliver(i, value, child, 0)
            child.pending_enters -= 1
            self._done_token(frame, it)
            self._check_iteration(child, 0)
            return
        if kind == CF_EXIT:
            if isinstance(value, Dead):
                frame.dead_exits[i] = value  # delivered dead if no live value ever comes
            elif i not in frame.delivered:
                frame.delivered.add(i)
                assert frame.parent is not None
                self._deliver(i, value, frame.parent, frame.parent_iter)
            self._done_token(frame, it)
            return
        if kind == CF_NEXT:
            if not isinstance(value, Dead):
                nxt = it + 1
                if nxt in frame.iters:
                    self._deliver(i, value, frame, nxt)
                elif len(frame.iters) < self._info.frames[frame.static].parallel_iterations \
                        and not frame.waiting:
                    self._new_iteration(frame, nxt)
                    self._deliver(i, value, frame, nxt)
                else:
                    frame.waiting.append((nxt, i, value))
            self._done_token(frame, it)
            return
        raise errors.InternalError(None, self._plan.ops[i], f"unknown control-flow kind {kind}")

    # -- propagation -----------------------------------------------------------------

    def _complete(self, i: int, frame: _Frame, it: int, outs: Sequence[Any],
                  dead: Dead | None) -> None:
        """Store node ``i``'s outputs in (frame, it) and activate its consumers there."""
        st = frame.iters[it]
        if dead is not None:
            st.dead[i] = dead
        node = self._plan.nodes[i]
        if len(outs) != node.num_outputs:
            raise errors.InternalError(None, None, f"kernel returned {len(outs)} values, "
                                                   f"expected {node.num_outputs}")
        for k, v in enumerate(outs):
            st.vals[node.out + k] = v
        self._activate(i, frame, it, st, dead)
        self._done_token(frame, it)

    def _deliver(self, i: int, value: Any, frame: _Frame, it: int) -> None:
        """Enter / Exit / NextIteration: put ``value`` into (frame, it) and activate there."""
        st = frame.iters[it]
        st.vals[self._plan.nodes[i].out] = value
        dead = value if isinstance(value, Dead) else None
        self._activate(i, frame, it, st, dead)

    def _activate(self, i: int, frame: _Frame, it: int, st: _Iteration,
                  src_dead: Dead | None) -> None:
        info = self._info
        initial_pending = self._plan.initial_pending
        for c, data, control in self._plan.edges_out[i]:
            if info.kind[c] == CF_MERGE:
                self._activate_merge(c, frame, it, st, data, control)
                continue
            edge_dead = src_dead if control else None
            for _, slot in data:
                v = st.vals.get(slot)
                if isinstance(v, Dead):
                    edge_dead = v
                    break
            if edge_dead is not None and c not in st.dead:
                st.dead[c] = edge_dead
            p = st.pending.get(c, initial_pending[c]) - 1
            st.pending[c] = p
            if p == 0:
                del st.pending[c]
                self._push(c, frame, it)

    def _activate_merge(self, c: int, frame: _Frame, it: int, st: _Iteration,
                        data: Sequence[tuple[int, int]], control: bool) -> None:
        m = st.merges.get(c)
        if m is None:
            m = st.merges[c] = [self._info.merge_controls[c], 0, -1, 0]
        if m[3]:
            return  # already fired in this iteration
        if control:
            m[0] -= 1
        for pos, slot in data:
            v = st.vals.get(slot)
            if isinstance(v, Dead):
                m[1] += 1
                st.dead.setdefault(c, v)
            elif m[2] < 0:
                m[2] = pos
        expected = 1 if self._info.loop_merge[c] else len(self._plan.nodes[c].inputs)
        if m[0] <= 0 and (m[2] >= 0 or m[1] >= expected):
            m[3] = 1
            self._push(c, frame, it)

    # -- frames and iterations ------------------------------------------------------------

    def _child(self, frame: _Frame, it: int, static: int) -> _Frame:
        child = frame.children.get((it, static))
        if child is None:
            child = _Frame(static, frame, it, self._info.frames[static].num_enters)
            frame.children[(it, static)] = child
            frame.iters[it].children += 1
        return child

    def _new_iteration(self, frame: _Frame, it: int) -> None:
        frame.iters[it] = _Iteration()
        for e, value in frame.invariants:
            self._deliver(e, value, frame, it)

    def _done_token(self, frame: _Frame, it: int) -> None:
        frame.iters[it].outstanding -= 1
        self._outstanding -= 1
        self._check_iteration(frame, it)

    def _check_iteration(self, frame: _Frame, it: int) -> None:
        while True:
            st = frame.iters.get(it)
            if st is None or st.outstanding or st.children or frame is self._root:
                return
            if it == 0 and frame.pending_enters > 0:
                return
            if it > 0 and (it - 1) in frame.iters:
                return
            del frame.iters[it]
            if frame.waiting and len(frame.iters) < \
                    self._info.frames[frame.static].parallel_iterations:
                nxt = frame.waiting[0][0]
                self._new_iteration(frame, nxt)
                while frame.waiting and frame.waiting[0][0] == nxt:
                    _, node, value = frame.waiting.popleft()
                    self._deliver(node, value, frame, nxt)
            if it + 1 in frame.iters:
                it += 1
                continue
            if not frame.iters and not frame.waiting:
                self._frame_done(frame)
            return

    def _frame_done(self, frame: _Frame) -> None:
        parent = frame.parent
        assert parent is not None
        for e in self._info.frames[frame.static].exits:
            if e not in frame.delivered:
                dead = frame.dead_exits.get(e) or Dead(self._plan.ops[e].name)
                self._deliver(e, dead, parent, frame.parent_iter)
        del parent.children[(frame.parent_iter, frame.static)]
        parent.iters[frame.parent_iter].children -= 1
        self._check_iteration(parent, frame.parent_iter)

    # -- tasks ---------------------------------------------------------------------------

    def _start_task(self, i: int, frame: _Frame, it: int, node: Any, args: list[Any]) -> None:
        if node.kind == registry.ASYNC:
            work = node.kernel(*args)
        else:
            work = self._devices[node.device].run_in_thread(
                _call_in_thread, contextvars.copy_context(), node.kernel, args)
        self._tasks.append(self._tg.create_task(self._run_node(i, frame, it, work)))

    async def _run_node(self, i: int, frame: _Frame, it: int, work: Any) -> None:
        try:
            v = await work
        except Exception as exc:
            self._fail(i, exc)
            return
        except asyncio.CancelledError as exc:
            if not _being_cancelled():
                self._fail(i, errors.CancelledError(None, None, f"kernel raised {exc!r}"))
                return
            raise
        if self._error is not None or self._stopped:
            return
        try:
            node = self._plan.nodes[i]
            outs = (v,) if node.num_outputs == 1 else tuple(v or ())
            self._complete(i, frame, it, outs, None)
        except Exception as exc:
            self._fail(i, exc)
        self._wake()

    def _cancel_tasks(self) -> None:
        for t in self._tasks:
            t.cancel()

    # -- failure and results ----------------------------------------------------------------

    def _fail(self, i: int, exc: BaseException) -> None:
        error = format_node_error(exc, self._plan.ops[i])
        error.__cause__ = exc
        self._fail_with(error)

    def _fail_with(self, error: errors.OpError) -> None:
        if self._error is not None:
            return
        self._error = error
        self._ready.clear()
        self._cm.cancel()
        self._cancel_tasks()
        self._wake()

    def _retvals(self) -> list[Any]:
        st = self._root.iters[0]
        out: list[Any] = []
        for t, s in zip(self._plan.fetches, self._plan.retval_slots):
            v = self._read(st, s)
            if isinstance(v, Dead):
                raise errors.InvalidArgumentError(
                    None, t._op,
                    f"Retval[{len(out)}] does not have value: the fetched tensor {t.name!r} "
                    f"is dead: it depends on the untaken output of Switch {v.origin!r}")
            out.append(v)
        self._frame.retvals = out
        return out
