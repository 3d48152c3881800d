"""The worker service inside a Dask worker process: a ``WorkerPlugin`` that adds
asyncflow's handlers to the worker's server and hosts the task's own event loop.

Dask's protocol carries every message; numpy arrays travel as buffers
(``to_serialize``), partitions, errors and step stats with Dask's pickle (cloudpickle,
so ``py_func`` bodies ship too).  The task's work runs on an event loop of its own, in
a thread of its own, so a long step never stalls the worker's heartbeats.

Two servers, both Dask's (``distributed.core.Server``, its protocol and security):

* the Dask worker itself (``worker.handlers``, on Dask's loop) answers ``hello`` (the
  version handshake, which also gives the task service's address), ``ping`` (health
  and lease renewal) and ``client_gone``;
* the **task service**, a ``Server`` listening on a port of its own on the task's
  loop, on asyncflow's comm backend (``aftcp://`` / ``aftls://``, see
  :mod:`asyncflow.distributed._comm`: Dask's comms on asyncio's transports), answers
  everything a step does: ``register_graph``, ``deregister_graph``,
  ``close_session``, ``run_graph``, ``recv_tensor``, ``send_tensor``, ``abort_step``,
  ``cleanup_step`` and ``reset``.  A message is handled where the step runs: no hop
  between threads per message (each hop cost a wake-up of the other loop and a fight
  for the GIL with it, several times a step), and pushes to peers leave through the
  service's own connection pool, one way (``send_tensor`` without an answer: the
  consumer's own run reports the step).

A push means a consumer may hold every input of a step before it runs it.  A task
whose whole process stood still (SIGSTOP, a frozen VM) past its master's health
timeout was given up on by that master, yet finds that step's run and pushed values
in its sockets when it resumes: it must not run it (its writes would land after the
session reported the step failed).  So each task notes when its process stood still
(:class:`Stalls`: a watchdog thread, and every ping and handshake), numbering each
stall; pings and the handshake tell masters the number, each ``run_graph`` carries
the number its master knew when it sent it and its health timeout, and a run that
was sent before a stall at least that long is answered ``AbortedError``, not run.

Step-time handlers take ``task`` (the task name the master assigned to this worker)
and ``incarnation``, the token of the worker process the master shook hands with: a
different token means the worker restarted (its state is gone) and the reply says
``restarted`` instead of failing on state that is not there.  Every handler answers
with a dict, so Dask's ``None`` for an op without a handler (asyncflow missing, or its
plugin unregistered) is told apart.  Removing the plugin stops the task service and
says so on the worker's event topic, so masters stop calling it at once.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, TypeVar

import numpy as np
from distributed import WorkerPlugin
from distributed.comm.addressing import (
    get_address_host,
    parse_address,
    parse_host_port,
    unparse_host_port,
)
from distributed.comm.core import CommClosedError
from distributed.core import ConnectionPool, Status, send_recv
from distributed.core import Server as _Server
from distributed.protocol.serialize import ToPickle, to_serialize
from tornado.ioloop import PeriodicCallback

import asyncflow
from asyncflow import errors
from asyncflow.distributed._comm import service_scheme
from asyncflow.distributed.worker import WorkerEnv
from asyncflow.runtime.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, raise_to

__all__ = [
    "EVENT_TOPIC",
    "PLUGIN_NAME",
    "PROTOCOL",
    "SERVICE_STOPPED",
    "AsyncflowWorker",
    "abandon_pool",
    "close_pool",
    "closing_with",
    "local_identity",
    "send",
    "unavailable",
    "unwire",
    "unwire_value",
    "wire",
]

PLUGIN_NAME = "asyncflow"
#: The topic of the events each remote partition run logs on the scheduler.
EVENT_TOPIC = "asyncflow"
#: The wire protocol between masters and workers: bumped whenever a handler's
#: arguments or replies change, so mismatched installs fail at registration.
PROTOCOL = 6
#: The action of the event a worker logs on its own topic (its address) when its task
#: service stops (the plugin was removed): masters stop calling it at once.
SERVICE_STOPPED = "asyncflow-service-stopped"
#: How often a task looks for sessions whose master's lease ran out.
_LEASE_CHECK_S = 0.25
#: How often the runs of the last interval are logged on the scheduler (one event per
#: step name and status: a step a millisecond must not cost a message each).
_EVENTS_EVERY_MS = 200
#: The ops the task service answers on the task's loop.
_SERVICE_OPS = (
    "register_graph",
    "deregister_graph",
    "close_session",
    "run_graph",
    "recv_tensor",
    "send_tensor",
    "abort_step",
    "cleanup_step",
    "reset",
)
_OK: dict[str, Any] = {"ok": True}
#: How often the watchdog looks at the clock, and the shortest stand-still it notes.
_WATCH_TICK_S = 0.1
_STALL_S = 0.5
#: A run sent before a stall this long (times its master's health timeout) is dropped:
#: its master gave up on the task after that timeout without an answer to a ping.
_GIVEN_UP = 0.75
#: How many stalls a task remembers.
_STALLS_KEPT = 64
#: In a worker hosting a task, blocks below this come from the heap, and this much free
#: heap top is kept (see ``setup``).
_MALLOC_THRESHOLDS = 1 << 20


def local_identity() -> tuple[str, int]:
    """(asyncflow version, wire protocol) of this process (read at call time)."""
    return str(asyncflow.__version__), PROTOCOL


T = TypeVar("T")

#: Dask's ``Server``, untyped: the task service is one.
_DaskServer: Any = _Server

#: Connection failures that mean "the peer process is gone".
COMM_ERRORS = (CommClosedError, OSError)


async def send(pool: Any, address: str, op: str, *, reply: bool = True, **msg: Any) -> Any:
    """``pool(address).<op>(**msg)`` (Dask's pooled call) on a comm that serializes in
    place: Dask's own first walks the whole message with ``sizeof`` to decide whether
    to serialize it on a thread, ~40 us for a ``run_graph``, ten times msgpack's cost;
    asyncflow's messages are small or carry numpy buffers, never worth a thread.
    ``reply=False``: one way, nothing read back (None).  A pool that is no
    :class:`ConnectionPool` (a test's stand-in) is called as Dask's would be."""
    if not isinstance(pool, ConnectionPool):
        return await getattr(pool(address), op)(reply=reply, **msg)
    comm = await _connect(pool, address)
    comm.allow_offload = False
    try:
        return await send_recv(
            comm,
            op=op,
            reply=reply,
            serializers=pool.serializers,
            deserializers=pool.deserializers,
            **msg,
        )
    finally:
        pool.reuse(address, comm)


#: Connects whose callers were cancelled, still finishing for their pool (pool → tasks).
_ORPHANS: weakref.WeakKeyDictionary[ConnectionPool, set[asyncio.Task[Any]]] = (
    weakref.WeakKeyDictionary()
)
#: How long closing a pool waits for those connects before it cancels them.
_ORPHAN_WAIT_S = 5.0


async def _connect(pool: ConnectionPool, address: str) -> Any:
    """``pool.connect(address)`` that never loses a socket to its caller's cancellation.

    Tornado hands the connected stream over by resolving a future; a cancellation
    that lands after that but before the awaiting task resumes (a deadline and the
    connect completing in the same loop iteration, common on a loaded machine) drops
    the stream, and its socket stays open, out of every pool, until the loop is
    collected.  So the connect runs as a task of its own the caller only waits for:
    the caller's cancellation propagates at once, and the connect, which nobody can
    cancel in that window, gives its comm to the pool (:func:`_adopt`).  The pool's
    connect timeout bounds it; :func:`close_pool` waits for it.

    With an open idle comm to ``address`` the pool hands one over without suspending
    (nothing to lose, nothing to cancel): that, the common case, needs no task (a
    task and a shield cost ~10 % of a loopback round trip).
    """
    idle: Any = pool.available.get(address, ())  # (Dask's Comm is untyped)
    if any(not comm.closed() for comm in idle):
        return await pool.connect(address)
    connecting = asyncio.ensure_future(pool.connect(address))
    try:
        return await asyncio.shield(connecting)
    except asyncio.CancelledError:
        if connecting.done():
            _adopt(pool, address, connecting)
        else:
            _ORPHANS.setdefault(pool, set()).add(connecting)
            connecting.add_done_callback(functools.partial(_adopt, pool, address))
        raise


def _adopt(pool: ConnectionPool, address: str, connecting: asyncio.Task[Any]) -> None:
    """A cancelled caller's connect finished: its comm is idle (nothing was sent on
    it), so the pool keeps it for the next call, or closes it if the pool closed."""
    orphans = _ORPHANS.get(pool)
    if orphans is not None:
        orphans.discard(connecting)
    if connecting.cancelled() or connecting.exception() is not None:
        return  # nothing connected (the caller was already told, by its cancellation)
    comm = connecting.result()
    if pool.status == Status.running:
        pool.reuse(address, comm)
        return
    pool.occupied[address].discard(comm)  # (``reuse`` would keep it in a closed pool)
    comm.abort()


async def close_pool(pool: ConnectionPool) -> None:
    """Close ``pool`` on its loop, once the connects of cancelled callers finished
    (bounded: those still connecting after ``_ORPHAN_WAIT_S`` are cancelled)."""
    orphans = _ORPHANS.pop(pool, set())
    if orphans:
        await asyncio.wait(orphans, timeout=_ORPHAN_WAIT_S)
    for connecting in orphans:
        connecting.cancel()
    await pool.close()
    if orphans:
        await asyncio.wait(orphans)


def abandon_pool(pool: ConnectionPool) -> None:
    """Close ``pool`` at once, without waiting (on its loop, or with its loop
    stopped): every comm aborted, a connect still finishing closes its own."""
    pool.status = Status.closed
    comms: list[Any] = [c for d in (pool.available, pool.occupied) for cs in d.values() for c in cs]
    for comm in comms:
        comm.abort()


async def closing_with(pool: ConnectionPool) -> AsyncGenerator[None, None]:
    """Held open while ``pool`` serves its loop; asyncio closes it before the loop
    closes (``shutdown_asyncgens``), and closing it aborts the pool's comms there.
    Advance it once on the loop to register it."""
    try:
        yield
    finally:
        abandon_pool(pool)


def unavailable(task: str, address: str, exc: BaseException) -> errors.UnavailableError:
    return errors.UnavailableError(
        None,
        None,
        f"task {task} (Dask worker {address}) is unavailable: {type(exc).__name__}: {exc}",
    )


#: Numeric arrays and scalars up to this size travel inside the message itself.
_INLINE_BYTES = 16384
_INLINE_KINDS = frozenset("biufc")
#: The key of an inlined value (a plain dict: Dask's msgpack carries it as is).
_INLINE = "__asyncflow_nd__"


def wire(value: Any) -> Any:
    """A value as it travels: a small numeric array or scalar as its bytes inside the
    message (Dask's serializers cost ~25 µs for an 8-byte scalar, more than the rest
    of its trip), larger arrays as buffers (no copy), anything else pickled.
    The receiver calls :func:`unwire_value`."""
    if (
        isinstance(value, (np.ndarray, np.generic))
        and value.dtype.kind in _INLINE_KINDS
        and value.nbytes <= _INLINE_BYTES
    ):
        return {
            _INLINE: (value.dtype.str, value.shape, value.tobytes(), isinstance(value, np.generic))
        }
    return to_serialize(value)  # type: ignore[no-untyped-call]


def unwire_value(value: Any) -> Any:
    """A value as :func:`wire` sent it."""
    if type(value) is dict and _INLINE in value:
        dtype, shape, data, scalar = value[_INLINE]
        array = np.frombuffer(data, np.dtype(dtype)).reshape(shape)
        return array[()] if scalar else array.copy()  # (writable, as the sender's)
    return value


def unwire(value: Any) -> Any:
    return value.data if isinstance(value, ToPickle) else value


def _drop(env: WorkerEnv, step_id: int, error: errors.OpError) -> None:
    """Stop step ``step_id`` on ``env`` with ``error`` and forget it (a late push for
    it is dropped)."""
    env.abort_step(step_id, error)
    env.rendezvous.cleanup(step_id)


class Stalls:
    """When this process stood still: a stall is a gap of at least ``_STALL_S``
    between two looks at the monotonic clock (a watchdog thread looks every
    ``_WATCH_TICK_S``; pings and handshakes look too, so the first message after a
    resume already sees it).  Stalls are numbered (:attr:`epoch`) and their lengths
    kept, so a message can say which stalls its sender knew of."""

    __slots__ = ("_last", "_lengths", "_lock", "_stop", "_thread", "epoch")

    def __init__(self) -> None:
        self.epoch = 0
        self._last = time.monotonic()
        self._lengths: dict[int, float] = {}
        # One stall is numbered once, whichever thread sees it first.
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def __reduce__(self) -> tuple[type[Stalls], tuple[()]]:
        return Stalls, ()  # a copy (the plugin shipped to a worker) starts afresh

    def observe(self, now: float | None = None) -> int:
        """Look at the clock (any thread); the current stall number."""
        with self._lock:
            if now is None:
                now = time.monotonic()
            gap, self._last = now - self._last, max(self._last, now)
            if gap >= _STALL_S:
                self.epoch += 1
                self._lengths[self.epoch] = gap
                if len(self._lengths) > _STALLS_KEPT:
                    del self._lengths[min(self._lengths)]
            return self.epoch

    def since(self, epoch: int) -> float:
        """The longest stall after stall number ``epoch`` (0.0: none)."""
        self.observe()
        with self._lock:
            return max((n for e, n in self._lengths.items() if e > epoch), default=0.0)

    def start(self, name: str) -> None:
        """Start the watchdog thread (in the worker: the plugin is pickled before)."""
        self._last = time.monotonic()
        stop = self._stop = threading.Event()

        def watch() -> None:
            while not stop.wait(_WATCH_TICK_S):
                self.observe()

        self._thread = threading.Thread(target=watch, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread (it ends within one tick)."""
        stop, thread, self._stop, self._thread = self._stop, self._thread, None, None
        if stop is not None and thread is not None:
            stop.set()
            thread.join()


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
        self._addresses: dict[str, str] = {}  # task → its task service's address
        self._worker: Any = None
        self._task_loop: _TaskLoop | None = None
        self._server: Any = None  # the task service (a Dask Server on the task loop)
        #: The task service's address (given to masters by the handshake).
        self.service = ""
        # Partition runs not logged yet: (task, step name, step id, start, stop, status),
        # appended on the task loop, drained on Dask's.
        self._runs: collections.deque[tuple[str, str, int, float, float, str]] = collections.deque()
        self._flusher: PeriodicCallback | None = None
        self._serving: asyncio.Future[str] | None = None  # the service starting
        #: This worker process's token (made by ``setup``, in the worker: the plugin is
        #: pickled by the client): a master holding another one talks to a worker that
        #: restarted (or whose plugin was installed again).
        self.incarnation = ""
        #: When this process stood still (its watchdog runs from ``setup``).
        self.stalls = Stalls()
        #: (task, step id) → (the stall number its master knew when it sent the step,
        #: its master's health timeout), while the step runs here.
        self._sent: dict[tuple[str, int], tuple[int, float]] = {}

    # -- lifecycle ------------------------------------------------------------------------

    async def setup(self, worker: Any) -> None:
        # Dask's nanny sets MALLOC_TRIM_THRESHOLD_ (64 KiB), which also freezes glibc's
        # mmap threshold at 128 KiB: msgpack's 256 KiB packing buffer was mapped and
        # unmapped for every message the task packed, or, from the heap, given back and
        # faulted in again (Dask's dumps: 8.5-10.8 us on the task's loop, 1.3 with both
        # thresholds at 1 MiB; see asyncflow.runtime.malloc).
        raise_to(M_MMAP_THRESHOLD, _MALLOC_THRESHOLDS)
        raise_to(M_TRIM_THRESHOLD, _MALLOC_THRESHOLDS)
        self._worker = worker
        self.incarnation = uuid.uuid4().hex
        self.stalls.start(f"asyncflow-watchdog-{worker.address}")
        self._task_loop = _TaskLoop(f"asyncflow-task-{worker.address}")
        self._task_loop.loop.call_soon_threadsafe(self._check_leases)
        # Handlers first: a handshake arriving while the service starts waits for it
        # (Dask may answer the plugin's registration before every setup finished).
        self._serving = asyncio.ensure_future(self._task_loop.call(self._serve(worker)))
        for name in ("hello", "ping", "client_gone"):
            worker.handlers[f"asyncflow_{name}"] = getattr(self, f"_h_{name}")
        self.service = await self._serving
        self._flusher = PeriodicCallback(self._flush_events, _EVENTS_EVERY_MS)
        self._flusher.start()

    async def _serve(self, worker: Any) -> str:
        """Start the task service on the task loop (where it runs); its address.

        It listens on the host the worker listens on, on a free port, with the
        worker's security (TLS when the worker uses it); it is reached at the host the
        worker is reached at.
        """
        handlers = {f"asyncflow_{op}": getattr(self, f"_h_{op}") for op in _SERVICE_OPS}
        server = _DaskServer(
            handlers,
            connection_args=worker.connection_args,
            local_directory=worker.local_directory,
            needs_workdir=False,
        )
        await server
        scheme, loc = parse_address(worker.listener.listen_address)
        scheme = service_scheme(scheme)
        host, _ = parse_host_port(loc)
        await server.listen(  # (allow_offload: as for ``send``, no sizeof per message)
            f"{scheme}://{unparse_host_port(host, 0)}",
            allow_offload=False,
            **worker.security.get_listen_args("worker"),
        )
        self._server = server
        return f"{scheme}://{unparse_host_port(get_address_host(worker.address), server.port)}"

    async def teardown(self, worker: Any) -> None:
        for name in list(worker.handlers):
            if name.startswith("asyncflow_"):
                del worker.handlers[name]
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.stop()
            self._flush_events()
        task_loop, self._task_loop = self._task_loop, None
        if task_loop is not None:
            envs, self._envs = list(self._envs.values()), {}
            server, self._server = self._server, None
            if server is not None:
                await task_loop.call(server.close())
            # Masters calling the service stop now (the worker may live on without it).
            worker.log_event(
                worker.address, {"action": SERVICE_STOPPED, "incarnation": self.incarnation}
            )
            # Joining threads would block Dask's loop: done on a thread of its own.
            await asyncio.to_thread(task_loop.stop)
            for env in envs:
                await asyncio.to_thread(env.close)
        await asyncio.to_thread(self.stalls.stop)

    # -- plumbing -------------------------------------------------------------------------

    def _check_leases(self) -> None:
        """Drop the sessions of masters gone silent, and the steps given up on while
        this process stood still (task loop, every quarter second)."""
        now = time.monotonic()
        for env in list(self._envs.values()):
            env.expire(now)
        for (task, step_id), sent in list(self._sent.items()):
            error = self._given_up(task, step_id, sent)
            running = self._envs.get(task)
            if error is not None and running is not None:
                _drop(running, step_id, error)
        task_loop = self._task_loop
        if task_loop is not None:
            task_loop.loop.call_later(_LEASE_CHECK_S, self._check_leases)

    def _event(self, task: str, name: str, step_id: int, start: float, status: str) -> None:
        """Note a partition run (task loop: a deque append, nothing sent)."""
        self._runs.append((task, name, step_id, start, time.time(), status))

    def _flush_events(self) -> None:
        """Log the runs noted since the last flush on Dask's scheduler (Dask's loop):
        one event per task, step name and status (topic ``asyncflow``, shown by the
        dashboard and ``Client.get_events``) with how many runs, their step ids and
        the first start and last stop."""
        runs = self._runs
        if not runs:
            return
        summary: dict[tuple[str, str, str], dict[str, Any]] = {}
        for _ in range(len(runs)):
            task, name, step_id, start, stop, status = runs.popleft()
            event = summary.get((task, name, status))
            if event is None:
                summary[(task, name, status)] = {
                    "action": "run_graph",
                    "step": name,
                    "task": task,
                    "status": status,
                    "runs": 1,
                    "step_ids": [step_id],
                    "start": start,
                    "stop": stop,
                }
            else:
                event["runs"] += 1
                event["step_ids"].append(step_id)
                event["stop"] = stop
        for event in summary.values():
            self._worker.log_event(EVENT_TOPIC, event)

    def _given_up(
        self, task: str, step_id: int, sent: tuple[int, float]
    ) -> errors.AbortedError | None:
        """Why step ``step_id`` must not run (on) here: this process stood still long
        enough after its master sent it for the master to give up on the task (the
        step already failed for its caller); None when it may."""
        stalled = self.stalls.since(sent[0])
        if stalled < _GIVEN_UP * sent[1]:
            return None
        return errors.AbortedError(
            None,
            None,
            f"task {task} stood still for {stalled:.1f} s (a stopped or frozen "
            f"process) after step {step_id} was sent to it, and its session gave up "
            f"on it: the step is dropped there, not run",
        )

    def _stale(self, incarnation: str) -> bool:
        return incarnation != self.incarnation

    def _env(self, task: str, cpus: int = 1, threads: int = 1) -> WorkerEnv:
        env = self._envs.get(task)
        if env is None:
            env = self._envs[task] = WorkerEnv(task, cpus, threads, self._push)
        return env

    async def _push(self, task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        """A cross-task send (on the task loop): hand the value to the consumer's
        worker, one way (its run, not an answer to this, reports the step)."""
        address = self._addresses.get(task)
        if address is None:
            raise errors.UnavailableError(None, None, f"task {task} has no known worker")
        server = self._server
        if server is None:
            raise errors.UnavailableError(None, None, f"the service of task {task}'s peer stopped")
        try:
            await send(
                server.rpc,
                address,
                "asyncflow_send_tensor",
                reply=False,
                task=task,
                step_id=step_id,
                key=key,
                value=wire(value),
                dead=dead,
            )
        except COMM_ERRORS as exc:
            raise unavailable(task, address, exc) from None

    # -- handlers on Dask's loop --------------------------------------------------------------

    async def _h_hello(self, comm: Any, task: str, version: str, protocol: int) -> Any:
        """The handshake: this worker's version, protocol, process token and the
        address of its task service."""
        mine, proto = local_identity()
        if self._serving is not None:
            await asyncio.shield(self._serving)
        return {
            "version": mine,
            "protocol": proto,
            "incarnation": self.incarnation,
            "service": self.service,
            "epoch": self.stalls.observe(),
        }

    async def _h_ping(self, comm: Any, task: str, sessions: list[str], lease: float) -> Any:
        """Health check and lease renewal of a master's sessions on ``task``."""
        env = self._envs.get(task)
        task_loop = self._task_loop
        if env is not None and sessions and task_loop is not None:
            task_loop.loop.call_soon_threadsafe(env.renew, sessions, time.monotonic() + lease)
        return {"ok": True, "epoch": self.stalls.observe()}

    async def _h_client_gone(self, comm: Any, client: str) -> Any:
        """The scheduler saw a client leave: drop its sessions now (not at lease end)."""
        task_loop = self._task_loop
        if task_loop is not None:
            for env in list(self._envs.values()):
                task_loop.loop.call_soon_threadsafe(env.forget_master, client, time.monotonic())
        return _OK

    # -- the task service's handlers (on the task loop) ------------------------------------

    async def _h_register_graph(
        self,
        comm: Any,
        task: str,
        incarnation: str,
        session: str,
        isolate: bool,
        cpus: int,
        lease: float,
        client: str,
        addresses: dict[str, str],
        plans: Any,
    ) -> Any:
        if self._stale(incarnation):
            return {"restarted": True}
        self._addresses.update(addresses)
        env = self._env(task, cpus, cpus)
        try:
            handle = env.register_graph(session, isolate, unwire(plans))
        except errors.OpError as exc:
            return {"ok": False, "error": ToPickle(exc)}
        env.renew([session], time.monotonic() + lease, client)
        return {"ok": True, "handle": handle}

    async def _h_deregister_graph(
        self, comm: Any, task: str, incarnation: str, session: str, handle: str
    ) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            try:
                env.deregister_graph(session, handle)
            except errors.NotFoundError:
                pass
        return _OK

    async def _h_close_session(self, comm: Any, task: str, incarnation: str, session: str) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            env.close_session(session)
        return _OK

    async def _h_run_graph(
        self,
        comm: Any,
        task: str,
        incarnation: str,
        session: str,
        handle: str,
        step_id: int,
        args: list[Any],
        trace: bool,
        name: str,
        epoch: int,
        health: float,
    ) -> Any:
        env = self._envs.get(task)
        if env is None or self._stale(incarnation):
            return {"restarted": True}
        start = time.time()
        sent = (epoch, health)
        error = self._given_up(task, step_id, sent)
        if error is not None:
            env.rendezvous.cleanup(step_id)  # (its pushed values, and any late one)
            self._event(task, name, step_id, start, "AbortedError")
            return {"ok": False, "error": ToPickle(error)}
        self._sent[(task, step_id)] = sent
        try:
            values, stats = await env.run_graph(
                session, handle, step_id, [unwire_value(a) for a in args], trace
            )
        except errors.OpError as exc:
            self._event(task, name, step_id, start, type(exc).__name__)
            return {"ok": False, "error": ToPickle(exc)}
        finally:
            self._sent.pop((task, step_id), None)
        self._event(task, name, step_id, start, "ok")
        return {
            "ok": True,
            "values": [wire(v) for v in values],
            "stats": None if stats is None else ToPickle(stats),
        }

    async def _h_recv_tensor(
        self, comm: Any, task: str, step_id: int, key: str, incarnation: str | None = None
    ) -> Any:
        if incarnation is not None and self._stale(incarnation):
            return {"restarted": True}
        env = self._env(task)
        try:
            value, dead = await env.recv_tensor(step_id, key)
        except errors.OpError as exc:
            return {"ok": False, "error": ToPickle(exc)}
        return {"ok": True, "value": wire(value), "dead": dead}

    async def _h_send_tensor(
        self,
        comm: Any,
        task: str,
        step_id: int,
        key: str,
        value: Any,
        dead: bool,
        incarnation: str | None = None,
    ) -> Any:
        if incarnation is not None and self._stale(incarnation):
            return {"restarted": True}
        env = self._env(task)
        sent = self._sent.get((task, step_id))
        if sent is not None:  # its run started here: maybe before this process stood still
            error = self._given_up(task, step_id, sent)
            if error is not None:
                _drop(env, step_id, error)
                return _OK
        env.send_tensor(step_id, key, unwire_value(value), dead)
        return _OK

    async def _h_abort_step(
        self, comm: Any, task: str, incarnation: str, step_id: int, error: Any
    ) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            env.abort_step(step_id, unwire(error))
        return _OK

    async def _h_cleanup_step(self, comm: Any, task: str, incarnation: str, step_id: int) -> Any:
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            await env.cleanup_step(step_id)
        return _OK

    async def _h_reset(self, comm: Any, task: str, incarnation: str) -> Any:
        """Clear the task's containers, and drop what masters gone silent left."""
        env = self._envs.get(task)
        if env is not None and not self._stale(incarnation):
            env.reset(time.monotonic())
        return _OK
