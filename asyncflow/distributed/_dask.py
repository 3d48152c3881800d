"""The worker service inside a Dask worker process: a ``WorkerPlugin`` that adds
asyncflow's handlers to the worker's server and hosts the task's own event loop.

Dask's comms carry every message (``worker.handlers``, ``ConnectionPool``); numpy
arrays travel as buffers (``to_serialize``), partitions, errors and step stats with
Dask's pickle (cloudpickle, so ``py_func`` bodies ship too).  Handlers run on Dask's
event loop and hand the work to the task's loop, in a thread of its own, so a long
step never stalls the worker's heartbeats.  Pulls from peers leave from the task's
loop through a Dask ``ConnectionPool`` of its own (configured like the worker's), so
a cross-task recv costs no hop through Dask's loop on the consuming side.

Handlers (all take ``task``, the task name the master assigned to this worker):
``hello`` (the version handshake) and ``ping`` (health and lease renewal) answer on
Dask's loop at once; ``register_graph``, ``deregister_graph``, ``close_session``,
``run_graph``, ``recv_tensor``, ``send_tensor``, ``abort_step``, ``cleanup_step`` and
``reset`` also take ``incarnation``, the token of the worker process the master
shook hands with: a different token means the worker restarted (its state is gone)
and the reply says ``restarted`` instead of failing on state that is not there.
Every handler answers with a dict, so Dask's ``None`` for an op without a handler
(asyncflow missing, or its plugin unregistered) is told apart.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from distributed import WorkerPlugin
from distributed.comm.core import CommClosedError
from distributed.core import ConnectionPool
from distributed.protocol.serialize import ToPickle, to_serialize

import asyncflow
from asyncflow import errors
from asyncflow.distributed.worker import WorkerEnv

__all__ = ["EVENT_TOPIC", "PLUGIN_NAME", "PROTOCOL", "AsyncflowWorker", "local_identity", "unavailable",
           "wire", "unwire"]

PLUGIN_NAME = "asyncflow"
#: The topic of the events each remote partition run logs on the scheduler.
EVENT_TOPIC = "asyncflow"
#: The wire protocol between masters and workers: bumped whenever a handler's
#: arguments or replies change, so mismatched installs fail at registration.
PROTOCOL = 4
#: How often a task looks for sessions whose master's lease ran out.
_LEASE_CHECK_S = 0.25
_OK: dict[str, Any] = {"ok": True}


def local_identity() -> tuple[str, int]:
    """(asyncflow version, wire protocol) of this process (read at call time)."""
    return str(asyncflow.__version__), PROTOCOL
T = TypeVar("T")

#: Connection failures that mean "the peer process is gone".
COMM_ERRORS = (CommClosedError, OSError)


def unavailable(task: str, address: str, exc: BaseException) -> errors.UnavailableError:
    return errors.UnavailableError(
        None, None, f"task {task} (Dask worker {address}) is unavailable: "
                    f"{type(exc).__name__}: {exc}")


def wire(value: Any) -> Any:
    """A value as it travels: arrays as buffers, anything else pickled."""
    return to_serialize(value)  # type: ignore[no-untyped-call]


def unwire(value: Any) -> Any:
    return value.data if isinstance(value, ToPickle) else value


class _TaskLoop:
    """The task's event loop, running in a thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Stopped: cancel what is left and let it finish, then close.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the task loop and await it from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


class AsyncflowWorker(WorkerPlugin):
    """Installed on every Dask worker by :class:`asyncflow.distributed.Cluster`."""

    name = PLUGIN_NAME
    #: A second client registering it keeps the first one's: every client of the
    #: cluster shares the tasks' state (variables on ps tasks), as in TF.
    idempotent = True

    def __init__(self) -> None:
        self._envs: dict[str, WorkerEnv] = {}
        self._addresses: dict[str, str] = {}
        self._worker: Any = None
        self._task_loop: _TaskLoop | None = None
        self._pool: Any = None  # the task loop's ConnectionPool (made by the first pull)
        #: This worker process's token (made by ``setup``, in the worker: the plugin is
        #: pickled by the client): a master holding another one talks to a worker that
        #: restarted (or whose plugin was installed again).
        self.incarnation = ""

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self, worker: Any) -> None:
        self._worker = worker
        self.incarnation = uuid.uuid4().hex
        self._task_loop = _TaskLoop(f"asyncflow-task-{worker.address}")
        self._task_loop.loop.call_soon_threadsafe(self._check_leases)
        for name in ("hello", "ping", "client_gone", "register_graph", "deregister_graph", "close_session", "run_graph",
                     "recv_tensor", "send_tensor", "abort_step", "cleanup_step", "reset"):
            worker.handlers[f"asyncflow_{name}"] = getattr(self, f"_h_{name}")

    async def teardown(self, worker: Any) -> None:
        for name in list(worker.handlers):
            if name.startswith("asyncflow_"):
                del worker.handlers[name]
        task_loop, self._task_loop = self._task_loop, None
        if task_loop is not None:
            envs, self._envs = list(self._envs.values()), {}
            pool, self._pool = self._pool, None
            if pool is not None:
                await task_loop.call(pool.close())
            # Joining threads would block Dask's loop: done on a thread of its own.
            await asyncio.to_thread(task_loop.stop)
            for env in envs:
                await asyncio.to_thread(env.close)

    # -- plumbing -------------------------------------------------------------------------

    def _check_leases(self) -> None:
        """Drop the sessions of masters gone silent (task loop, every quarter second)."""
        now = time.monotonic()
        for env in list(self._envs.values()):
            env.expire(now)
        task_loop = self._task_loop
        if task_loop is not None:
            task_loop.loop.call_later(_LEASE_CHECK_S, self._check_leases)

    def _event(self, task: str, name: str, step_id: int, start: float, status: str) -> None:
        """A partition run, as an event on Dask's scheduler (topic ``asyncflow``, shown
        by the dashboard and ``Client.get_events``); batched with Dask's own messages."""
        self._worker.log_event(EVENT_TOPIC, {
            "action": "run_graph", "step": name, "step_id": step_id, "task": task,
            "start": start, "stop": time.time(), "status": status})

    def _stale(self, incarnation: str) -> bool:
        return incarnation != self.incarnation

    def _env(self, task: str, cpus: int = 1, threads: int = 1) -> WorkerEnv:
        env = self._envs.get(task)
        if env is None:
            env = self._envs[task] = WorkerEnv(task, cpus, threads, self._pull)
        return env

    async def _on_task(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._task_loop is not None
        return await self._task_loop.call(coro)

    async def _task_pool(self) -> Any:
        pool = self._pool
        if pool is None:
            dask_pool = self._worker.rpc
            pool = ConnectionPool(
                serializers=dask_pool.serializers, deserializers=dask_pool.deserializers,
                connection_args=dask_pool.connection_args, timeout=dask_pool.timeout)
            await pool.start()  # never suspends: no second pool can be made meanwhile
            self._pool = pool
        return pool

    async def _pull(self, task: str, step_id: int, key: str) -> tuple[Any, bool]:
        """A cross-task recv (on the task loop): ask the producer's worker."""
        address = self._addresses.get(task)
        if address is None:
            raise errors.UnavailableError(None, None, f"task {task} has no known worker")
        try:
            reply = await (await self._task_pool())(address).asyncflow_recv_tensor(
                task=task, step_id=step_id, key=key)
        except COMM_ERRORS as exc:
            raise unavailable(task, address, exc) from None
        if reply is None:  # Dask's answer to an op without a handler
            raise errors.FailedPreconditionError(
                None, None, f"task {task} (Dask worker {address}) has no asyncflow service: "
                            f"its worker plugin {PLUGIN_NAME!r} was unregistered")
        if not reply["ok"]:
            raise unwire(reply["error"])
        return reply["value"], reply["dead"]

    # -- handlers (on Dask's loop) ----------------------------------------------------------

    async def _h_hello(self, comm: Any, task: str, version: str, protocol: int) -> Any:
        """The handshake: this worker's version, protocol and process token."""
        mine, proto = local_identity()
        return {"version": mine, "protocol": proto, "incarnation": self.incarnation}

    async def _h_ping(self, comm: Any, task: str, sessions: list[str], lease: float) -> Any:
        """Health check and lease renewal of a master's sessions on ``task``."""
        env = self._envs.get(task)
        task_loop = self._task_loop
        if env is not None and sessions and task_loop is not None:
            task_loop.loop.call_soon_threadsafe(env.renew, sessions,
                                                time.monotonic() + lease)
        return _OK

    async def _h_client_gone(self, comm: Any, client: str) -> Any:
        """The scheduler saw a client leave: drop its sessions now (not at lease end)."""
        task_loop = self._task_loop
        if task_loop is not None:
            for env in list(self._envs.values()):
                task_loop.loop.call_soon_threadsafe(env.forget_master, client,
                                                    time.monotonic())
        return _OK

    async def _h_register_graph(self, comm: Any, task: str, incarnation: str, session: str,
                                isolate: bool, cpus: int, lease: float, client: str,
                                addresses: dict[str, str], plans: Any) -> Any:
        if self._stale(incarnation):
            return {"restarted": True}
        self._addresses.update(addresses)
        env = self._env(task, cpus, cpus)

        async def register() -> str:
            handle = env.register_graph(session, isolate, unwire(plans))
            env.renew([session], time.monotonic() + lease, client)
            return handle
        try:
            return {"ok": True, "handle": await self._on_task(register())}
        except errors.OpError as exc:
            return {"ok": False, "error": ToPickle(exc)}

    async def _h_deregister_graph(self, comm: Any, task: str, incarnation: str,
                                  session: str, handle: str) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            async def deregister() -> None:
                try:
                    env.deregister_graph(session, handle)
                except errors.NotFoundError:
                    pass
            await self._on_task(deregister())
        return _OK

    async def _h_close_session(self, comm: Any, task: str, incarnation: str,
                               session: str) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            async def close() -> None:
                env.close_session(session)
            await self._on_task(close())
        return _OK

    async def _h_run_graph(self, comm: Any, task: str, incarnation: str, session: str,
                           handle: str, step_id: int, args: list[Any], trace: bool,
                           name: str) -> Any:
        env = self._envs.get(task)
        if env is None or self._stale(incarnation):
            return {"restarted": True}
        start = time.time()
        try:
            values, stats = await self._on_task(env.run_graph(session, handle, step_id, args,
                                                              trace))
        except errors.OpError as exc:
            self._event(task, name, step_id, start, type(exc).__name__)
            return {"ok": False, "error": ToPickle(exc)}
        self._event(task, name, step_id, start, "ok")
        return {"ok": True, "values": [wire(v) for v in values],
                "stats": None if stats is None else ToPickle(stats)}

    async def _h_recv_tensor(self, comm: Any, task: str, step_id: int, key: str,
                             incarnation: str | None = None) -> Any:
        if incarnation is not None and self._stale(incarnation):
            return {"restarted": True}
        env = self._env(task)
        try:
            value, dead = await self._on_task(env.recv_tensor(step_id, key))
        except errors.OpError as exc:
            return {"ok": False, "error": ToPickle(exc)}
        return {"ok": True, "value": wire(value), "dead": dead}

    async def _h_send_tensor(self, comm: Any, task: str, incarnation: str, step_id: int,
                             key: str, value: Any, dead: bool) -> Any:
        if self._stale(incarnation):
            return {"restarted": True}
        env = self._env(task)

        async def send() -> None:
            env.send_tensor(step_id, key, value, dead)
        await self._on_task(send())
        return _OK

    async def _h_abort_step(self, comm: Any, task: str, incarnation: str, step_id: int,
                            error: Any) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            async def abort() -> None:
                env.abort_step(step_id, unwire(error))
            await self._on_task(abort())
        return _OK

    async def _h_cleanup_step(self, comm: Any, task: str, incarnation: str,
                              step_id: int) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            await self._on_task(env.cleanup_step(step_id))
        return _OK

    async def _h_reset(self, comm: Any, task: str, incarnation: str) -> Any:
        """Clear the task's containers, and drop what masters gone silent left."""
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            async def reset() -> None:
                env.reset(time.monotonic())
            await self._on_task(reset())
        return _OK
