"""The worker side of distributed execution, driven in process (no Dask cluster).

Two :class:`WorkerEnv` tasks share this test's event loop; a cross-task ``_Send``
pushes into the consumer's env directly, as the Dask transport does over comms.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.ir import graph_ir, ref_of
from asyncflow.compiler.pipeline import compile_signature

pytest.importorskip("distributed")

from asyncflow.distributed.rendezvous import LOCAL_TASK, RemoteRendezvous, task_of
from asyncflow.distributed.worker import RendezvousMgr, WorkerEnv

A = "/job:worker/replica:0/task:0"
B = "/job:worker/replica:0/task:1"
DEVICES = [f"{LOCAL_TASK}/device:CPU:0", f"{A}/device:CPU:0", f"{B}/device:CPU:0"]


class Tasks:
    """Two in-process tasks whose pushes call each other's ``send_tensor``."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, str]] = []
        self.envs = {t: WorkerEnv(t, 1, 1, self.push) for t in (A, B)}

    async def push(self, task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        self.pushes.append((task, key))
        self.envs[task].send_tensor(step_id, key, value, dead)

    def register(
        self, g: af.Graph, fetches: list[Any], session: str = "s", isolate: bool = False
    ) -> tuple[dict[str, str], Any]:
        compiled = compile_signature(  # L0: the graphs' constants must cross tasks
            graph_ir(g),
            feeds=[],
            fetches=[ref_of(t) for t in fetches],
            targets=[],
            devices=DEVICES,
            incarnation=7,
            client_device=False,  # as the master compiles
            options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0),
        )
        handles = {}
        for task in (A, B):
            plans = [p for p in compiled.plans if task_of(p.device) == task]
            handles[task] = self.envs[task].register_graph(session, isolate, plans)
        return handles, compiled

    async def run(
        self, handles: dict[str, str], step_id: int, session: str = "s"
    ) -> dict[str, list[Any]]:
        try:
            async with asyncio.TaskGroup() as tg:
                runs = {
                    t: tg.create_task(self.envs[t].run_graph(session, h, step_id, []))
                    for t, h in handles.items()
                }
        except ExceptionGroup as group:
            raise group.exceptions[0] from None
        return {t: r.result()[0] for t, r in runs.items()}

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


def _two_task_graph() -> tuple[af.Graph, Any]:
    g = af.Graph()
    with g.as_default():
        with af.device("/job:worker/task:0"):
            a = af.constant(np.arange(3.0), name="a") * 2.0
        with af.device("/job:worker/task:1"):
            b = af.reduce_sum(a, name="b")
    return g, b


async def test_a_cross_task_send_is_pushed_to_the_consumer() -> None:
    tasks = Tasks()
    g, b = _two_task_graph()
    handles, _ = tasks.register(g, [b])
    out = await tasks.run(handles, step_id=1)
    assert out[B] == [6.0]
    assert out[A] == []
    assert [t for t, _ in tasks.pushes] == [B]  # one message, producer to consumer
    # Both tasks forgot the step: it succeeded and every value was taken.
    assert len(tasks.envs[A].rendezvous) == len(tasks.envs[B].rendezvous) == 0
    out = await tasks.run(handles, step_id=2)  # registered once, run again
    assert out[B] == [6.0]
    tasks.close()


async def test_a_late_pull_for_a_finished_step_fails_at_once() -> None:
    mgr = RendezvousMgr(A, push=None)  # type: ignore[arg-type]
    mgr.find_or_create(5)
    mgr.cleanup(5)
    rdv = mgr.find_or_create(5)
    assert rdv.aborted is not None
    with pytest.raises(af.errors.AbortedError, match="step 5 is over"):
        await rdv.local_recv_future("k")


async def test_failure_on_one_task_names_it_and_aborts_the_peer_pull() -> None:
    def boom(v: np.ndarray) -> np.ndarray:
        raise ValueError("no good")

    g = af.Graph()
    with g.as_default():
        with af.device("/job:worker/task:0"):
            a = af.py_func(boom, [af.constant(1.0)], af.float32, name="boom")
        with af.device("/job:worker/task:1"):
            b = af.identity(a, name="b")
    tasks = Tasks()
    handles, _ = tasks.register(g, [b])
    envs = tasks.envs
    run_a = envs[A].run_graph("s", handles[A], 3, [])
    run_b = asyncio.ensure_future(envs[B].run_graph("s", handles[B], 3, []))
    with pytest.raises(af.errors.InvalidArgumentError) as info:
        await run_a
    assert info.value.node_name == "boom"
    assert f"(on task {A})" in info.value.message
    # The session would now abort the step everywhere: B's pending pull fails.
    envs[A].abort_step(3, info.value)
    await envs[B].cleanup_step(3)
    with pytest.raises(af.errors.OpError, match=B):
        await run_b
    await envs[A].cleanup_step(3)
    assert len(envs[A].rendezvous) == len(envs[B].rendezvous) == 0
    tasks.close()


async def test_cleanup_stops_a_step_still_running() -> None:
    async def forever(v: np.ndarray) -> np.ndarray:
        await asyncio.sleep(60)
        return v

    g = af.Graph()
    with g.as_default(), af.device("/job:worker/task:0"):
        hang = af.py_func(forever, [af.constant(1.0)], af.float32, name="hang")
    tasks = Tasks()
    handles, _ = tasks.register(g, [hang])
    run = asyncio.ensure_future(tasks.envs[A].run_graph("s", handles[A], 9, []))
    await asyncio.sleep(0.01)
    await tasks.envs[A].cleanup_step(9)  # returns once the step stopped
    assert run.done()
    with pytest.raises(af.errors.CancelledError):
        await run
    tasks.close()


async def test_state_shared_per_task_unless_isolated() -> None:
    g = af.Graph()
    with g.as_default(), af.device("/job:worker/task:0"):
        v = af.Variable(np.float32(1.0), name="v")
        bump = v.assign_add(np.float32(1.0))
    tasks = Tasks()
    env = tasks.envs[A]
    init = env.register_graph(
        "s1",
        False,
        list(
            compile_signature(
                graph_ir(g),
                feeds=[],
                fetches=[],
                targets=[v.initializer.name],
                devices=DEVICES,
                incarnation=1,
            ).plans
        ),
    )
    await env.run_graph("s1", init, 1, [])
    shared, _ = tasks.register(g, [bump], session="s2")
    assert (await tasks.run(shared, 2, session="s2"))[A] == [2.0]
    isolated, _ = tasks.register(g, [bump], session="s3", isolate=True)
    with pytest.raises(af.errors.FailedPreconditionError, match="v"):
        await tasks.run(isolated, 3, session="s3")
    env.reset()
    with pytest.raises(af.errors.FailedPreconditionError, match="v"):
        await tasks.run(shared, 4, session="s2")
    tasks.close()


async def test_unknown_graph_handle_names_the_task() -> None:
    tasks = Tasks()
    with pytest.raises(af.errors.NotFoundError, match=f"session 'nope' is unknown on task {A}"):
        await tasks.envs[A].run_graph("nope", "graph_1", 1, [])
    tasks.close()


async def test_the_session_side_pushes_and_pulls() -> None:
    pushed: list[tuple[str, str, Any]] = []

    async def push(task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        pushed.append((task, key, value))

    async def pull(task: str, step_id: int, key: str) -> tuple[Any, bool]:
        return np.float32(4.0), False

    rdv = RemoteRendezvous(LOCAL_TASK, 1, pull, push)
    to_a = f"{DEVICES[0]};0000000000000007;{DEVICES[1]};x:0;0:0"
    from_a = f"{DEVICES[1]};0000000000000007;{DEVICES[0]};y:0;0:0"
    local = f"{DEVICES[0]};0000000000000007;{DEVICES[0]};z:0;0:0"
    async with asyncio.TaskGroup() as tg:
        rdv.attach(tg)
        rdv.send(to_a, 1.5)
        rdv.send(local, 2.5)
        got = await rdv.recv_future(from_a)
        rdv.attach(None)
    assert pushed == [(A, to_a, 1.5)]
    assert got == (np.float32(4.0), False)
    assert rdv.recv_nowait(local) == (2.5, False)


async def test_a_dead_task_ends_calls_in_flight_to_it() -> None:
    # The master's view of a cluster, without Dask: a call to a task that hangs (as a
    # connect to a dead address does, retrying) ends as soon as the task is declared
    # gone, from any thread; calls to other tasks are not touched.
    from asyncflow.distributed.cluster import Cluster

    started = asyncio.Event()

    class Hanging:
        async def asyncflow_run_graph(self, **kwargs: Any) -> Any:
            started.set()
            await asyncio.sleep(60)

    class Client:
        def rpc(self, address: str) -> Hanging:
            return Hanging()

    cluster = Cluster({"worker": 2})
    cluster.client = Client()
    cluster.assignment = {A: "tcp://a", B: "tcp://b"}
    cluster.service = {A: "tcp://a:1", B: "tcp://b:1"}
    cluster._incarnation = {A: "a1", B: "b1"}
    cluster._loop = asyncio.get_running_loop()
    lost: list[str] = []
    cluster.add_watcher(lambda task, error: lost.append(task))
    call_a = asyncio.ensure_future(cluster.rpc(A, "run_graph"))
    call_b = asyncio.ensure_future(cluster.rpc(B, "run_graph"))
    await started.wait()
    await asyncio.to_thread(cluster.mark_unavailable, A, "killed")
    with pytest.raises(af.errors.UnavailableError, match=f"task {A} .* killed"):
        await call_a
    assert lost == [A]
    assert not call_b.done()
    with pytest.raises(af.errors.UnavailableError, match="killed"):
        await cluster.rpc(A, "run_graph")  # later calls fail before sending anything
    call_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call_b  # the caller's own cancellation stays a cancellation


def test_small_values_travel_inside_the_message() -> None:
    # An 8-byte scalar through Dask's serializers costs more than the rest of its trip:
    # small numeric values are their bytes in the message, and come back as they were.
    from distributed.protocol.core import dumps, loads

    from asyncflow.distributed._dask import unwire_value, wire

    for value in (
        np.float64(4.0),
        np.bool_(True),
        np.array(2.5, np.float32),
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.array([1 + 2j]),
    ):
        frames = dumps({"value": wire(value)})
        assert len(frames) == 1  # no serialized sub-frames: no pickle, no header
        back = unwire_value(loads(frames)["value"])  # type: ignore[no-untyped-call]
        assert type(back) is type(value)
        assert back.dtype == value.dtype
        assert back.shape == value.shape
        assert np.array_equal(back, value)
        if isinstance(back, np.ndarray):
            back[...] = 0  # writable, as the sender's was
    for other in ("text", np.array(["a"], object), np.zeros(1 << 20, np.float32)):
        assert not isinstance(wire(other), dict)  # pickled or buffers, as before


def test_partition_runs_are_logged_as_one_event_per_step_and_interval() -> None:
    from asyncflow.distributed._dask import EVENT_TOPIC, AsyncflowWorker

    logged: list[tuple[str, dict[str, Any]]] = []

    class Worker:
        def log_event(self, topic: str, msg: dict[str, Any]) -> None:
            logged.append((topic, msg))

    plugin = AsyncflowWorker()
    plugin._worker = Worker()
    for step_id in (1, 2, 3):
        plugin._event(A, "y:0", step_id, float(step_id), "ok")
    plugin._event(A, "y:0", 4, 4.0, "InvalidArgumentError")
    plugin._event(B, "z:0", 5, 5.0, "ok")
    assert logged == []  # a run costs nothing but a note
    plugin._flush_events()
    assert [topic for topic, _ in logged] == [EVENT_TOPIC] * 3
    events = {(e["task"], e["step"], e["status"]): e for _, e in logged}
    ok = events[(A, "y:0", "ok")]
    assert (ok["action"], ok["runs"], ok["step_ids"], ok["start"]) == (
        "run_graph",
        3,
        [1, 2, 3],
        1.0,
    )
    assert ok["stop"] >= ok["start"]
    assert events[(A, "y:0", "InvalidArgumentError")]["runs"] == 1
    assert events[(B, "z:0", "ok")]["step_ids"] == [5]
    plugin._flush_events()
    assert len(logged) == 3  # nothing new: nothing logged


def test_arrays_travel_as_buffers_not_pickles() -> None:
    from distributed.protocol.serialize import serialize_and_split

    from asyncflow.distributed._dask import wire

    array = np.arange(1 << 16, dtype=np.float32)
    header, frames = serialize_and_split(wire(array))  # type: ignore[no-untyped-call]
    assert header["serializer"] == "dask"  # Dask's numpy serializer, not pickle
    # The frame is the array's own memory: no copy, no pickle of the data.
    assert any(np.shares_memory(np.frombuffer(f, np.uint8), array) for f in frames)


async def test_reset_drops_what_masters_past_their_lease_left() -> None:
    g, b = _two_task_graph()
    tasks = Tasks()
    handles, _ = tasks.register(g, [b], session="gone")
    tasks.register(g, [b], session="alive")
    env = tasks.envs[A]
    env.renew(["gone"], 10.0)
    env.renew(["alive"], 30.0)
    env.reset(now=20.0)  # the lease of "gone" ended at 10.0: its master is gone
    assert [ws.handle for ws in env.sessions.all()] == ["alive"]
    with pytest.raises(af.errors.NotFoundError, match=f"session 'gone' is unknown on task {A}"):
        await env.run_graph("gone", handles[A], 1, [])
    assert env.expire(25.0) == []  # "alive" holds its lease until 30.0
    assert env.expire(31.0) == ["alive"]
    tasks.close()


async def test_a_push_is_written_by_the_sending_kernel_unless_it_suspends() -> None:
    # A push that never suspends (the common case: an open idle connection) runs in
    # the producer's _Send, in the task running the step (a task's one partition runs
    # in the task that called run_graph, as a session runs one): no task of its own
    # and no turn of the loop before the producer answers.  One that suspends (a connect)
    # goes on as a task of the step: it still delivers, and is cancelled with it.
    tasks = Tasks()
    gate = asyncio.Event()
    seen: list[tuple[str, str]] = []

    def where() -> str:
        task = asyncio.current_task()
        assert task is not None
        return str(getattr(task.get_coro(), "__name__", ""))

    async def push(task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        seen.append(("start", where()))
        try:
            if step_id > 1:
                await gate.wait()  # (a connect)
        except asyncio.CancelledError:
            seen.append(("cancelled", where()))
            raise
        seen.append(("written", where()))
        tasks.envs[task].send_tensor(step_id, key, value, dead)

    tasks.envs[A].rendezvous._push = push
    g, b = _two_task_graph()
    handles, _ = tasks.register(g, [b])
    env_a, env_b = tasks.envs[A], tasks.envs[B]
    assert await env_a.run_graph("s", handles[A], 1, []) == ([], None)
    # In the task that called run_graph: the one partition runs there as well.
    here = where()
    assert seen == [("start", here), ("written", here)]
    assert (await env_b.run_graph("s", handles[B], 1, []))[0] == [6.0]

    seen.clear()
    run = asyncio.ensure_future(env_a.run_graph("s", handles[A], 2, []))
    await asyncio.sleep(0.01)
    assert [what for what, _ in seen] == ["start"]
    assert not run.done()  # it waits for its push
    gate.set()
    assert await run == ([], None)
    assert seen[1] == ("written", "_pushing")  # went on as a task of the step
    assert (await env_b.run_graph("s", handles[B], 2, []))[0] == [6.0]

    gate.clear()
    seen.clear()
    run = asyncio.ensure_future(env_a.run_graph("s", handles[A], 3, []))
    await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert [what for what, _ in seen] == ["start", "cancelled"]
    tasks.close()


async def test_a_failed_push_fails_the_producers_step() -> None:
    # The consumer will never get the value: the producer's run says so (naming the
    # consumer), instead of succeeding while its peer waits.
    tasks = Tasks()

    async def gone(task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        raise af.errors.UnavailableError(None, None, f"task {task} is unavailable: gone")

    tasks.envs[A].rendezvous._push = gone
    g, b = _two_task_graph()
    handles, _ = tasks.register(g, [b])
    with pytest.raises(af.errors.UnavailableError, match=f"task {B} is unavailable"):
        await tasks.envs[A].run_graph("s", handles[A], 4, [])
    tasks.close()


async def test_pushes_for_steps_over_or_never_run_here_are_dropped() -> None:
    import time

    from asyncflow.distributed.worker import _UNCLAIMED_S

    env = WorkerEnv(B, 1, 1, Tasks().push)
    key = f"{A}/device:CPU:0;0000000000000007;{B}/device:CPU:0;a:0;0:0"
    env.send_tensor(7, key, np.float64(1.0), False)  # before its run: kept for it
    assert len(env.rendezvous) == 1
    env.expire(time.monotonic() + 1.0)
    assert len(env.rendezvous) == 1
    # Never run here (its session gave up on it): forgotten, and a later push dropped.
    env.expire(time.monotonic() + _UNCLAIMED_S + 1.0)
    assert len(env.rendezvous) == 0
    env.send_tensor(7, key, np.float64(1.0), False)
    assert len(env.rendezvous) == 0
    env.close()


def test_stalls_are_numbered_with_their_length() -> None:
    from asyncflow.distributed._dask import Stalls

    stalls = Stalls()
    start = time_now = stalls._last
    assert stalls.observe(time_now + 0.1) == 0  # a look every tick: no stall
    assert stalls.observe(time_now + 3.1) == 1  # the process stood still 3 s
    assert stalls.observe(time_now + 3.2) == 1
    assert stalls.observe(time_now + 3.0) == 1  # a thread with an older clock reading
    assert stalls.observe(time_now + 4.0) == 2
    assert stalls._lengths == {1: pytest.approx(3.0), 2: pytest.approx(0.8)}
    stalls._last = start  # (since() looks at the real clock: no new stall)
    assert stalls.since(0) == pytest.approx(3.0)
    assert stalls.since(1) == pytest.approx(0.8)
    import pickle

    assert pickle.loads(pickle.dumps(stalls)).epoch == 0  # shipped: starts afresh


async def test_a_run_sent_before_a_long_stall_is_dropped_not_run() -> None:
    # A task whose process stood still past its master's health timeout was given up
    # on; the step's run and its pushed inputs, waiting in its sockets, must not run
    # (its writes would land after the session reported the step failed).
    from asyncflow.distributed._dask import AsyncflowWorker

    ran: list[float] = []

    def kernel(v: np.ndarray) -> np.ndarray:
        ran.append(float(v))
        return v

    g = af.Graph()
    with g.as_default(), af.device("/job:worker/task:1"):
        y = af.py_func(kernel, [af.constant(2.0)], af.float64, name="y")
    tasks = Tasks()
    handles, _ = tasks.register(g, [y])
    plugin = AsyncflowWorker()
    plugin.incarnation = "me"
    plugin._envs[B] = tasks.envs[B]

    async def run(step_id: int, epoch: int, health: float) -> Any:
        return await plugin._h_run_graph(
            None,
            task=B,
            incarnation="me",
            session="s",
            handle=handles[B],
            step_id=step_id,
            args=[],
            trace=False,
            name="y:0",
            epoch=epoch,
            health=health,
        )

    assert (await run(1, 0, 1.0))["ok"]
    plugin.stalls._last -= 3.0  # the process stood still 3 s (SIGSTOP)
    reply = await run(2, 0, 1.0)  # sent before it: its master gave up after 1 s
    assert not reply["ok"]
    error = reply["error"].data
    assert isinstance(error, af.errors.AbortedError)
    assert "stood still for 3" in error.message
    assert ran == [2.0]  # not run
    assert plugin.stalls.epoch == 1
    tasks.envs[B].send_tensor(2, "k", 1.0, False)  # a late push for it: dropped
    assert len(tasks.envs[B].rendezvous) == 0
    assert (await run(3, 1, 1.0))["ok"]  # sent by a master that heard of the stall
    assert (await run(4, 0, 10.0))["ok"]  # 3 s is short of a 10 s health timeout
    assert ran == [2.0, 2.0, 2.0]
    tasks.close()


async def test_an_older_wire_protocol_is_refused_at_the_handshake() -> None:
    from asyncflow.distributed._dask import PROTOCOL, local_identity
    from asyncflow.distributed.cluster import Cluster

    version, protocol = local_identity()
    assert protocol == PROTOCOL

    class Old:
        async def asyncflow_hello(self, **kwargs: Any) -> Any:
            return {
                "version": version,
                "protocol": PROTOCOL - 1,
                "incarnation": "x",
                "service": "tcp://a:1",
                "epoch": 0,
            }

    class Client:
        def rpc(self, address: str) -> Old:
            return Old()

    cluster = Cluster({"worker": 1})
    cluster.client = Client()
    with pytest.raises(
        af.errors.FailedPreconditionError,
        match=rf"Dask worker 'w-0' \(tcp://a\) runs asyncflow {version} \(protocol "
        rf"{PROTOCOL - 1}\) but this client runs {version} \(protocol {PROTOCOL}\)",
    ):
        await cluster._hello(A, "w-0", "tcp://a")


async def test_a_step_running_when_its_task_stood_still_takes_no_late_push() -> None:
    # The run started before the process was stopped; the producer's push arrives
    # after it resumed: the step is aborted there, the value not applied.
    from asyncflow.distributed._dask import AsyncflowWorker, wire

    ran: list[float] = []

    def kernel(v: np.ndarray) -> np.ndarray:
        ran.append(float(v))
        return v

    g = af.Graph()
    with g.as_default():
        with af.device("/job:worker/task:0"):
            a = af.constant(2.0) * 2.0
        with af.device("/job:worker/task:1"):
            y = af.py_func(kernel, [a], af.float64, name="y")
    tasks = Tasks()
    handles, _ = tasks.register(g, [y])
    plugin = AsyncflowWorker()
    plugin.incarnation = "me"
    plugin._envs[B] = tasks.envs[B]

    async def push(task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        await plugin._h_send_tensor(
            None, task=task, step_id=step_id, key=key, value=wire(value), dead=dead
        )

    tasks.envs[A].rendezvous._push = push

    async def step(step_id: int) -> Any:
        consumer = asyncio.ensure_future(
            plugin._h_run_graph(
                None,
                task=B,
                incarnation="me",
                session="s",
                handle=handles[B],
                step_id=step_id,
                args=[],
                trace=False,
                name="y:0",
                epoch=plugin.stalls.epoch,
                health=1.0,
            )
        )
        await asyncio.sleep(0.01)  # B runs, waiting for A's value
        if step_id == 2:
            plugin.stalls._last -= 3.0  # B's process stood still 3 s (SIGSTOP)
        await tasks.envs[A].run_graph("s", handles[A], step_id, [])
        return await consumer

    assert (await step(1))["ok"]
    reply = await step(2)
    assert not reply["ok"]
    assert isinstance(reply["error"].data, af.errors.AbortedError)
    assert "stood still for 3" in reply["error"].data.message
    assert ran == [4.0]  # the late value was not applied
    assert len(tasks.envs[B].rendezvous) == 0
    assert (await step(3))["ok"]  # later steps run
    assert ran == [4.0, 4.0]
    tasks.close()


async def test_the_handshake_at_connect_waits_out_the_connect_timeout() -> None:
    # A worker that just joined may take longer than a short health timeout to answer
    # its first handshake (its service starting on a loaded host): connect waits for
    # what is left of its own timeout; later handshakes keep the health timeout.
    from asyncflow.distributed._dask import PROTOCOL
    from asyncflow.distributed.cluster import Cluster

    class Slow:
        async def asyncflow_hello(self, **kwargs: Any) -> Any:
            await asyncio.sleep(0.2)
            return {
                "version": af.__version__,
                "protocol": PROTOCOL,
                "incarnation": "x",
                "service": "tcp://a:1",
                "epoch": 3,
            }

    class Client:
        def rpc(self, address: str) -> Slow:
            return Slow()

    cluster = Cluster({"worker": 1}, health_timeout_s=0.05)
    cluster.client = Client()
    with pytest.raises(af.errors.UnavailableError, match=r"did not answer within 0\.05 s"):
        await cluster._hello(A, "w-0", "tcp://a")
    assert await cluster._hello(A, "w-0", "tcp://a", wait_s=5.0) == ("x", "tcp://a:1")
    assert cluster.epoch[A] == 3  # the stalls it heard of, for its runs


async def test_a_push_outside_a_step_is_an_internal_error_and_never_starts() -> None:
    pushed: list[str] = []

    async def push(task: str, step_id: int, key: str, value: Any, dead: bool) -> None:
        pushed.append(key)

    rdv = RemoteRendezvous(A, 9, None, push, push_now=True)  # (no step attached)
    key = f"{A}/device:CPU:0;1;{B}/device:CPU:0;a:0;0:0"
    with pytest.raises(af.errors.InternalError, match="outside a step"):
        rdv.send(key, 1.0)
    assert pushed == []
