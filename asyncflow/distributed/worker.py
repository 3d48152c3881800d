"""The worker side of one task: ``WorkerEnv`` → ``SessionMgr`` → ``WorkerSession`` →
``GraphMgr``, and a ``RendezvousMgr``.

TensorFlow's ``distributed_runtime`` shapes, on one event loop:

* :class:`WorkerEnv` — the task: its devices (each with a bounded thread pool for
  expensive kernels), the resource container shared by every session connected to
  the cluster, the session manager and the rendezvous manager.
* :class:`WorkerSession` — one per master session: its resources (the shared
  container, or its own with ``isolate_session_state``) and its :class:`GraphMgr`.
* :class:`GraphMgr` — ``register`` a task's partitions once (kernels bound here) →
  a handle; ``run`` executes them by handle and step id (one
  :class:`~asyncflow.runtime.barrier.ExecutorBarrier` over the task's partitions, or
  the one partition's :class:`~asyncflow.runtime.step.Step`, as a session runs it).
* :class:`RendezvousMgr` — step id → :class:`RemoteRendezvous`, created by whichever
  comes first (the step, a peer's push, the session's push or pull).  After a step
  that succeeded here it is removed as soon as the session has pulled every value
  sent to it (``finish``; no message needed); after a failure, the session's
  ``cleanup_step`` removes it and fails whatever still waits on it.  A step over
  here is remembered, so a late push for it is dropped, and one pushed to but never
  run here (its session gave up on it) is forgotten after ``_UNCLAIMED_S``.

Leases: every session's master renews it (``renew``, from the master's pings and its
calls); :meth:`WorkerEnv.expire` aborts the running steps of a session whose lease
ran out and drops the session (its graphs, and its resources when isolated), so a
dead master's orphaned steps stop and their pending writes never land.

Shared variables are checked at registration: a session declaring a variable the
task's container already knows with another dtype or shape fails with
``InvalidArgumentError`` naming it (TF's check), instead of both sessions silently
overwriting each other.

Nothing here knows about Dask: the transport (``push``) is injected, so a worker is
driven in process by the unit tests and by :mod:`asyncflow.distributed._dask` in a
Dask worker process, where every method runs on the task's own event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from asyncflow import errors
from asyncflow.compiler.plan import Plan
from asyncflow.config import StepStats
from asyncflow.distributed.rendezvous import PushFn, RemoteRendezvous
from asyncflow.runtime.barrier import ExecutorBarrier, StepRunner
from asyncflow.runtime.bind import BoundPlan, bind
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.devices import LocalDevice
from asyncflow.runtime.resources import ResourceMgr
from asyncflow.runtime.step import Step

__all__ = [
    "GraphMgr",
    "RendezvousMgr",
    "SessionMgr",
    "TaskDevice",
    "WorkerEnv",
    "WorkerSession",
    "on_task",
    "shielded",
]

T = TypeVar("T")

#: How many finished step ids a task remembers, so a late pull or push for a step that
#: is over fails at once instead of waiting in a fresh rendezvous.
_REMEMBERED_STEPS = 4096
#: How long a rendezvous made by a push waits for its step to run here: a step never
#: run by then was given up on by its session (which sends its runs as it starts).
_UNCLAIMED_S = 60.0


def on_task(error: errors.OpError, task: str) -> errors.OpError:
    """``error`` with the task it happened on in its message (once)."""
    if f"(on task {task})" in error.message:
        return error
    tagged = type(error)(error.node_name, None, f"{error.message} (on task {task})")
    tagged.__cause__ = error
    return tagged


async def shielded(cf: Future[T]) -> T:
    """Await ``cf`` (a concurrent future others share) without cancelling it.

    ``asyncio.shield`` alone forgets its inner future when the waiter is cancelled
    first: an exception the shared work ends with later is then never retrieved, and
    asyncio logs "Future exception was never retrieved" when it is collected (a
    registration failing after the step waiting for it gave up).  So a cancelled
    waiter retrieves that outcome once it comes.
    """
    waiter = asyncio.wrap_future(cf)
    try:
        return await asyncio.shield(waiter)
    except asyncio.CancelledError:
        waiter.add_done_callback(_retrieve)
        raise


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class TaskDevice(LocalDevice):
    """A task's device: a thread kernel that ignores its step's end is abandoned.

    In the session's own process a cancelled thread kernel is waited for (nothing is
    left running behind a step).  A task serves many masters for a long time, so
    there a kernel that blocks past its step's deadline or abort is *accounted for*
    instead: its thread keeps the pool it runs in, the device takes a fresh pool for
    the next kernel (which therefore never waits for it), and :attr:`stuck` counts
    it until it returns.  Past ``max_stuck`` stuck threads the device waits again,
    so a kernel that never returns cannot make threads without bound.
    """

    __slots__ = ("_stuck", "max_stuck")

    def __init__(
        self, name: str, device_type: str, index: int, max_threads: int, max_stuck: int = 8
    ) -> None:
        super().__init__(name, device_type, index, max_threads)
        self._stuck: set[Future[Any]] = set()
        self.max_stuck = max_stuck

    @property
    def stuck(self) -> int:
        """Kernel threads of ended steps that have not returned yet."""
        return len(self._stuck)

    async def run_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self._get_pool()
        cf: Future[T] = pool.submit(fn, *args)
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            if not cf.cancel():
                if len(self._stuck) >= self.max_stuck:
                    await shielded(cf)  # bounded: wait now
                else:
                    self._abandon(pool, cf)
            raise

    def _abandon(self, pool: ThreadPoolExecutor, cf: Future[Any]) -> None:
        with self._lock:
            self._stuck.add(cf)
            if self._pool is pool:
                self._pool = None  # the next kernel gets threads of a fresh pool
        cf.add_done_callback(self._stuck.discard)
        pool.shutdown(wait=False)  # its threads end once the stuck kernel returns


class RendezvousMgr:
    """Step id → the step's rendezvous on this task (TF's ``BaseRendezvousMgr``)."""

    def __init__(self, task: str, push: PushFn) -> None:
        self._task = task
        self._push = push
        self._table: dict[int, RemoteRendezvous] = {}
        # Steps whose rendezvous a push made, not run here yet: step id → when.
        self._unclaimed: dict[int, float] = {}
        self._finished: OrderedDict[int, None] = OrderedDict()
        # Steps that succeeded here, whose values for the session it has not all pulled.
        self._draining: set[int] = set()

    def find_or_create(self, step_id: int, pushed: bool = False) -> RemoteRendezvous:
        """The step's rendezvous; one that is already over comes back aborted.

        ``pushed``: for a value pushed here (the step may never run here: remembered
        as unclaimed until it does)."""
        rdv = self._table.get(step_id)
        if rdv is None:
            rdv = RemoteRendezvous(self._task, step_id, None, self._push, push_now=True)
            if step_id in self._finished:
                rdv.abort(
                    errors.AbortedError(None, None, f"step {step_id} is over on task {self._task}")
                )
                return rdv
            self._table[step_id] = rdv
            if pushed:
                self._unclaimed[step_id] = time.monotonic()
        if not pushed:
            self._unclaimed.pop(step_id, None)
        return rdv

    def sweep(self, now: float) -> list[int]:
        """Forget the steps pushed to but not run here for ``_UNCLAIMED_S`` (their
        values with them); the step ids."""
        stale = [s for s, born in self._unclaimed.items() if born < now - _UNCLAIMED_S]
        for step_id in stale:
            self.cleanup(step_id)
        return stale

    def finish(self, step_id: int) -> None:
        """The step succeeded on this task: forget it once the session pulled its values."""
        rdv = self._table.get(step_id)
        if rdv is None or rdv.idle():
            self.cleanup(step_id)
        else:
            self._draining.add(step_id)

    def taken(self, step_id: int) -> None:
        """The session pulled a value of ``step_id``: maybe the last one."""
        if step_id in self._draining:
            rdv = self._table.get(step_id)
            if rdv is None or rdv.idle():
                self.cleanup(step_id)

    def cleanup(self, step_id: int) -> None:
        """The step is over: fail what still waits on its rendezvous and forget it."""
        self._draining.discard(step_id)
        self._unclaimed.pop(step_id, None)
        rdv = self._table.pop(step_id, None)
        self._finished[step_id] = None
        if len(self._finished) > _REMEMBERED_STEPS:
            self._finished.popitem(last=False)
        if rdv is not None:
            rdv.abort(
                errors.AbortedError(None, None, f"step {step_id} is over on task {self._task}")
            )

    def __len__(self) -> int:
        return len(self._table)


@dataclass(frozen=True, slots=True, eq=False)
class _Item:
    """A registered graph: the task's partitions with bound kernels."""

    plans: tuple[Plan, ...]
    bound: tuple[BoundPlan, ...]
    retval_map: tuple[tuple[int, int], ...]  # every partition's retvals, in order


class GraphMgr:
    """Handle → registered partitions of one worker session (TF's ``GraphMgr``)."""

    def __init__(self, env: WorkerEnv, resources: ResourceMgr) -> None:
        self._env = env
        self._resources = resources
        self._items: dict[str, _Item] = {}
        self._ids = itertools.count(1)

    def register(self, plans: Sequence[Plan]) -> str:
        """Bind ``plans`` (this task's partitions of one compiled signature) → a handle."""
        handle = f"graph_{next(self._ids)}"
        self._items[handle] = self._bind(tuple(plans))
        return handle

    def _bind(self, plans: tuple[Plan, ...]) -> _Item:
        bound = tuple(bind(plan, self._env.device(plan.device), self._resources) for plan in plans)
        retval_map = tuple(
            (p, k) for p, plan in enumerate(plans) for k in range(len(plan.partition.retvals))
        )
        return _Item(plans, bound, retval_map)

    def rebind(self) -> None:
        """Bind every graph again (kernels hold their resources: after a reset)."""
        for handle, item in list(self._items.items()):
            self._items[handle] = self._bind(item.plans)

    def deregister(self, handle: str) -> None:
        """Forget a registered graph (unknown handles are ignored)."""
        self._items.pop(handle, None)

    def get(self, handle: str) -> _Item:
        item = self._items.get(handle)
        if item is None:
            raise errors.NotFoundError(
                None, None, f"graph handle {handle!r} is not registered on task {self._env.task}"
            )
        return item

    def __len__(self) -> int:
        return len(self._items)


#: The ops that declare a variable (their ``dtype``, ``shape`` and ``var_name`` attrs).
_VARIABLE_OPS = frozenset({"VariableV2", "ReadVariableOp", "Assign", "AssignAdd", "AssignSub"})


class Declared:
    """Variable name → (dtype, shape) as declared by the sessions of one container."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Any, Any]] = {}

    def check(self, plans: Sequence[Plan], task: str) -> None:
        """Record the variables ``plans`` declare; a clash with an earlier declaration
        raises ``InvalidArgumentError`` (nothing of ``plans`` is recorded then)."""
        new: dict[str, tuple[Any, Any]] = {}
        for plan in plans:
            for node in plan.nodes:
                if node.op not in _VARIABLE_OPS or "var_name" not in node.attrs:
                    continue
                name, dtype, shape = (
                    node.attrs["var_name"],
                    node.attrs["dtype"],
                    node.attrs["shape"],
                )
                seen = self._seen.get(name) or new.get(name)
                if seen is not None and (
                    seen[0] is not dtype or not seen[1].is_compatible_with(shape)
                ):
                    raise errors.InvalidArgumentError(
                        node.name,
                        None,
                        f"variable {name!r} on task {task} is shared with dtype "
                        f"{seen[0].name} and shape {seen[1]}, but this session declares "
                        f"dtype {dtype.name} and shape {shape} (another client's "
                        f"graph? rename the variable or isolate the session's state)",
                    )
                new.setdefault(name, (dtype, shape))
        self._seen.update(new)

    def clear(self) -> None:
        self._seen.clear()


class WorkerSession:
    """The state of one master session on this task."""

    def __init__(self, env: WorkerEnv, handle: str, isolate: bool) -> None:
        self.handle = handle
        self.resources = ResourceMgr() if isolate else env.resources
        self.declared = Declared() if isolate else env.declared
        self.graph_mgr = GraphMgr(env, self.resources)
        #: When the master's lease on this session runs out (``time.monotonic``).
        self.lease_end = float("inf")
        #: The Dask client id of the master (its removal ends the lease at once).
        self.client: str | None = None


class SessionMgr:
    """Master session handle → :class:`WorkerSession` (TF's ``SessionMgr``)."""

    def __init__(self, env: WorkerEnv) -> None:
        self._env = env
        self._sessions: dict[str, WorkerSession] = {}

    def find_or_create(self, handle: str, isolate: bool) -> WorkerSession:
        ws = self._sessions.get(handle)
        if ws is None:
            ws = self._sessions[handle] = WorkerSession(self._env, handle, isolate)
        return ws

    def find(self, handle: str) -> WorkerSession | None:
        return self._sessions.get(handle)

    def get(self, handle: str) -> WorkerSession:
        ws = self._sessions.get(handle)
        if ws is None:
            raise errors.NotFoundError(
                None,
                None,
                f"session {handle!r} is unknown on task {self._env.task} "
                f"(closed, or the worker restarted)",
            )
        return ws

    def delete(self, handle: str) -> None:
        ws = self._sessions.pop(handle, None)
        if ws is not None and ws.resources is not self._env.resources:
            ws.resources.clear()

    def all(self) -> list[WorkerSession]:
        return list(self._sessions.values())


class WorkerEnv:
    """One task of the cluster: devices, shared resources, sessions, rendezvous.

    Every method runs on the task's event loop (one thread), so no lock is needed.
    """

    def __init__(self, task: str, cpus: int, threads: int, push: PushFn) -> None:
        self.task = task
        self.devices = tuple(
            TaskDevice(f"{task}/device:CPU:{i}", "CPU", i, threads) for i in range(cpus)
        )
        self._device_of = {d.name: d for d in self.devices}
        self.resources = ResourceMgr()
        self.declared = Declared()
        self.sessions = SessionMgr(self)
        self.rendezvous = RendezvousMgr(task, push)
        #: step id → (its runner, set when it ended, its session's handle)
        self._running: dict[int, tuple[StepRunner, asyncio.Event, str]] = {}

    def device(self, name: str) -> TaskDevice:
        device = self._device_of.get(name)
        if device is None:
            raise errors.InvalidArgumentError(
                None,
                None,
                f"device {name!r} does not exist on task {self.task} "
                f"(it has {', '.join(self._device_of)})",
            )
        return device

    # -- the worker service -------------------------------------------------------------

    def register_graph(self, session: str, isolate: bool, plans: Sequence[Plan]) -> str:
        """Register this task's partitions of a plan for ``session`` → a graph handle."""
        ws = self.sessions.find_or_create(session, isolate)
        ws.declared.check(plans, self.task)
        return ws.graph_mgr.register(plans)

    def deregister_graph(self, session: str, handle: str) -> None:
        self.sessions.get(session).graph_mgr.deregister(handle)

    def close_session(self, session: str) -> None:
        """Drop a master session's graphs (and its own resources when isolated)."""
        self.sessions.delete(session)

    async def run_graph(
        self, session: str, handle: str, step_id: int, args: Sequence[Any], trace: bool = False
    ) -> tuple[list[Any], StepStats | None]:
        """Run the registered partitions once as step ``step_id``: (retvals, stats).

        Raises the step's root error as an ``OpError`` that names the task.
        """
        try:
            item = self.sessions.get(session).graph_mgr.get(handle)
        except errors.OpError as exc:
            raise on_task(exc, self.task) from None
        rdv = self.rendezvous.find_or_create(step_id)
        frame = CallFrame(list(args))
        # One partition (the common case) runs as the session runs one: its Step in
        # this task, without the barrier's task group, task and turns of the loop.
        runner: StepRunner = (
            Step(item.bound[0], frame, trace, rdv)
            if len(item.bound) == 1
            else ExecutorBarrier(item.bound, item.retval_map, frame, trace=trace, rendezvous=rdv)
        )
        finished = asyncio.Event()
        self._running[step_id] = (runner, finished, session)
        try:
            if rdv.aborted is not None:  # aborted (or cleaned up) before it started
                cause = rdv.aborted
                raise (
                    cause
                    if isinstance(cause, errors.OpError)
                    else errors.AbortedError(
                        None, None, f"step {step_id} was aborted before it started"
                    )
                )
            failed: errors.OpError | None = None
            async with asyncio.TaskGroup() as tg:  # the step's transfers
                rdv.attach(tg)
                try:
                    values = await runner.run()
                except errors.OpError as exc:
                    failed = exc  # raised below: not as an ExceptionGroup of the transfers
                finally:
                    # Values for the session stay until it pulled them (or cleanup_step).
                    rdv.attach(None)
            if failed is not None:
                raise failed
            if rdv.push_error is not None:  # a consumer never got its value
                raise rdv.push_error
            self.rendezvous.finish(step_id)
        except errors.OpError as exc:
            raise on_task(exc, self.task) from None
        finally:
            self._running.pop(step_id, None)
            finished.set()
        return values, runner.stats

    async def recv_tensor(self, step_id: int, key: str) -> tuple[Any, bool]:
        """The session's pull: wait for this task's send of ``key`` in step ``step_id``."""
        rdv = self.rendezvous.find_or_create(step_id)
        try:
            item = await rdv.local_recv_future(key)
        except errors.OpError as exc:
            raise on_task(exc, self.task) from None
        self.rendezvous.taken(step_id)
        return item

    def send_tensor(self, step_id: int, key: str, value: Any, is_dead: bool) -> None:
        """A peer's (or the session's) push of a value this task receives; dropped when
        the step is over here."""
        rdv = self.rendezvous.find_or_create(step_id, pushed=True)
        if rdv.aborted is None:
            rdv.send(key, value, is_dead)

    def abort_step(self, step_id: int, error: errors.OpError) -> None:
        """Fail step ``step_id`` here (another task failed, or the caller gave up)."""
        running = self._running.get(step_id)
        if running is not None:
            running[0].abort(error)
        self.rendezvous.find_or_create(step_id).abort(error)

    async def cleanup_step(self, step_id: int) -> None:
        """The step is over everywhere: stop it here if it still runs, forget its rendezvous."""
        running = self._running.get(step_id)
        if running is not None:
            self.abort_step(
                step_id,
                errors.CancelledError(None, None, f"step {step_id} was stopped by the session"),
            )
            await running[1].wait()
        self.rendezvous.cleanup(step_id)

    # -- leases ----------------------------------------------------------------------------

    def renew(self, sessions: Sequence[str], lease_end: float, client: str | None = None) -> None:
        """The masters of ``sessions`` are alive: their leases run until ``lease_end``
        (``client``: the Dask client they speak through, when known)."""
        for handle in sessions:
            ws = self.sessions.find(handle)
            if ws is not None:
                ws.lease_end = lease_end
                if client is not None:
                    ws.client = client

    def forget_master(self, client: str, now: float) -> list[str]:
        """Dask removed ``client``: its sessions' leases end now (the handles dropped)."""
        for ws in self.sessions.all():
            if ws.client == client:
                ws.lease_end = -1.0
        return self.expire(now)

    def expire(self, now: float) -> list[str]:
        """Drop every session whose master's lease ended before ``now``: its running
        steps are aborted (their kernels cancelled, their writes never land) and its
        graphs forgotten; and forget values pushed for steps that never ran here.
        The handles dropped."""
        self.rendezvous.sweep(now)
        gone = [ws.handle for ws in self.sessions.all() if ws.lease_end < now]
        for handle in gone:
            error = errors.AbortedError(
                None,
                None,
                f"the master of session {handle} on task {self.task} went "
                f"silent past its lease: its steps are aborted",
            )
            for step_id, (runner, _, owner) in list(self._running.items()):
                if owner == handle:
                    runner.abort(error)
                    self.rendezvous.find_or_create(step_id).abort(error)
            self.sessions.delete(handle)
        return gone

    def reset(self, now: float | None = None) -> None:
        """Clear every resource container of this task (``afd.reset``), after dropping
        what masters gone silent left (``now``: the lease clock)."""
        if now is not None:
            self.expire(now)
        self.resources.clear()
        self.declared.clear()
        for ws in self.sessions.all():
            ws.resources.clear()
            ws.declared.clear()
            ws.graph_mgr.rebind()

    def close(self) -> None:
        """Stop the devices' threads."""
        for d in self.devices:
            d.close()

    def __repr__(self) -> str:
        return (
            f"<WorkerEnv {self.task} sessions={len(self.sessions.all())} "
            f"running={len(self._running)}>"
        )
