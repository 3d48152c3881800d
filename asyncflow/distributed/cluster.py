"""Clusters: which Dask worker hosts which task, and the client that talks to them.

A :class:`Cluster` maps TensorFlow's cluster spec (``jobs={"ps": 1, "worker": 2}``)
onto the workers of a Dask cluster: tasks in job-name order then task index, workers
sorted by address, one worker per task — deterministic and recorded in
:attr:`Cluster.assignment`.  The Dask client lives on an event loop of its own (a
thread the cluster owns, or the loop of a client passed in), so sessions reach the
cluster from any loop, from ``run_sync`` and from several threads at once.

The cluster watches Dask's worker events: when the scheduler removes the worker of
a task (the process died), the task is marked unavailable and every step running on
it fails at once with ``UnavailableError`` naming the task.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import distributed
import distributed.comm.core

from asyncflow import errors
from asyncflow.distributed._dask import PLUGIN_NAME, AsyncflowWorker

__all__ = ["Cluster", "LocalCluster", "reset"]

T = TypeVar("T")

#: Dask's API, untyped: every object from it is ``Any`` here.
_dask: Any = distributed


class _Loop:
    """An event loop in a daemon thread of its own (the Dask client's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="asyncflow-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _task_names(jobs: Mapping[str, int]) -> tuple[str, ...]:
    if not isinstance(jobs, Mapping) or not jobs:
        raise ValueError(f"jobs must map job names to task counts, got {jobs!r}")
    names: list[str] = []
    for job in sorted(jobs):
        n = jobs[job]
        if not isinstance(job, str) or not job.isidentifier() or job == "localhost":
            raise ValueError(f"invalid job name {job!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"job {job!r} needs a task count >= 1, got {n!r}")
        names.extend(f"/job:{job}/replica:0/task:{t}" for t in range(n))
    return tuple(names)


class Cluster:
    """Tasks of named jobs, each hosted by one Dask worker.

    Make one with :meth:`connect` (a running ``dask scheduler``), :meth:`from_client`
    or :class:`LocalCluster`; pass it to ``af.Session(cluster, graph=g)``.
    """

    def __init__(self, jobs: Mapping[str, int], cpus_per_task: int = 1) -> None:
        if not isinstance(cpus_per_task, int) or cpus_per_task < 1:
            raise ValueError(f"cpus_per_task must be an int >= 1, got {cpus_per_task!r}")
        self.jobs = dict(jobs)
        self.tasks = _task_names(jobs)
        self.cpus_per_task = cpus_per_task
        #: task name → address of the Dask worker hosting it.
        self.assignment: dict[str, str] = {}
        self.client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: _Loop | None = None
        self._owns_client = False
        self._dead: dict[str, str] = {}  # task → why it is unavailable
        # In-flight calls per task (cluster loop only): a task's death ends them at once,
        # even a connect that Dask would retry for its whole connect timeout.
        self._calls: dict[str, set[asyncio.Task[Any]]] = {}
        self._severed: set[asyncio.Task[Any]] = set()
        self._watchers: list[Callable[[str, errors.UnavailableError], None]] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- making one --------------------------------------------------------------------

    @classmethod
    async def connect(cls, address: str, jobs: Mapping[str, int],
                      cpus_per_task: int = 1) -> Cluster:
        """Connect to a running Dask scheduler at ``address`` (``tcp://host:8786``)."""
        cluster = cls(jobs, cpus_per_task)
        cluster._own_loop = _Loop()
        cluster._loop = cluster._own_loop.loop
        cluster._owns_client = True
        try:
            await cluster._call(cluster._open_client(address))
        except BaseException:
            await asyncio.to_thread(cluster._close_now)
            raise
        return cluster

    @classmethod
    def from_client(cls, client: Any, jobs: Mapping[str, int],
                    cpus_per_task: int = 1) -> Cluster:
        """Use an existing Dask ``client`` (sync or asynchronous); it stays the caller's."""
        cluster = cls(jobs, cpus_per_task)
        cluster.client = client
        cluster._loop = client.loop.asyncio_loop
        if client.asynchronous:
            raise ValueError("Cluster.from_client needs a synchronous Client (one with its "
                             "own event loop thread); use `await afd.Cluster.connect("
                             "client.scheduler.address, jobs=...)` from async code")
        cluster._run_sync(cluster._attach())
        return cluster

    async def _open_client(self, address: Any) -> None:
        self.client = await _dask.Client(address, asynchronous=True,
                                               set_as_default=False)
        await self._attach()

    async def _attach(self) -> None:
        """Install the worker service, assign tasks to workers, watch their removal."""
        client = self.client
        assert client is not None
        await _maybe_await(client.register_plugin(AsyncflowWorker(), name=PLUGIN_NAME))
        info = await client.scheduler.identity(n_workers=-1)
        workers = sorted(info["workers"])
        if len(workers) < len(self.tasks):
            raise ValueError(f"the cluster needs {len(self.tasks)} Dask workers for jobs "
                             f"{self.jobs!r} but has {len(workers)}")
        self.assignment = dict(zip(self.tasks, workers))
        for task, address in self.assignment.items():
            client.subscribe_topic(address, self._watch(task))

    def _watch(self, task: str) -> Callable[[Any], None]:
        def on_event(event: Any) -> None:
            msg = event[1] if isinstance(event, tuple) else event
            if isinstance(msg, dict) and msg.get("action") == "remove-worker":
                self.mark_unavailable(task, "its Dask worker was removed from the cluster")
        return on_event

    # -- what sessions use ---------------------------------------------------------------

    def devices(self) -> list[str]:
        """Full names of every task's devices."""
        return [f"{task}/device:CPU:{i}" for task in self.tasks
                for i in range(self.cpus_per_task)]

    def unavailable(self, task: str) -> errors.UnavailableError | None:
        """Why ``task`` cannot run steps (its process died), or None."""
        why = self._dead.get(task)
        if why is None:
            return None
        return errors.UnavailableError(None, None, f"task {task} "
                                                   f"({self.assignment.get(task)}) is "
                                                   f"unavailable: {why}")

    def mark_unavailable(self, task: str, why: str) -> None:
        """``task`` is gone: record it and fail every step running on it (any thread)."""
        with self._lock:
            if task in self._dead:
                return
            self._dead[task] = why
            watchers = list(self._watchers)
        error = self.unavailable(task)
        assert error is not None
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._sever, task)
            except RuntimeError:  # the client's loop is closed: nothing in flight
                pass
        for watcher in watchers:
            watcher(task, error)

    def _sever(self, task: str) -> None:
        """End every call in flight to ``task`` (cluster loop)."""
        for call in self._calls.get(task, ()):
            if call.cancel():
                self._severed.add(call)

    def add_watcher(self, fn: Callable[[str, errors.UnavailableError], None]) -> None:
        with self._lock:
            self._watchers.append(fn)

    def remove_watcher(self, fn: Callable[[str, errors.UnavailableError], None]) -> None:
        with self._lock:
            if fn in self._watchers:
                self._watchers.remove(fn)

    def _asyncflow_master(self, session: Any) -> Any:
        """The session seam: ``af.Session(cluster)`` asks the cluster for its master."""
        from asyncflow.distributed.master import Master

        return Master(self, session)

    async def rpc(self, task: str, op: str, **kwargs: Any) -> Any:
        """Call handler ``asyncflow_<op>`` of ``task``'s worker (on the client's loop)."""
        dead = self.unavailable(task)
        if dead is not None:
            raise dead
        client = self.client
        if client is None or self._closed:
            state = "closed" if self._closed else (
                "not started (use `async with afd.LocalCluster(...) as cluster`)")
            raise errors.UnavailableError(None, None, f"cannot reach task {task}: the cluster "
                                                      f"is {state}")
        address = self.assignment[task]
        me = asyncio.current_task()
        assert me is not None
        calls = self._calls.setdefault(task, set())
        calls.add(me)
        try:
            return await getattr(client.rpc(address), f"asyncflow_{op}")(task=task, **kwargs)
        except (distributed.comm.core.CommClosedError, OSError) as exc:
            self.mark_unavailable(task, f"{type(exc).__name__}: {exc}")
            dead = self.unavailable(task)
            assert dead is not None
            raise dead from None
        except asyncio.CancelledError:
            if me not in self._severed:
                raise  # the caller's cancellation
            # Cancelled by _sever, like asyncio.timeout turns its own cancel into an error.
            self._severed.discard(me)
            me.uncancel()
            dead = self.unavailable(task)
            assert dead is not None
            raise dead from None
        finally:
            calls.discard(me)

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the client's loop, from any loop."""
        return await asyncio.wrap_future(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the client's loop; its result as a concurrent future."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            failed: Future[T] = Future()
            state = "closed" if self._closed else (
                "not started (use `async with afd.LocalCluster(...) as cluster`)")
            failed.set_exception(errors.UnavailableError(
                None, None, f"the cluster {self!r} is {state}"))
            return failed
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def _run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._submit(coro).result(timeout)

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the client (and the Dask cluster it started); idempotent."""
        await asyncio.to_thread(self._close_now)

    def close_sync(self) -> None:
        """``close`` for code without an event loop."""
        self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._own_loop is not None:
            try:
                self._run_sync(self._close_client(), timeout=60)
            finally:
                self._own_loop.stop()
                self._own_loop = None

    async def _close_client(self) -> None:
        if self.client is not None and self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close_sync()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} jobs={self.jobs!r} "
                f"unavailable={sorted(self._dead)!r} closed={self._closed}>")


class LocalCluster(Cluster):
    """A Dask ``LocalCluster`` of worker *processes*, one per task, started here.

    ``async with afd.LocalCluster(jobs={"ps": 1, "worker": 2}) as cluster`` or
    ``with afd.LocalCluster(...) as cluster``; closing it stops the processes.
    """

    def __init__(self, jobs: Mapping[str, int], cpus_per_task: int = 1) -> None:
        super().__init__(jobs, cpus_per_task)
        self.dask_cluster: Any = None
        self._started = False

    async def _start(self) -> None:
        self.dask_cluster = await _dask.LocalCluster(
            n_workers=len(self.tasks), threads_per_worker=self.cpus_per_task,
            processes=True, asynchronous=True, dashboard_address=":0",
            worker_dashboard_address=None)
        await self._open_client(self.dask_cluster)

    def _begin(self) -> None:
        if self._started:
            return
        self._started = True
        self._own_loop = _Loop()
        self._loop = self._own_loop.loop
        self._owns_client = True

    async def __aenter__(self) -> LocalCluster:
        self._begin()
        try:
            await self._call(self._start())
        except BaseException:
            await self.close()
            raise
        return self

    def __enter__(self) -> LocalCluster:
        self._begin()
        try:
            self._run_sync(self._start())
        except BaseException:
            self.close_sync()
            raise
        return self

    async def _close_client(self) -> None:
        await super()._close_client()
        if self.dask_cluster is not None:
            await self.dask_cluster.close()
            self.dask_cluster = None


async def reset(cluster: Cluster) -> None:
    """Clear every resource container (variables, queues) on every task of ``cluster``."""
    async def reset_all() -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                for task in cluster.tasks:
                    if cluster.unavailable(task) is None:  # a dead task has no state left
                        tg.create_task(cluster.rpc(task, "reset"))
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
    await cluster._call(reset_all())


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value

