"""Clusters: which Dask worker hosts which task, and the client that talks to them.

A :class:`Cluster` maps TensorFlow's cluster spec onto the workers of a Dask cluster.
A task is bound to a Dask worker by *name*, never by address order:

* ``jobs={"ps": ["ps-0"], "worker": ["w-0", "w-1"]}`` names the workers
  (``dask worker ADDRESS --name ps-0``);
* ``jobs={"ps": 1, "worker": 2}`` lets asyncflow choose once, under a scheduler lock,
  and records the choice in the scheduler's metadata, so every client of that
  scheduler sees the same task → worker map and adding workers never moves a task.

The Dask client lives on an event loop of its own (a thread the cluster owns, or the
loop of a client passed in), so sessions reach the cluster from any loop, from
``run_sync`` and from several threads at once.

Liveness, three ways: Dask's ``remove-worker`` event (the process died), a failed
connection, and the cluster's own health watch (a task with calls in flight that does
not answer a ping within ``health_timeout_s`` — a hung host).  Any of them marks the
task unavailable and fails every step running on it at once with ``UnavailableError``.
The next step touching it looks the task's worker name up again: a worker back under
that name takes its task back (a new process: the first step fails with
``AbortedError``, "restarted: its state is gone"; the same process that merely stopped
answering: steps simply run again).  The same pings renew this client's lease on the
tasks, so workers drop what a master that has gone silent left behind.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import distributed
import distributed.comm.core
from distributed.protocol import pickle as _dask_pickle

from asyncflow import errors
from asyncflow.distributed._dask import (
    PLUGIN_NAME,
    SERVICE_STOPPED,
    AsyncflowWorker,
    abandon_pool,
    close_pool,
    closing_with,
    local_identity,
    send,
)
from asyncflow.distributed._scheduler import METADATA_KEY, claimer, keeper, name_order

__all__ = ["Cluster", "LocalCluster", "reset"]

T = TypeVar("T")

#: Dask's API, untyped: every object from it is ``Any`` here.
_dask: Any = distributed
_pickle: Any = _dask_pickle


#: A job's tasks: a count (asyncflow chooses the workers) or the workers' names.
JobSpec = int | Sequence[str]


class _Loop:
    """An event loop in a daemon thread of its own (the Dask client's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="asyncflow-cluster", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _task_names(jobs: Mapping[str, JobSpec]) -> dict[str, str | None]:
    """Task name → the Dask worker name it is pinned to (None: asyncflow chooses)."""
    if not isinstance(jobs, Mapping) or not jobs:
        raise ValueError(f"jobs must map job names to task counts or worker names, got {jobs!r}")
    tasks: dict[str, str | None] = {}
    for job in sorted(jobs):
        spec = jobs[job]
        if not isinstance(job, str) or not job.isidentifier() or job == "localhost":
            raise ValueError(f"invalid job name {job!r}")
        if isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 1:
                raise ValueError(f"job {job!r} needs a task count >= 1, got {spec!r}")
            names: list[str | None] = [None] * spec
        elif (
            isinstance(spec, Sequence)
            and not isinstance(spec, str)
            and spec
            and all(isinstance(n, str) and n for n in spec)
        ):
            names = list(spec)
        else:
            raise ValueError(
                f"job {job!r} needs a task count >= 1 or a list of Dask worker names, got {spec!r}"
            )
        for t, name in enumerate(names):
            tasks[f"/job:{job}/replica:0/task:{t}"] = name
    pinned = [n for n in tasks.values() if n is not None]
    if len(set(pinned)) != len(pinned):
        raise ValueError(f"jobs {jobs!r} name a Dask worker twice: each worker hosts one task")
    return tasks


class Cluster:
    """Tasks of named jobs, each hosted by one Dask worker.

    Make one with :meth:`connect` (a running ``dask scheduler``), :meth:`from_client`
    or :class:`LocalCluster`; pass it to ``af.Session(cluster, graph=g)``.

    ``health_timeout_s``: a task with calls in flight that does not answer a ping for
    that long is unavailable.  ``master_lease_s``: how long the workers keep the
    sessions and steps of this client after they last heard from it.
    """

    def __init__(
        self,
        jobs: Mapping[str, JobSpec],
        cpus_per_task: int = 1,
        *,
        health_timeout_s: float = 10.0,
        master_lease_s: float = 10.0,
    ) -> None:
        if not isinstance(cpus_per_task, int) or cpus_per_task < 1:
            raise ValueError(f"cpus_per_task must be an int >= 1, got {cpus_per_task!r}")
        for what, value in (
            ("health_timeout_s", health_timeout_s),
            ("master_lease_s", master_lease_s),
        ):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{what} must be a number > 0, got {value!r}")
        self.jobs = (
            {job: spec if isinstance(spec, int) else list(spec) for job, spec in jobs.items()}
            if isinstance(jobs, Mapping)
            else jobs
        )
        self._pinned = _task_names(jobs)
        self.tasks = tuple(self._pinned)
        self.cpus_per_task = cpus_per_task
        self.health_timeout_s = float(health_timeout_s)
        self.master_lease_s = float(master_lease_s)
        #: task name → name of the Dask worker hosting it (stable).
        self.names: dict[str, str] = {}
        #: task name → address of the Dask worker hosting it now.
        self.assignment: dict[str, str] = {}
        #: task name → address of its task service (in that worker's process), where
        #: steps are sent.
        self.service: dict[str, str] = {}
        #: task name → how many times its worker was replaced (graphs registered with
        #: an older generation are registered again).
        self.generation: dict[str, int] = {}
        #: task name → the number of its process's last stall this client heard of
        #: (a step sent with it is dropped there if it stalled long after).
        self.epoch: dict[str, int] = {}
        self._incarnation: dict[str, str] = {}  # task → its worker process's token
        self.client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: _Loop | None = None
        self._owns_client = False
        self._dead: dict[str, str] = {}  # task → why it is unavailable
        # Tasks whose worker stopped its service (the plugin was removed): each call
        # asks the worker again first.
        self._no_service: set[str] = set()
        # In-flight calls per task (cluster loop only): a task's death ends them at once,
        # even a connect that Dask would retry for its whole connect timeout.
        self._calls: dict[str, set[asyncio.Task[Any]]] = {}
        self._severed: set[asyncio.Task[Any]] = set()
        # Loop → the connection pool of calls made on it (see _pool).
        #: Loop → (its connection pool, the guard that closes it with the loop).
        self._pools: dict[asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None, None]]] = {}
        self._watchers: list[Callable[[str, errors.UnavailableError], None]] = []
        #: Master session handles of this client (renewed on every task by the pings).
        self.sessions: set[str] = set()
        self._install_error: str | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- making one --------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        address: str,
        jobs: Mapping[str, JobSpec],
        cpus_per_task: int = 1,
        *,
        security: Any = None,
        timeout_s: float = 30.0,
        health_timeout_s: float = 10.0,
        master_lease_s: float = 10.0,
    ) -> Cluster:
        """Connect to a running Dask scheduler at ``address`` (``tcp://host:8786``).

        ``security``: Dask's ``distributed.security.Security`` (TLS).  Named workers
        not yet in the cluster are waited for up to ``timeout_s``.
        """
        cluster = cls(
            jobs, cpus_per_task, health_timeout_s=health_timeout_s, master_lease_s=master_lease_s
        )
        cluster._own_loop = _Loop()
        cluster._loop = cluster._own_loop.loop
        cluster._owns_client = True
        try:
            await cluster._call(cluster._open_client(address, security, timeout_s))
        except BaseException:
            await asyncio.to_thread(cluster._close_now)
            raise
        return cluster

    @classmethod
    def from_client(
        cls,
        client: Any,
        jobs: Mapping[str, JobSpec],
        cpus_per_task: int = 1,
        *,
        timeout_s: float = 30.0,
        health_timeout_s: float = 10.0,
        master_lease_s: float = 10.0,
    ) -> Any:
        """Use an existing Dask ``client``; it stays the caller's.

        A synchronous client gives the cluster at once; an asynchronous one (like
        Dask's own API) gives an awaitable: ``cluster = await Cluster.from_client(c,
        ...)``, and sessions then run on that client's loop (``await sess.run``).
        """
        cluster = cls(
            jobs, cpus_per_task, health_timeout_s=health_timeout_s, master_lease_s=master_lease_s
        )
        cluster.client = client
        cluster._loop = client.loop.asyncio_loop
        if client.asynchronous:

            async def attach() -> Cluster:
                await cluster._attach(timeout_s)
                return cluster

            return attach()
        cluster._run_sync(cluster._attach(timeout_s))
        return cluster

    async def _open_client(
        self, address: Any, security: Any = None, timeout_s: float = 30.0
    ) -> None:
        self.client = await _dask.Client(
            address, asynchronous=True, security=security, set_as_default=False
        )
        await self._attach(timeout_s)

    async def _attach(self, timeout_s: float) -> None:
        """Install the worker service, bind tasks to workers, start watching them."""
        client = self.client
        assert client is not None
        failed = await self._install()
        deadline = time.monotonic() + timeout_s
        while True:
            names = await self._bind_names(timeout_s, failed, deadline)
            by_name = await self._addresses_by_name()
            if all(name in by_name for name in names.values()):
                try:
                    async with asyncio.TaskGroup() as tg:
                        for task, name in names.items():
                            tg.create_task(
                                self._adopt(
                                    task, name, by_name[name], failed, deadline - time.monotonic()
                                )
                            )
                    break
                except BaseExceptionGroup as group:
                    exc = group.exceptions[0]
                    by_name = await self._addresses_by_name()
                    if not (
                        isinstance(exc, errors.UnavailableError)
                        and not all(name in by_name for name in names.values())
                    ):
                        raise exc from None
            # A worker seen a moment ago has left (Dask removes one that cannot load
            # asyncflow once the service is installed, also while it is being adopted):
            # bind again; _bind_names names it if it is still missing at the deadline.
            await asyncio.sleep(0.1)
        self.assignment = {task: self.assignment[task] for task in self.tasks}  # in order
        self.names = names
        self._watch_task = asyncio.get_running_loop().create_task(self._health_watch())

    async def _addresses_by_name(self) -> dict[str, str]:
        """Worker name → address, of the workers in the cluster now."""
        info = await self.client.scheduler.identity(n_workers=-1)
        return {str(w.get("name")): address for address, w in info["workers"].items()}

    async def _install(self) -> dict[str, str]:
        """Register the worker service on every worker; worker address → why it failed.

        Called through the scheduler (not ``Client.register_plugin``) so one worker
        that cannot load asyncflow is named instead of failing everything.
        """
        await self.client.scheduler.register_scheduler_plugin(
            plugin=_pickle.dumps(keeper()()), name=f"{PLUGIN_NAME}-tasks", idempotent=True
        )
        try:
            replies = await self.client.scheduler.register_worker_plugin(
                plugin=_pickle.dumps(AsyncflowWorker()), name=PLUGIN_NAME, idempotent=True
            )
        except Exception as exc:
            # A worker could not even load the plugin (no asyncflow there); Dask does not
            # say which: the handshake finds it and names it with this reason.
            self._install_error = f"{type(exc).__name__}: {exc}"
            return {}
        return {
            address: str(reply.get("exception", reply.get("text", "setup failed")))
            for address, reply in (replies or {}).items()
            if reply.get("status") == "error"
        }

    async def _bind_names(
        self, timeout_s: float, failed: Mapping[str, str], deadline: float
    ) -> dict[str, str]:
        """Task → worker name: the pinned ones, the rest recorded on the scheduler;
        named workers missing at ``deadline`` fail naming them (and ``timeout_s``)."""
        client = self.client
        while True:
            info = await client.scheduler.identity(n_workers=-1)
            workers = info["workers"]
            present = {str(w.get("name")): a for a, w in workers.items()}
            missing = [n for n in self._pinned.values() if n is not None and n not in present]
            if not missing:
                if len(workers) < len(self.tasks):
                    raise ValueError(
                        f"the cluster needs {len(self.tasks)} Dask workers for "
                        f"jobs {self.jobs!r} but has {len(workers)}"
                    )
                break
            if time.monotonic() > deadline:
                raise errors.UnavailableError(
                    None,
                    None,
                    f"no Dask worker named {', '.join(map(repr, missing))} "
                    f"joined the cluster within {timeout_s:g} s (workers: "
                    f"{', '.join(map(repr, sorted(present)))}); start it with "
                    f"`dask worker ADDRESS --name NAME` (Dask refuses a worker "
                    f"that cannot load asyncflow: install it there)",
                )
            await asyncio.sleep(0.1)
        # Recorded even when every task is pinned: the scheduler's plugin reads the map.
        free = sorted((n for n, a in present.items() if a not in failed), key=name_order)
        if any(n is None for n in self._pinned.values()):
            free = await self._compatible(free, present)
        reply = await client.scheduler.run_function(
            function=_pickle.dumps(claimer()),
            args=_pickle.dumps((METADATA_KEY, dict(self._pinned), free)),
            kwargs=_pickle.dumps({}),
            wait=True,
        )
        if reply["status"] == "error":
            _, exc, _ = _dask.core.clean_exception(**reply)
            raise ValueError(str(exc)) from None
        names = dict(reply["result"])
        missing = sorted({n for n in names.values() if n not in present})
        if missing:
            raise errors.UnavailableError(
                None,
                None,
                f"the scheduler records tasks on Dask workers "
                f"{', '.join(map(repr, missing))}, which are not in the cluster; "
                f"start them again under the same names",
            )
        return names

    async def _compatible(self, names: list[str], present: Mapping[str, str]) -> list[str]:
        """The workers of ``names`` that pass the handshake (asyncflow chooses among
        them, so a worker with another version or none is never recorded for a task)."""

        async def ok(name: str) -> bool:
            try:
                await self._hello("(unassigned)", name, present[name])
            except errors.OpError:
                return False
            return True

        async with asyncio.TaskGroup() as tg:
            checks = [tg.create_task(ok(name)) for name in names]
        return [name for name, check in zip(names, checks, strict=True) if check.result()]

    async def _adopt(
        self,
        task: str,
        name: str,
        address: str,
        failed: Mapping[str, str],
        wait_s: float | None = None,
    ) -> str:
        """Handshake with ``task``'s worker and bind the task to it; its token
        (``wait_s``: see :meth:`_hello`)."""
        if address in failed:
            raise errors.FailedPreconditionError(
                None,
                None,
                f"Dask worker {name!r} ({address}) cannot host task {task}: "
                f"asyncflow's worker service failed there: {failed[address]}",
            )
        token, service = await self._hello(task, name, address, wait_s)
        self.assignment[task] = address
        self.service[task] = service
        self.generation.setdefault(task, 0)
        if self._incarnation.get(task, token) != token:
            self.generation[task] += 1
        self._incarnation[task] = token
        self.client.subscribe_topic(address, self._watch(task, address))
        return token

    async def _hello(
        self, task: str, name: str, address: str, wait_s: float | None = None
    ) -> tuple[str, str]:
        """The version and protocol handshake; the worker process's token and its task
        service's address.

        Bounded by ``health_timeout_s``, or by ``wait_s`` when longer: what is left of
        a connect's ``timeout_s`` (a worker that just joined may take a while to start
        the service it answers with, on a loaded host more than a short health timeout).
        """
        version, protocol = local_identity()
        limit = self.health_timeout_s if wait_s is None else max(wait_s, self.health_timeout_s)
        try:
            async with asyncio.timeout(limit):
                reply = await self.client.rpc(address).asyncflow_hello(
                    task=task, version=version, protocol=protocol
                )
        except TimeoutError:
            raise errors.UnavailableError(
                None,
                None,
                f"task {task}: Dask worker {name!r} ({address}) did not answer within {limit:g} s",
            ) from None
        except (distributed.comm.core.CommClosedError, OSError) as exc:
            raise errors.UnavailableError(
                None,
                None,
                f"task {task}: Dask worker {name!r} ({address}) is "
                f"unreachable: {type(exc).__name__}: {exc}",
            ) from None
        if not isinstance(reply, dict):
            why = (
                f"installing it failed: {self._install_error}"
                if self._install_error
                else f"its worker plugin {PLUGIN_NAME!r} was unregistered (or asyncflow "
                f"is not installed there)"
            )
            raise errors.FailedPreconditionError(
                None,
                None,
                f"Dask worker {name!r} ({address}) has no asyncflow service "
                f"for task {task}: {why}; install asyncflow on the worker and "
                f"connect again",
            )
        if (reply["version"], reply["protocol"]) != (version, protocol):
            raise errors.FailedPreconditionError(
                None,
                None,
                f"Dask worker {name!r} ({address}) runs asyncflow "
                f"{reply['version']} (protocol {reply['protocol']}) but this "
                f"client runs {version} (protocol {protocol}); install the same "
                f"asyncflow on every machine",
            )
        self.epoch[task] = int(reply["epoch"])
        return str(reply["incarnation"]), str(reply["service"])

    def _watch(self, task: str, address: str) -> Callable[[Any], None]:
        def on_event(event: Any) -> None:
            msg = event[1] if isinstance(event, tuple) else event
            if not isinstance(msg, dict) or self.assignment.get(task) != address:
                return
            if msg.get("action") == "remove-worker":
                self.mark_unavailable(task, "its Dask worker was removed from the cluster")
            elif msg.get("action") == SERVICE_STOPPED and msg.get(
                "incarnation"
            ) == self._incarnation.get(task):
                self._no_service.add(task)
                self._sever(task)

        return on_event

    async def _ask_again(self, task: str) -> None:
        """``task``'s worker stopped its service: shake hands again (an error naming
        the worker while it has none; ``AbortedError`` when it has a new one, whose
        state is gone)."""
        old = self._incarnation.get(task)
        await self._adopt(task, self.names[task], self.assignment[task], {})
        self._no_service.discard(task)
        if self._incarnation[task] != old:
            raise self.restarted(task)

    # -- finding a task's worker again ---------------------------------------------------

    async def revive(self, task: str) -> None:
        """``task`` was unavailable: bind it to its worker again if it is back (cluster
        loop).  Raises ``AbortedError`` when a new process took the task (its state is
        gone), ``UnavailableError`` while no worker of that name answers."""
        if task not in self._dead:
            return
        try:
            restarted = await self._rebind(task)
        except errors.UnavailableError:
            dead = self.unavailable(task)
            assert dead is not None
            raise dead from None
        with self._lock:
            self._dead.pop(task, None)
        if restarted:
            raise self.restarted(task)

    async def _rebind(self, task: str) -> bool:
        """Find ``task``'s worker by name again and shake hands (bounded); True when a
        new process hosts it."""
        name = self.names[task]
        old = self._incarnation.get(task)
        try:
            async with asyncio.timeout(self.health_timeout_s):
                info = await self.client.scheduler.identity(n_workers=-1)
                address = next(
                    (a for a, w in info["workers"].items() if str(w.get("name")) == name), None
                )
                if address is None:
                    raise errors.UnavailableError(None, None, f"no Dask worker named {name!r}")
                # (Again: a restarted scheduler has forgotten the worker service.)
                failed = await self._install()
                await self._adopt(task, name, address, failed)
        except (TimeoutError, distributed.comm.core.CommClosedError, OSError) as exc:
            raise errors.UnavailableError(
                None, None, f"the scheduler is unreachable: {type(exc).__name__}: {exc}"
            ) from None
        return self._incarnation[task] != old

    def restarted(self, task: str) -> errors.AbortedError:
        return errors.AbortedError(
            None,
            None,
            f"task {task} (Dask worker {self.names.get(task)!r}) restarted: "
            f"its state is gone (variables are uninitialized); run the step "
            f"again, or recover with af.train.MonitoredSession",
        )

    # -- what sessions use ---------------------------------------------------------------

    def devices(self) -> list[str]:
        """Full names of every task's devices."""
        return [f"{task}/device:CPU:{i}" for task in self.tasks for i in range(self.cpus_per_task)]

    def unavailable(self, task: str) -> errors.UnavailableError | None:
        """Why ``task`` cannot run steps (its worker died or hangs), or None."""
        why = self._dead.get(task)
        if why is None:
            return None
        return errors.UnavailableError(
            None,
            None,
            f"task {task} (Dask worker {self.names.get(task)!r} at "
            f"{self.assignment.get(task)}) is unavailable: {why}; steps on it "
            f"run again once a Dask worker named {self.names.get(task)!r} is "
            f"back (af.train.MonitoredSession recovers automatically)",
        )

    def mark_unavailable(self, task: str, why: str) -> None:
        """``task`` is gone: record it and fail every step running on it (any thread)."""
        with self._lock:
            if task in self._dead:
                return
            self._dead[task] = why
            watchers = list(self._watchers)
        error = self.unavailable(task)
        assert error is not None
        self._sever(task)
        for watcher in watchers:
            watcher(task, error)

    def _sever(self, task: str) -> None:
        """End every call in flight to ``task`` (any thread: each call is ended on its
        own loop, if it is still in flight there)."""
        for call in list(self._calls.get(task, ())):
            try:
                call.get_loop().call_soon_threadsafe(self._sever_call, task, call)
            except RuntimeError:  # its loop is closed: the call is over
                pass

    def _sever_call(self, task: str, call: asyncio.Task[Any]) -> None:
        if call in self._calls.get(task, ()) and call.cancel():
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

    async def _client_side(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` (which uses the Dask client) on the client's loop."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await self._call(coro)

    async def _pool(self) -> Any:
        """The connection pool for calls made on the running loop: the client's own on
        its loop, a pool configured like it on any other loop (a session's), so a step
        talks to the tasks without hopping to the client's thread and back.

        A pool of another loop closes with that loop: a guard (:func:`closing_with`)
        that asyncio's ``shutdown_asyncgens`` closes (``asyncio.run``, ``Runner``,
        pytest-asyncio) aborts its comms on the loop before the loop closes; a
        transport cannot be closed once its loop is."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return self.client.rpc
        held = self._pools.get(loop)
        if held is not None:
            return held[0]
        own = self.client.rpc
        pool = _dask.core.ConnectionPool(
            limit=own.limit,
            serializers=own.serializers,
            deserializers=own.deserializers,
            connection_args=own.connection_args,
            timeout=own.timeout,
        )
        await pool.start()  # never suspends: no second pool is made meanwhile
        guard = closing_with(pool)
        await anext(guard)  # (never suspends either: it only registers with the loop)
        with self._lock:
            self._drop_pools(lambda other: other.is_closed())
            self._pools[loop] = (pool, guard)
        return pool

    def _drop_pools(self, which: Callable[[asyncio.AbstractEventLoop], bool]) -> None:
        """Close the pools of the loops ``which`` selects (under the lock)."""
        for loop in [loop for loop in self._pools if which(loop)]:
            pool, _ = self._pools.pop(loop)
            if loop.is_closed() or not loop.is_running():
                abandon_pool(pool)  # nothing runs there: close what can be closed here
            else:
                loop.call_soon_threadsafe(abandon_pool, pool)

    async def rpc(self, task: str, op: str, **kwargs: Any) -> Any:
        """Call handler ``asyncflow_<op>`` of ``task``'s task service (from any loop)."""
        dead = self.unavailable(task)
        if dead is not None:
            raise dead
        client = self.client
        if client is None or self._closed:
            state = (
                "closed"
                if self._closed
                else ("not started (use `async with afd.LocalCluster(...) as cluster`)")
            )
            raise errors.UnavailableError(
                None, None, f"cannot reach task {task}: the cluster is {state}"
            )
        if task in self._no_service:
            await self._client_side(self._ask_again(task))
        address = self.service[task]
        pool = await self._pool()
        me = asyncio.current_task()
        assert me is not None
        calls = self._calls.setdefault(task, set())
        calls.add(me)
        try:
            # Again, now that _sever sees this call: a task marked gone from another
            # thread between the first look and here is not called.
            dead = self.unavailable(task)
            if dead is not None:
                raise dead
            reply = await send(
                pool,
                address,
                f"asyncflow_{op}",
                task=task,
                incarnation=self._incarnation[task],
                **kwargs,
            )
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
            if dead is None:  # the worker stopped its service: say why (it raises)
                await self._client_side(self._ask_again(task))
                dead = errors.UnavailableError(
                    None,
                    None,
                    f"task {task}: the call was interrupted by its worker's "
                    f"service stopping; run the step again",
                )
            raise dead from None
        finally:
            calls.discard(me)
        if isinstance(reply, dict) and reply.get("restarted"):
            # A new process answers at the old address: take it, the state is gone.
            try:
                await self._client_side(self._rebind(task))
            except (errors.OpError, TimeoutError):
                self.mark_unavailable(task, "its Dask worker restarted")
        return self._checked(task, address, reply)

    def _checked(self, task: str, address: str, reply: Any) -> Any:
        """A handler's reply, or the error of a worker that lost its service or state."""
        if isinstance(reply, dict) and reply.get("restarted"):
            raise self.restarted(task)
        if reply is None:  # Dask's answer to an op without a handler
            raise errors.FailedPreconditionError(
                None,
                None,
                f"Dask worker {self.names.get(task)!r} ({address}) has no "
                f"asyncflow service for task {task}: its worker plugin "
                f"{PLUGIN_NAME!r} was unregistered (or asyncflow is missing "
                f"there); connect again to install it",
            )
        return reply

    # -- health and leases -------------------------------------------------------------

    async def _health_watch(self) -> None:
        """Ping every task: renews this client's lease there, and a task with calls in
        flight that does not answer within ``health_timeout_s`` is marked unavailable."""
        period = min(self.health_timeout_s, self.master_lease_s) / 4
        while not self._closed:
            async with asyncio.TaskGroup() as tg:
                for task in self.tasks:
                    if task not in self._dead and task in self.assignment:
                        tg.create_task(self._ping(task))
            await asyncio.sleep(period)

    async def _ping(self, task: str) -> None:
        address = self.assignment[task]
        busy = bool(self._calls.get(task))
        try:
            async with asyncio.timeout(self.health_timeout_s):
                reply = await self.client.rpc(address).asyncflow_ping(
                    task=task, sessions=self._session_list(), lease=self.master_lease_s
                )
        except TimeoutError:
            if busy or self._calls.get(task):
                self.mark_unavailable(
                    task, f"it did not answer for {self.health_timeout_s:g} s (a hung host?)"
                )
            return
        except Exception:
            return  # a dead worker: Dask's events and the calls themselves report it
        if isinstance(reply, dict) and "epoch" in reply:
            self.epoch[task] = int(reply["epoch"])

    def _session_list(self) -> list[str]:
        with self._lock:
            return sorted(self.sessions)

    async def _stop_watch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the client's loop, from any loop."""
        return await asyncio.wrap_future(self._submit(coro))

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the client's loop; its result as a concurrent future."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            failed: Future[T] = Future()
            state = (
                "closed"
                if self._closed
                else ("not started (use `async with afd.LocalCluster(...) as cluster`)")
            )
            failed.set_exception(
                errors.UnavailableError(None, None, f"the cluster {self!r} is {state}")
            )
            return failed
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def _run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._submit(coro).result(timeout)

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the client (and the Dask cluster it started); idempotent."""
        with self._lock:
            held = self._pools.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await close_pool(held[0])
            await held[1].aclose()
        if self._own_loop is None and self.client is not None and self.client.asynchronous:
            if not self._closed:  # an asynchronous client of the caller: its loop is ours
                self._closed = True
                await self._stop_watch()
            return
        await asyncio.to_thread(self._close_now)

    def close_sync(self) -> None:
        """``close`` for code without an event loop."""
        self._close_now()

    def _close_now(self) -> None:
        with self._lock:
            self._drop_pools(lambda loop: True)
        if self._closed:
            return
        self._closed = True
        if self._own_loop is not None:
            try:
                self._run_sync(self._close_client(), timeout=60)
            finally:
                self._own_loop.stop()
                self._own_loop = None
        elif self._loop is not None and not self._loop.is_closed():
            self._run_sync(self._stop_watch(), timeout=60)

    async def _close_client(self) -> None:
        await self._stop_watch()
        if self.client is not None and self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_sync()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} jobs={self.jobs!r} "
            f"unavailable={sorted(self._dead)!r} closed={self._closed}>"
        )


class LocalCluster(Cluster):
    """A Dask ``LocalCluster`` of worker *processes*, one per task, started here.

    ``async with afd.LocalCluster(jobs={"ps": 1, "worker": 2}) as cluster`` or
    ``with afd.LocalCluster(...) as cluster``; closing it stops the processes.
    ``security``: Dask's ``Security`` (``Security.temporary()`` or certificate files)
    to run every comm over TLS.  Workers are named after their tasks
    (``ps-0``, ``worker-1``) unless ``jobs`` names them.
    """

    def __init__(
        self,
        jobs: Mapping[str, JobSpec],
        cpus_per_task: int = 1,
        *,
        security: Any = None,
        health_timeout_s: float = 10.0,
        master_lease_s: float = 10.0,
    ) -> None:
        super().__init__(
            jobs, cpus_per_task, health_timeout_s=health_timeout_s, master_lease_s=master_lease_s
        )
        self.security = security
        self.dask_cluster: Any = None
        self._started = False

    async def _start(self) -> None:
        kwargs: dict[str, Any] = {} if self.security is None else {"security": self.security}
        dask_cluster = self.dask_cluster = await _dask.LocalCluster(
            n_workers=0,
            threads_per_worker=self.cpus_per_task,
            processes=True,
            asynchronous=True,
            dashboard_address="127.0.0.1:0",
            worker_dashboard_address=None,
            host="127.0.0.1",
            **kwargs,
        )
        # One Dask worker per task, named after it: the spec's key is the worker's name.
        for task in self.tasks:
            dask_cluster.worker_spec[self._worker_name(task)] = copy.deepcopy(dask_cluster.new_spec)
        await dask_cluster
        self._pinned = {task: self._worker_name(task) for task in self.tasks}
        await self._open_client(dask_cluster, None)

    def _worker_name(self, task: str) -> str:
        pinned = self._pinned[task]
        if pinned is not None:
            return pinned
        job, index = task.split("/")[1][len("job:") :], task.rsplit(":", 1)[1]
        return f"{job}-{index}"

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
