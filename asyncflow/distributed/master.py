"""The master: a session's side of distributed execution (TF's ``MasterSession``).

``af.Session(cluster, graph=g)`` asks the cluster for a :class:`Master`.  The session
compiles as always, over its own devices (``/job:localhost/...``) followed by the
cluster's; the master then

* binds the partitions of the session's own devices here, groups the others by task
  and registers each task's partitions with its worker **once per plan**
  (``register_graph`` → handle; lazily, by the first step, from whatever loop runs it);
* runs a step (:class:`DistributedStep`) as one task group: the local partitions'
  executors and one ``run_graph(handle, step_id, ...)`` per task, concurrently; the
  first error aborts the step on every task (``abort_step``) and is what the caller
  sees, named with its node and task; derived errors (aborts, cancellations) are
  dropped; a step that did not succeed is cleaned up on every task
  (``cleanup_step``: stops a task still running it — deadlines, cancellation,
  ``close`` — and frees its rendezvous; after a success the tasks free it themselves);
* fails every running step that touches a task whose worker died
  (:meth:`Cluster.mark_unavailable`) with ``UnavailableError`` naming the task;
* before a step touches a task that was unavailable, asks the cluster to find its
  worker again (:meth:`Cluster.revive`): a worker back under the task's name takes
  it back, the first step fails with ``AbortedError`` when a new process came back,
  and the partitions are registered again (a plan's registration remembers each
  task's generation).

A step's own calls (``run_graph``, pulls, pushes, aborts) go out from the step's loop
through a connection pool of that loop (:meth:`Cluster.rpc`), never hopping to the
client's thread and back; registration, cleanup and recovery run on the client's loop
(:meth:`Cluster._call`).  Steps may run on any loop and thread.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from distributed.protocol.serialize import ToPickle

from asyncflow import errors
from asyncflow.compiler.pipeline import Compiled
from asyncflow.compiler.plan import Plan
from asyncflow.config import StepStats
from asyncflow.distributed._dask import unwire, unwire_value, wire
from asyncflow.distributed.rendezvous import LOCAL_TASK, RemoteRendezvous, task_of
from asyncflow.distributed.worker import shielded
from asyncflow.framework.graph import Tensor
from asyncflow.runtime.barrier import ExecutorBarrier
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.session.call import CompiledCall

if TYPE_CHECKING:
    from asyncflow.session import Session
    from asyncflow.session.fetch_feed import Rebuild

__all__ = ["Cluster", "DistributedCall", "DistributedStep", "Master"]

T = TypeVar("T")


class Cluster(Protocol):
    """What the master uses of its :class:`asyncflow.distributed.Cluster`."""

    tasks: tuple[str, ...]
    cpus_per_task: int
    assignment: dict[str, str]
    service: dict[str, str]
    generation: dict[str, int]
    epoch: dict[str, int]
    sessions: set[str]
    master_lease_s: float
    health_timeout_s: float
    client: Any
    _closed: bool
    _lock: threading.Lock

    def devices(self) -> list[str]: ...
    def unavailable(self, task: str) -> errors.UnavailableError | None: ...
    def add_watcher(self, fn: Callable[[str, errors.UnavailableError], None]) -> None: ...
    def remove_watcher(self, fn: Callable[[str, errors.UnavailableError], None]) -> None: ...
    async def rpc(self, task: str, op: str, **kwargs: Any) -> Any: ...
    async def revive(self, task: str) -> None: ...
    async def _call(self, coro: Coroutine[Any, Any, T]) -> T: ...
    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]: ...
    def _run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...


#: How long cleaning a step up on the tasks may take before the master gives up on it.
_CLEANUP_TIMEOUT = 10.0
#: How long a task may take to answer once its step was aborted (a task that neither
#: answers nor dies — a hung process, a partitioned network — is given up on then).
_ABORT_GRACE = 5.0


def _receives(plans: Sequence[Plan]) -> bool:
    """Whether these partitions of a task receive a value from another task."""
    return any(node.op == "_Recv" for plan in plans for node in plan.partition.nodes)


class DistributedCall(CompiledCall):
    """A compiled signature over local and remote partitions."""

    __slots__ = (
        "_generations",
        "_handles",
        "_lock",
        "master",
        "name",
        "needs",
        "remote",
        "sources",
    )

    def __init__(
        self,
        master: Master,
        compiled: Compiled,
        local: Sequence[int],
        bound: Sequence[Any],
        fetches: Sequence[Tensor],
        feed_keys: tuple[Any, ...],
        converters: tuple[Callable[[Any], Any], ...],
        rebuild: Rebuild,
    ) -> None:
        super().__init__(compiled, bound, fetches, feed_keys, converters, rebuild)
        #: What the step is called on Dask's dashboard (its events): its fetches.
        self.name = ", ".join(t.name for t in fetches)[:120] or "(targets only)"
        self.single = self.fast = self.inline_first = self.sync_first = False
        self.master = master
        plans = compiled.plans
        where: dict[int, tuple[str, int]] = {p: (LOCAL_TASK, i) for i, p in enumerate(local)}
        #: task → its partitions' plans, in compiled order.
        self.remote: dict[str, list[Plan]] = {}
        offsets: dict[int, int] = {}
        for p, plan in enumerate(plans):
            task = task_of(plan.device)
            if task == LOCAL_TASK:
                continue
            mine = self.remote.setdefault(task, [])
            offsets[p] = sum(len(q.partition.retvals) for q in mine)
            where[p] = (task, len(mine))
            mine.append(plan)
        # Tasks that receive nothing from another task first: a step's first message
        # goes to a producer (whose push and answer are the step's critical path), the
        # consumers' after it (they wait for the push anyway).
        self.remote = dict(sorted(self.remote.items(), key=lambda item: _receives(item[1])))
        #: fetch k → ("", feed index) | (LOCAL_TASK, local partition, index) |
        #: (task, flat index into that task's returned values)
        self.sources: list[tuple[str, int, int]] = []
        for p, k in compiled.retval_map:
            if p < 0:
                self.sources.append(("", k, 0))
                continue
            task, i = where[p]
            self.sources.append((task, i, k) if task == LOCAL_TASK else (task, offsets[p] + k, 0))
        #: task → the feed indices its partitions read.
        self.needs = {
            task: {k for plan in mine for k, _ in plan.partition.args}
            for task, mine in self.remote.items()
        }
        self._handles: Future[dict[str, str]] | None = None
        #: Each task's generation when the handles were registered.
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()

    def register(self) -> Future[dict[str, str]]:
        """Start registering every task's partitions (once; again after a failure).

        Runs on the cluster's loop; the caller does not wait (compiling starts it, the
        first step awaits it).
        """
        with self._lock:
            cf = self._handles
            if cf is None or (
                cf.done() and (cf.cancelled() or cf.exception() is not None or not self._current())
            ):
                cf = self._handles = self.master.cluster._submit(self._register())
        return cf

    def _current(self) -> bool:
        """Registered with the workers hosting the tasks now (none restarted since)."""
        generation = self.master.cluster.generation
        return all(generation.get(t) == g for t, g in self._generations.items())

    async def handles(self) -> dict[str, str]:
        """Task → graph handle, once registration finished."""
        cf = self._handles
        if (
            cf is not None
            and cf.done()
            and not cf.cancelled()
            and cf.exception() is None
            and self._current()
        ):
            return cf.result()  # registered: no lock, no loop round trip
        # Shielded: a step cancelled (or past its deadline) while waiting does not
        # cancel the registration other steps of this plan share.
        return await shielded(self.register())

    async def _register(self) -> dict[str, str]:
        master = self.master
        handles: dict[str, str] = {}
        generations = {task: master.cluster.generation.get(task, 0) for task in self.remote}

        async def one(task: str, plans: list[Plan]) -> None:
            try:
                reply = await master.cluster.rpc(
                    task,
                    "register_graph",
                    session=master.handle,
                    isolate=master.isolate,
                    cpus=master.cluster.cpus_per_task,
                    lease=master.cluster.master_lease_s,
                    client=master.cluster.client.id,
                    addresses=master.cluster.service,
                    plans=ToPickle(tuple(plans)),
                )
            except errors.OpError:
                raise
            except Exception as exc:  # e.g. a py_func that cannot be pickled
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"cannot register the partitions of task {task}: {type(exc).__name__}: {exc}",
                ) from exc
            if not reply["ok"]:
                raise unwire(reply["error"])
            handles[task] = reply["handle"]

        try:
            async with asyncio.TaskGroup() as tg:
                for task, plans in self.remote.items():
                    tg.create_task(one(task, plans))
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        self._generations = generations
        return handles


def _derived(error: errors.OpError) -> bool:
    """Errors caused by another error of the step (never what the caller sees)."""
    if isinstance(error, errors.AbortedError):
        return True
    return isinstance(error, errors.CancelledError) and (
        "step aborted" in error.message or "stopped by the session" in error.message
    )


class DistributedStep(ExecutorBarrier):
    """One step over the session's own partitions and every task's."""

    __slots__ = (
        "_call",
        "_client",
        "_derived_error",
        "_give_up",
        "_master",
        "_remote_runs",
        "_remote_stats",
        "_remote_values",
        "_step_id",
        "_tg",
        "_trace",
    )

    def __init__(
        self,
        master: Master,
        call: DistributedCall,
        frame: CallFrame,
        trace: bool = False,
        client: LocalRendezvous | None = None,
    ) -> None:
        self._master = master
        #: A partial run's rendezvous, where the caller feeds and fetches by key.
        self._client = client
        self._call = call
        self._trace = trace
        self._step_id = master.new_step_id()
        self._derived_error: errors.OpError | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._remote_values: dict[str, list[Any]] = {}
        self._remote_stats: list[StepStats] = []
        self._remote_runs: dict[str, asyncio.Task[None]] = {}
        self._give_up: asyncio.TimerHandle | None = None
        rendezvous = RemoteRendezvous(
            LOCAL_TASK, self._step_id, master.pull, master.push, on_error=self._record
        )
        super().__init__(call.bound, (), frame, trace=trace, rendezvous=rendezvous)

    @property
    def step_id(self) -> int:
        """The step's id on every task."""
        return self._step_id

    @property
    def finished(self) -> bool:
        """Remote partitions report only as the whole step ends, so a distributed step
        is never taken as finished early (its local partitions finishing says nothing
        about the tasks')."""
        return False

    @property
    def tasks(self) -> tuple[str, ...]:
        """The remote tasks this step runs on."""
        return tuple(self._call.remote)

    async def run(self) -> list[Any]:
        """Run every partition, local and remote; the fetched values, or the root error."""
        self._loop = asyncio.get_running_loop()
        master = self._master
        master._started(self)
        try:
            if any(master.cluster.unavailable(task) for task in self._call.remote):
                await master.cluster._call(self._revive())
            handles = await self._call.handles()
            for task in self._call.remote:
                dead = master.cluster.unavailable(task)
                if dead is not None:
                    raise dead
            if self._error is None and self._derived_error is None:
                # (Aborted while registering, e.g. by close(): start nothing remote.)
                await self._run_all(handles)
        finally:
            master._stopped(self)
            self._loop = None
        if self._error is not None:
            raise self._error
        if self._derived_error is not None:
            raise self._derived_error
        return self._results()

    async def _revive(self) -> None:
        """Find the step's unavailable tasks again (cluster loop); the first error."""
        cluster = self._master.cluster
        try:
            async with asyncio.TaskGroup() as tg:
                for task in self._call.remote:
                    tg.create_task(cluster.revive(task))
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None

    async def _run_all(self, handles: dict[str, str]) -> None:
        rendezvous = self._rendezvous
        assert isinstance(rendezvous, RemoteRendezvous)
        ok = False
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                rendezvous.attach(tg)
                for step in self._steps:
                    tg.create_task(self._run_partition(step))
                for task in self._call.remote:
                    self._remote_runs[task] = tg.create_task(self._run_remote(task, handles[task]))
                keys = self._call.compiled.client
                if self._client is not None and keys is not None:
                    for key in keys.feeds:
                        tg.create_task(self._bridge(self._client, rendezvous, key))
                    for key in (*keys.fetches, *keys.targets):
                        tg.create_task(self._bridge(rendezvous, self._client, key))
            ok = True
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        finally:
            self._tg = None
            if self._give_up is not None:
                self._give_up.cancel()
            rendezvous.attach(None)
            if not ok or self._error is not None or self._derived_error is not None:
                await self._cleanup()

    async def _run_remote(self, task: str, handle: str) -> None:
        needs = self._call.needs[task]
        args = [wire(v) if k in needs else None for k, v in enumerate(self._frame.args)]
        cluster = self._master.cluster
        try:
            reply = await self._master.call(
                task,
                "run_graph",
                session=self._master.handle,
                handle=handle,
                step_id=self._step_id,
                args=args,
                trace=self._trace,
                name=self._call.name,
                # The task's stalls this master knew of, and how long it waits for an
                # answer: a run the task gets only after a longer stall is dropped.
                epoch=cluster.epoch.get(task, 0),
                health=cluster.health_timeout_s,
            )
        except errors.OpError as exc:
            self._record(exc)
            return
        if not reply["ok"]:
            self._record(unwire(reply["error"]))
            return
        self._remote_values[task] = [unwire_value(v) for v in reply["values"]]
        stats = reply["stats"]
        if stats is not None:
            self._remote_stats.append(unwire(stats))

    async def _bridge(self, src: LocalRendezvous, dst: LocalRendezvous, key: str) -> None:
        """Partial runs: move one client feed into the step, or one fetch out of it."""
        try:
            value, dead = await src.recv(key)
            dst.send(key, value, dead)
        except errors.OpError as exc:
            self._record(exc)

    async def _cleanup(self) -> None:
        """Free the step's rendezvous on every task; stops a task still running it."""
        master = self._master

        async def one(task: str) -> None:
            if master.cluster.unavailable(task) is None:
                try:
                    await master.cluster.rpc(task, "cleanup_step", step_id=self._step_id)
                except errors.OpError:
                    pass  # the task died meanwhile: nothing left to clean up there

        async def all_tasks() -> None:
            async with asyncio.timeout(_CLEANUP_TIMEOUT), asyncio.TaskGroup() as tg:
                for task in self._call.remote:
                    tg.create_task(one(task))

        try:
            await master.cluster._call(all_tasks())
        except TimeoutError:
            pass  # an unresponsive task: its worker's removal will be reported

    def _record(self, error: errors.OpError) -> None:
        if self._error is not None:
            return
        if _derived(error):
            if self._derived_error is None:
                self._derived_error = error
                self._rendezvous.abort(error)
                if self._client is not None:
                    self._client.abort(error)
                derived = errors.CancelledError(None, None, f"step aborted: {error.message}")
                for step in self._steps:
                    step.abort(derived)
                self._abort_remote(error)
            return
        super()._record(error)
        if self._client is not None:
            self._client.abort(error)  # a partial run's pending calls fail with it
        self._abort_remote(error)

    def _abort_remote(self, error: errors.OpError) -> None:
        tg = self._tg
        if tg is None:
            return
        if self._loop is not None and self._give_up is None:
            # Bounded: tasks that have not answered the abort in time are given up on.
            self._give_up = self._loop.call_later(_ABORT_GRACE, self._stop_waiting)
        for task in self._call.remote:
            if self._master.cluster.unavailable(task) is None:
                tg.create_task(self._send_abort(task, error))

    def _stop_waiting(self, task: str | None = None) -> None:
        """Stop awaiting ``task``'s ``run_graph`` (every task's when None)."""
        for name, run in self._remote_runs.items():
            if task is None or name == task:
                run.cancel()

    def lost(self, task: str, error: errors.UnavailableError) -> None:
        """``task``'s process is gone: fail the step, stop waiting for it (loop thread)."""
        self._record(error)
        self._stop_waiting(task)

    async def _send_abort(self, task: str, error: errors.OpError) -> None:
        try:
            await self._master.call(
                task, "abort_step", step_id=self._step_id, error=ToPickle(error)
            )
        except errors.OpError:
            pass  # unreachable: the step fails there anyway

    def _results(self) -> list[Any]:
        retvals = [step.frame.retvals for step in self._steps]
        args = self._frame.args
        out = []
        for task, i, k in self._call.sources:
            if not task:
                out.append(args[i])
            elif task == LOCAL_TASK:
                out.append(retvals[i][k])  # type: ignore[index]
            else:
                out.append(self._remote_values[task][i])
        self._frame.retvals = out
        return out

    @property
    def stats(self) -> StepStats | None:
        """Every partition's node stats, local and remote, merged per device."""
        merged = super().stats
        for stats in self._remote_stats:
            if merged is None:
                merged = StepStats([])
            merged.dev_stats.extend(stats.dev_stats)
        return merged


class Master:
    """The distributed side of one session."""

    def __init__(self, cluster: Cluster, session: Session) -> None:
        self.cluster = cluster
        self.session = session
        self.handle = f"session_{uuid.uuid4().hex}"
        self.isolate = session.config.isolate_session_state
        self.device_names = tuple(cluster.devices())
        self._running: set[DistributedStep] = set()
        self._lock = threading.Lock()
        self._registered = False
        # Step ids are unique per task across every session using it: a random base
        # (from the OS, not `random`, which tests and apps may seed) plus a counter.
        self._step_ids = itertools.count(secrets.randbits(62))
        cluster.add_watcher(self._on_unavailable)
        with cluster._lock:
            cluster.sessions.add(self.handle)  # the cluster's pings renew its lease

    def __repr__(self) -> str:
        return (
            f"<Master {self.handle} tasks={len(self.cluster.tasks)} running={len(self._running)}>"
        )

    # -- the session's seam (asyncflow.session.seam.SessionMaster) ------------------------

    def prepared(
        self,
        compiled: Compiled,
        fetches: Sequence[Tensor],
        feed_keys: tuple[Any, ...],
        converters: tuple[Callable[[Any], Any], ...],
        rebuild: Rebuild,
    ) -> DistributedCall:
        """Bind the session's own partitions; the others are registered by the first step."""
        internals = self.session.internals
        local = [p for p, plan in enumerate(compiled.plans) if task_of(plan.device) == LOCAL_TASK]
        bound = [internals.bind(compiled.plans[p]) for p in local]
        self._registered = True
        call = DistributedCall(
            self, compiled, local, bound, fetches, feed_keys, converters, rebuild
        )
        if call.remote:
            call.register()  # in the background: a plan is registered by compiling it
        return call

    def new_step_id(self) -> int:
        """A fresh step id (thread-safe: ``next`` on a count is atomic)."""
        return next(self._step_ids)

    def runner(
        self,
        call: CompiledCall,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> DistributedStep:
        """The step of a compiled call (``rendezvous``: a partial run's)."""
        assert isinstance(call, DistributedCall)
        return DistributedStep(self, call, frame, trace, rendezvous)

    # -- transport (on the step's own loop: no hop to the client's thread) ------------------

    async def call(self, task: str, op: str, **kwargs: Any) -> Any:
        return await self.cluster.rpc(task, op, **kwargs)

    async def pull(self, task: str, step_id: int, key: str) -> tuple[Any, bool]:
        reply = await self.call(task, "recv_tensor", step_id=step_id, key=key)
        if not reply["ok"]:
            raise unwire(reply["error"])
        return unwire_value(reply["value"]), reply["dead"]

    async def push(self, task: str, step_id: int, key: str, value: Any, is_dead: bool) -> None:
        await self.call(
            task, "send_tensor", step_id=step_id, key=key, value=wire(value), dead=is_dead
        )

    # -- liveness -------------------------------------------------------------------------

    def _started(self, step: DistributedStep) -> None:
        with self._lock:
            self._running.add(step)

    def _stopped(self, step: DistributedStep) -> None:
        with self._lock:
            self._running.discard(step)

    def _on_unavailable(self, task: str, error: errors.UnavailableError) -> None:
        with self._lock:
            steps = [s for s in self._running if task in s.tasks]
        for step in steps:
            loop = step._loop
            if loop is None:
                step.abort_threadsafe(error)
                continue
            try:
                loop.call_soon_threadsafe(step.lost, task, error)
            except RuntimeError:  # its loop closed: the step is over
                pass

    # -- closing --------------------------------------------------------------------------

    async def _close_remote(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for task in self.cluster.tasks:
                if self.cluster.unavailable(task) is None:
                    tg.create_task(self._close_on(task))

    async def _close_on(self, task: str) -> None:
        try:
            await self.cluster.rpc(task, "close_session", session=self.handle)
        except errors.OpError:
            pass  # gone: nothing to close there

    def _forget(self) -> bool:
        self.cluster.remove_watcher(self._on_unavailable)
        with self.cluster._lock:
            self.cluster.sessions.discard(self.handle)
        return self._registered and not self.cluster._closed

    async def close(self) -> None:
        """Drop this session's graphs (and isolated state) on every task."""
        if self._forget():
            try:
                await self.cluster._call(self._close_remote())
            except errors.UnavailableError:
                pass  # the cluster is gone (or never started): nothing to drop there

    def close_sync(self) -> None:
        """``close`` for code without an event loop."""
        if self._forget():
            try:
                self.cluster._run_sync(self._close_remote(), timeout=_CLEANUP_TIMEOUT)
            except errors.UnavailableError:
                pass  # the cluster is gone (or never started): nothing to drop there
