"""Distributed execution on a Dask ``LocalCluster`` of worker processes (docs/architecture.md).

One cluster (one ``ps`` task, two ``worker`` tasks) serves the module; state is reset between
tests.  Results are compared with a local session (or the reference interpreter).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.testing import reference_run

afd = pytest.importorskip("asyncflow.distributed")

PS = "/job:ps/task:0"
W0 = "/job:worker/task:0"
W1 = "/job:worker/task:1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with afd.LocalCluster(jobs={"ps": 1, "worker": 2}, cpus_per_task=2) as c:
        thread = c._own_loop._thread
        yield c
    gc.collect()  # a quiet point (CPython 3.11.7 can abort pytest if a finalizer runs mid-parse)
    # Nothing outlives the cluster: its client thread and its worker processes are gone.
    assert not thread.is_alive()
    assert multiprocessing.active_children() == []


@pytest.fixture(autouse=True)
def _reset(cluster: Any) -> Iterator[None]:
    yield
    asyncio.run(afd.reset(cluster))
    gc.collect()


async def _open_rendezvous(cluster: Any) -> dict[str, int]:
    """Step rendezvous each task still holds (none once its steps are over)."""

    def count(dask_worker: Any) -> dict[str, int]:
        plugin = dask_worker.plugins["asyncflow"]
        return {task: len(env.rendezvous) for task, env in plugin._envs.items()}

    async def run() -> dict[str, dict[str, int]]:
        return await cluster.client.run(count)  # type: ignore[no-any-return]

    out: dict[str, int] = {}
    for counts in (await cluster._call(run())).values():
        out.update(counts)
    return out


def _ps_graph() -> tuple[af.Graph, Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            w = af.Variable(np.arange(3, dtype=np.float32), name="w")
        with af.device(W1):
            y = af.reduce_sum(w * 2.0, name="y")
        x = af.placeholder(af.float32, shape=(3,), name="x")
        with af.device(W0):
            z = af.multiply(x, w.read_value(), name="z")
    return g, w, y, z


# -- the cluster ------------------------------------------------------------------------


def test_devices_and_tasks_bound_by_worker_name(cluster: Any) -> None:
    assert cluster.devices() == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:0/device:CPU:1",
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:1",
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    ]
    addresses = list(cluster.assignment.values())
    assert list(cluster.assignment) == [
        "/job:ps/replica:0/task:0",
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    ]
    assert len(set(addresses)) == 3
    # A LocalCluster names each Dask worker after its task: bound by name, not address.
    assert cluster.names == {
        "/job:ps/replica:0/task:0": "ps-0",
        "/job:worker/replica:0/task:0": "worker-0",
        "/job:worker/replica:0/task:1": "worker-1",
    }


async def test_a_tasks_loop_packs_messages_without_mapping_memory_each_time(
    cluster: Any,
) -> None:
    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_ in its workers, which freezes glibc's mmap
    # threshold at 128 KiB: a 256 KiB buffer (msgpack packs every message into one)
    # was mapped, or given back and faulted in, every time.  The plugin raises both
    # thresholds: on the task's loop, 200 such buffers fault no page in.
    def faults(dask_worker: Any) -> dict[str, Any]:
        import resource

        async def churn() -> int:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            for _ in range(200):
                buffer = bytearray(256 << 10)  # zeroed: every page written
                del buffer
            return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

        loop = dask_worker.plugins["asyncflow"]._task_loop.loop
        churn_once = asyncio.run_coroutine_threadsafe(churn(), loop).result(30)  # (warm)
        return {
            "faults": asyncio.run_coroutine_threadsafe(churn(), loop).result(30),
            "first": churn_once,
            "env": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        }

    async def run() -> dict[str, dict[str, Any]]:
        return await cluster.client.run(faults)  # type: ignore[no-any-return]

    for found in (await cluster._call(run())).values():
        assert found["env"] is not None  # (Dask's setting, which made it matter)
        assert found["faults"] < 50, found  # 200 x 64 pages when each was mapped


async def test_steps_are_served_on_each_tasks_own_loop_and_sent_from_the_steps(
    cluster: Any,
) -> None:
    # Each task serves a step's messages on the loop its partitions run on (a Dask
    # server of its own, in the worker's process), not on Dask's loop with a hop per
    # message; the session sends them from the step's own loop, not the client's.
    def where(dask_worker: Any) -> dict[str, Any]:
        plugin = dask_worker.plugins["asyncflow"]
        return {
            "on_task_loop": plugin._server.loop.asyncio_loop is plugin._task_loop.loop,
            "step_ops_on_dask": sorted(
                op for op in dask_worker.handlers if op.startswith("asyncflow_")
            ),
            "service": plugin.service,
        }

    async def run() -> dict[str, dict[str, Any]]:
        return await cluster.client.run(where)  # type: ignore[no-any-return]

    found = await cluster._call(run())
    for task, address in cluster.assignment.items():
        info = found[address]
        assert info["on_task_loop"]
        assert info["step_ops_on_dask"] == [
            "asyncflow_client_gone",
            "asyncflow_hello",
            "asyncflow_ping",
        ]
        assert cluster.service[task] == info["service"] != address
        assert info["service"].startswith("aftcp://")  # asyncflow's comm backend
    g, w, y, _ = _ps_graph()
    async with af.Session(cluster, graph=g) as sess:
        await sess.run(w.initializer)
        assert await sess.run(y) == 6.0
    assert asyncio.get_running_loop() in cluster._pools


def test_bad_jobs_are_value_errors() -> None:
    with pytest.raises(ValueError, match="task count"):
        afd.LocalCluster(jobs={"worker": 0})
    with pytest.raises(ValueError, match="cpus_per_task"):
        afd.LocalCluster(jobs={"worker": 1}, cpus_per_task=0)


def test_import_without_dask_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "import asyncflow\n"
        "assert 'dask' not in sys.modules\n"
        "try:\n    import asyncflow.distributed\n"
        "except ImportError as e:\n    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(af.__file__))}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert 'pip install "asyncflow[distributed]"' in out


# -- running ----------------------------------------------------------------------------


async def test_two_devices_of_one_task_stay_in_its_process(cluster: Any) -> None:
    g = af.Graph()
    with g.as_default():
        with af.device("/job:worker/task:1/cpu:0"):
            a = af.constant(np.arange(3.0), name="a") + 1.0
        with af.device("/job:worker/task:1/cpu:1"):
            b = af.reduce_sum(a * a, name="b")
    l0 = af.SessionConfig(
        graph_options=af.GraphOptions(  # nothing folded: a crosses devices
            optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
        )
    )
    async with af.Session(cluster, graph=g, config=l0) as sess:
        meta = af.RunMetadata()
        opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        assert await sess.run(b, options=opts, run_metadata=meta) == 14.0
    devices = {d.device for d in meta.step_stats.dev_stats}
    assert devices == {
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    }


async def test_ps_worker_graph_matches_a_local_session(cluster: Any) -> None:
    g, w, y, z = _ps_graph()
    async with af.Session(cluster, graph=g) as sess:
        await sess.run(w.initializer)
        got = await sess.run({"y": y, "pair": (z, [y])}, feed_dict={"x:0": [1, 2, 3]})
    async with af.Session(graph=g, config=af.SessionConfig(allow_soft_placement=True)) as local:
        await local.run(w.initializer)
        want = await local.run({"y": y, "pair": (z, [y])}, feed_dict={"x:0": [1, 2, 3]})
    assert got["y"] == want["y"] == np.float32(6.0)
    assert isinstance(got["y"], np.float32)
    np.testing.assert_array_equal(got["pair"][0], want["pair"][0])
    assert got["pair"][1] == [np.float32(6.0)]


async def test_feed_a_remote_tensor_and_make_callable(cluster: Any) -> None:
    g, w, y, z = _ps_graph()
    async with af.Session(cluster, graph=g) as sess:
        await sess.run(w.initializer)
        # w's value lives on ps; feeding it cuts the remote read off.
        assert await sess.run(y, {w: np.ones(3, np.float32)}) == np.float32(6.0)
        fn = sess.make_callable([z, y], feed_list=[g.get_tensor_by_name("x:0")])
        outs = await asyncio.gather(*(fn(np.full(3, k, np.float32)) for k in range(5)))
    for k, (zv, yv) in enumerate(outs):
        np.testing.assert_array_equal(zv, k * np.arange(3, dtype=np.float32))
        assert yv == np.float32(6.0)


def test_run_sync_from_plain_code(cluster: Any) -> None:
    g, w, y, _ = _ps_graph()
    with af.Session(cluster, graph=g) as sess:
        sess.run_sync(w.initializer)
        assert sess.run_sync(y) == np.float32(6.0)
        assert sess.run_sync(y) == np.float32(6.0)


async def test_state_is_shared_across_sessions_unless_isolated(cluster: Any) -> None:
    g, w, y, _ = _ps_graph()
    with g.as_default():
        bump = w.assign_add(np.ones(3, np.float32))
    async with af.Session(cluster, graph=g) as a, af.Session(cluster, graph=g) as b:
        await a.run(w.initializer)
        await a.run(bump)
        np.testing.assert_array_equal(await b.run(w), [1, 2, 3])  # the same ps variable
    isolated = af.SessionConfig(isolate_session_state=True)
    async with af.Session(cluster, graph=g, config=isolated) as c:
        with pytest.raises(af.errors.FailedPreconditionError, match="w"):
            await c.run(y)
    await afd.reset(cluster)
    async with af.Session(cluster, graph=g) as d:
        with pytest.raises(af.errors.FailedPreconditionError, match="w"):
            await d.run(y)


async def test_unknown_job_or_task_names_it(cluster: Any) -> None:
    g = af.Graph()
    with g.as_default(), af.device("/job:worker/task:7"):
        af.constant(1.0, name="c")
    with pytest.raises(af.errors.InvalidArgumentError, match="/job:worker/task:7"):
        async with af.Session(cluster, graph=g) as sess:
            await sess.run("c:0")


async def test_remote_error_names_node_and_task_and_session_stays_usable(cluster: Any) -> None:
    def boom(v: np.ndarray) -> np.ndarray:
        raise ValueError("bad value on the worker")

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(2,), name="x")
        with af.device(W0):
            a = af.py_func(boom, [x], af.float32, name="boom")
        with af.device(W1):
            b = af.identity(x * 2.0, name="fine")
        total = af.add(a, b, name="total")
    async with af.Session(cluster, graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(total, {x: [1, 2]})
        assert info.value.node_name == "boom"
        assert "bad value on the worker" in info.value.message
        assert "/job:worker/replica:0/task:0" in info.value.message
        np.testing.assert_array_equal(await sess.run(b, {x: [1, 2]}), [2, 4])
    assert set((await _open_rendezvous(cluster)).values()) == {0}  # the failed step too


async def test_py_func_sync_async_expensive_ship_to_the_worker(cluster: Any) -> None:
    async def slow_double(v: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0.01)
        return v * 2

    def where(v: np.ndarray) -> np.ndarray:
        return v + os.getpid()

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(2,), name="x")
        with af.device(W0):
            a = af.py_func(slow_double, [x], af.float64)
        with af.device(W1):
            b = af.py_func(lambda v: v + 1, [a], af.float64, expensive=True)
            pid = af.py_func(where, [af.zeros((1,), af.float64)], af.float64)
    async with af.Session(cluster, graph=g) as sess:
        got, remote_pid = await sess.run([b, pid], {x: [1.0, 2.0]})
    np.testing.assert_array_equal(got, [3.0, 5.0])
    assert int(remote_pid[0]) != os.getpid()


async def test_control_flow_across_tasks(cluster: Any) -> None:
    g = af.Graph()
    with g.as_default():
        n = af.placeholder(af.int32, shape=(), name="n")
        with af.device(W0):
            i0 = af.constant(0, name="i0")
        with af.device(W1):
            step = af.constant(3, name="step")

        def body(i: Any, s: Any) -> Any:
            with af.device(W1):
                s2 = s + step
            return i + 1, s2

        _, total = af.while_loop(lambda i, s: i < n, body, [i0, af.constant(0)])
        with af.device(PS):
            picked = af.cond(n > 2, lambda: total * 10, lambda: total - 1)
    async with af.Session(cluster, graph=g) as sess:
        got = [await sess.run([total, picked], {n: k}) for k in (0, 2, 4)]
    # total = 3 n; picked = 10 total if n > 2 else total - 1
    assert [[int(a), int(b)] for a, b in got] == [[0, -1], [6, 5], [12, 120]]
    # Every value sent across tasks, once per iteration, was received: nothing is left.
    counts = await _open_rendezvous(cluster)
    assert {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"} <= set(counts)
    assert set(counts.values()) == {0}


async def test_full_trace_merges_every_task(cluster: Any) -> None:
    g, w, y, z = _ps_graph()
    async with af.Session(cluster, graph=g) as sess:
        await sess.run(w.initializer)
        meta = af.RunMetadata()
        opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE, output_partition_graphs=True)
        await sess.run([y, z], {"x:0": [1, 1, 1]}, options=opts, run_metadata=meta)
    devices = {d.device for d in meta.step_stats.dev_stats}
    assert {
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
    } <= devices
    names = {n.node_name for d in meta.step_stats.dev_stats for n in d.node_stats}
    assert {"y", "z"} <= names
    trace = af.tracing.Timeline(meta.step_stats).generate_chrome_trace_format()
    assert "/job:ps/replica:0/task:0" in trace
    graph_devices = {pg["device"] for pg in meta.partition_graphs}
    assert devices <= graph_devices
    ops = {n["op"] for pg in meta.partition_graphs for n in pg["node"]}
    assert {"_Send", "_Recv"} <= ops


async def test_many_concurrent_steps(cluster: Any) -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        with af.device(W0):
            a = x * 2.0
        with af.device(W1):
            b = a + 1.0
    async with af.Session(cluster, graph=g) as sess:
        outs = await asyncio.gather(*(sess.run(b, {x: float(k)}) for k in range(150)))
    assert [float(v) for v in outs] == [2.0 * k + 1.0 for k in range(150)]
    counts = await _open_rendezvous(cluster)
    assert {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"} <= set(counts)
    assert set(counts.values()) == {0}


def _hanging(path: str) -> Any:
    """An async kernel that sleeps for its input's seconds; notes in ``path`` when cancelled
    (and in ``path + ".started"`` when it starts: :func:`_started` waits for that)."""

    def note(where: str, what: str) -> None:
        with open(where, "a", encoding="utf-8") as f:
            f.write(f"{what} in {os.getpid()}\n")

    async def forever(v: np.ndarray) -> np.ndarray:
        note(path + ".started", "started")
        try:
            await asyncio.sleep(float(v))
        except asyncio.CancelledError:
            note(path, "cancelled")
            raise
        return v

    return forever


async def _started(marker: Any, runs: int) -> None:
    """Until :func:`_hanging`'s kernel started ``runs`` times in all (its worker noted
    it: a remote event, not a guess of how long a loaded machine needs), at most 60 s."""
    started = marker.with_name(marker.name + ".started")
    for _ in range(600):
        if started.exists() and len(started.read_text().splitlines()) >= runs:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the kernel did not start {runs} times within 60 s ({started})")


async def test_deadline_and_cancel_stop_remote_kernels(cluster: Any, tmp_path: Any) -> None:
    marker = tmp_path / "cancelled.txt"
    g = af.Graph()
    with g.as_default():
        seconds = af.placeholder(af.float32, shape=(), name="seconds")
        with af.device(W0):
            hang = af.py_func(_hanging(str(marker)), [seconds], af.float32, name="hang")
    async with af.Session(cluster, graph=g) as sess:
        assert await sess.run(hang, {seconds: 0.0}) == 0.0  # registered and warm
        start = time.perf_counter()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(hang, {seconds: 60.0}, options=af.RunOptions(timeout_in_ms=200))
        assert time.perf_counter() - start < 5
        # The remote kernel was cancelled before run() returned.
        (line,) = marker.read_text().splitlines()
        assert line.startswith("cancelled in ")
        assert int(line.split()[-1]) != os.getpid()
        task = asyncio.ensure_future(sess.run(hang, {seconds: 60.0}))
        await _started(marker, 3)  # (the warm run, the one past its deadline, this one)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(marker.read_text().splitlines()) == 2
        assert sess.statistics().in_flight == 0


async def test_close_cancels_in_flight_remote_steps(cluster: Any, tmp_path: Any) -> None:
    marker = tmp_path / "cancelled.txt"
    g = af.Graph()
    with g.as_default(), af.device(W1):
        hang = af.py_func(_hanging(str(marker)), [af.constant(60.0)], af.float32, name="hang")
    sess = af.Session(cluster, graph=g)
    task = asyncio.ensure_future(sess.run(hang))
    await _started(marker, 1)
    start = time.perf_counter()
    await sess.close()
    with pytest.raises(af.errors.CancelledError):
        await task
    assert time.perf_counter() - start < 5
    assert len(marker.read_text().splitlines()) == 1


def test_fewer_workers_than_tasks_is_a_value_error(cluster: Any) -> None:
    client = cluster.client
    assert client is not None

    async def connect() -> None:
        address = cluster.dask_cluster.scheduler_address
        await afd.Cluster.connect(address, jobs={"worker": 5})

    with pytest.raises(ValueError, match=r"needs 5 Dask workers .* has 3"):
        asyncio.run(connect())


# -- an existing Dask cluster, connected by address; a worker killed mid-step ------------


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[Any]:
    import distributed

    with distributed.LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
    ) as dc:
        yield dc
    gc.collect()


def test_from_client_uses_an_existing_client(dask_cluster: Any) -> None:
    import distributed

    g = af.Graph()
    with g.as_default():
        with af.device(W0):
            a = af.constant(np.arange(4.0), name="a")
        with af.device(W1):
            b = af.reduce_sum(a * a, name="b")
    with distributed.Client(dask_cluster, set_as_default=False) as client:  # type: ignore[no-untyped-call]
        cluster = afd.Cluster.from_client(client, jobs={"worker": 2})
        with cluster, af.Session(cluster, graph=g) as sess:
            assert sess.run_sync(b) == 14.0
        assert client.status == "running"  # the caller's client stays open


async def test_from_client_with_an_asynchronous_client(dask_cluster: Any) -> None:
    import distributed

    g = af.Graph()
    with g.as_default():
        with af.device(W0):
            a = af.constant(np.arange(4.0), name="a")
        with af.device(W1):
            b = af.reduce_sum(a * a, name="b")
    async with distributed.Client(  # type: ignore[no-untyped-call]
        dask_cluster.scheduler_address, asynchronous=True, set_as_default=False
    ) as client:
        cluster = await afd.Cluster.from_client(client, jobs={"worker": 2})
        async with cluster, af.Session(cluster, graph=g) as sess:
            assert await sess.run(b) == 14.0
        assert client.status == "running"  # the caller's client stays open


async def test_shared_variables_with_another_dtype_or_shape_are_refused(cluster: Any) -> None:
    def graph(value: Any) -> tuple[af.Graph, Any]:
        g = af.Graph()
        with g.as_default(), af.device(PS):
            v = af.Variable(value, name="clash_v")
        return g, v

    g1, v1 = graph(np.zeros(3, np.float32))
    g2, v2 = graph(np.zeros(2, np.float64))
    g3, v3 = graph(np.zeros(3, np.float32))
    async with (
        af.Session(cluster, graph=g1) as a,
        af.Session(cluster, graph=g2) as b,
        af.Session(cluster, graph=g3) as c,
    ):
        await a.run(v1.initializer)
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match=r"variable 'clash_v' on task /job:ps/replica:0/task:0 is "
            r"shared with dtype float32 and shape \(3,\), but this "
            r"session declares dtype float64 and shape \(2,\)",
        ):
            await b.run(v2.initializer)
        assert (await c.run(v3) == 0.0).all()  # the same declaration shares it
        assert (await a.run(v1) == 0.0).all()  # and the first session is untouched


async def test_two_clients_of_one_cluster_share_task_state(dask_cluster: Any) -> None:
    g = af.Graph()
    with g.as_default(), af.device(W1):
        v = af.Variable(np.float32(1.0), name="shared_v")
        bump = v.assign_add(np.float32(1.0))
    first = await afd.Cluster.connect(dask_cluster.scheduler_address, jobs={"worker": 2})
    async with first, af.Session(first, graph=g) as a:
        await a.run(v.initializer)
        # A second client connects later (installing the worker service again leaves
        # the running one, and its state, in place) and sees the first one's variable.
        second = await afd.Cluster.connect(dask_cluster.scheduler_address, jobs={"worker": 2})
        async with second, af.Session(second, graph=g) as b:
            assert await b.run(bump) == 2.0
        assert await a.run(v) == 2.0
        await afd.reset(first)


async def test_connect_by_address_and_kill_a_worker_mid_step(dask_cluster: Any) -> None:
    import signal

    async def slow(v: np.ndarray) -> np.ndarray:
        await asyncio.sleep(30)
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        with af.device(W0):
            hang = af.py_func(slow, [x], af.float32, name="hang")
            quick0 = af.identity(x + 1.0, name="quick0")
        with af.device(W1):
            quick = af.identity(x * 2.0, name="quick")
            both = af.add(hang, quick, name="both")
    cluster = await afd.Cluster.connect(dask_cluster.scheduler_address, jobs={"worker": 2})
    client_thread = cluster._own_loop._thread
    async with cluster, af.Session(cluster, graph=g) as sess:
        assert await sess.run(quick0, {x: 1.0}) == 2.0

        async def worker_pids() -> dict[str, int]:
            return await cluster.client.run(os.getpid)  # type: ignore[no-any-return]

        pids = await cluster._call(worker_pids())
        victim = pids[cluster.assignment["/job:worker/replica:0/task:0"]]
        step = asyncio.ensure_future(sess.run(both, {x: 1.0}))
        await asyncio.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        start = time.perf_counter()
        with pytest.raises(af.errors.UnavailableError, match="/job:worker/replica:0/task:0"):
            await step
        assert time.perf_counter() - start < 1.0
        # Steps that need the dead task fail at once; the others still run.
        start = time.perf_counter()
        with pytest.raises(af.errors.UnavailableError, match="/job:worker/replica:0/task:0"):
            await sess.run(quick0, {x: 1.0})
        assert time.perf_counter() - start < 1.0
        assert await sess.run(quick, {x: 4.0}) == 8.0
        await afd.reset(cluster)  # the live task only
    assert not client_thread.is_alive()  # closing the cluster joined its client's thread


# -- random DAGs over random tasks == the reference interpreter ---------------------------

DAG_DEVICES = ["", PS, W0, W1]


async def _async_plus(v: np.ndarray) -> np.ndarray:
    await asyncio.sleep(0)
    return v + 1.0


def _thread_half(v: np.ndarray) -> np.ndarray:
    return v * 0.5


@st.composite
def placed_graphs(draw: st.DrawFn) -> tuple[af.Graph, list[Any], dict[Any, Any]]:
    g = af.Graph()
    values = st.lists(st.floats(-2, 2, allow_nan=False, width=64), min_size=3, max_size=3)
    with g.as_default():
        tensors: list[Any] = []
        feeds: dict[Any, Any] = {}
        for k in range(draw(st.integers(1, 3))):
            with af.device(draw(st.sampled_from(DAG_DEVICES))):
                if draw(st.booleans()):
                    p = af.placeholder(af.float64, shape=(3,), name=f"p{k}")
                    feeds[p] = np.array(draw(values))
                    tensors.append(p)
                else:
                    tensors.append(af.constant(np.array(draw(values)), name=f"c{k}"))
        ops: list[Any] = []
        for _ in range(draw(st.integers(1, 12))):
            pick = st.sampled_from(tensors)
            kind = draw(st.sampled_from(["add", "mul", "neg", "add_n", "async", "thread"]))
            deps = draw(st.lists(st.sampled_from(ops), max_size=1)) if ops else []
            with af.device(draw(st.sampled_from(DAG_DEVICES))), af.control_dependencies(deps):
                if kind == "add":
                    t = af.add(draw(pick), draw(pick))
                elif kind == "mul":
                    t = af.multiply(draw(pick), draw(pick))
                elif kind == "neg":
                    t = af.negative(draw(pick))
                elif kind == "add_n":
                    t = af.add_n(draw(st.lists(pick, min_size=1, max_size=3)))
                else:
                    fn = _async_plus if kind == "async" else _thread_half
                    t = af.reshape(
                        af.py_func(fn, [draw(pick)], af.float64, expensive=kind == "thread"), (3,)
                    )
            tensors.append(t)
            ops.append(t.op)
        fetches = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=3))
        if draw(st.booleans()):
            t = draw(st.sampled_from(tensors))
            if t not in feeds:
                feeds[t] = np.array(draw(values))  # maybe a tensor living on a remote task
    return g, fetches, feeds


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(case=placed_graphs())
def test_random_dags_on_random_tasks_match_the_reference(
    cluster: Any, case: tuple[af.Graph, list[Any], dict[Any, Any]]
) -> None:
    graph, fetches, feeds = case
    expected = reference_run(fetches, feeds, graph=graph)
    with af.Session(cluster, graph=graph) as sess:
        got = sess.run_sync(fetches, feeds)
        again = sess.run_sync(fetches, feeds)
    for a, b, c in zip(got, again, expected):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)
        assert np.asarray(a).dtype == np.asarray(c).dtype


async def test_partial_run_feeds_and_fetches_across_tasks(cluster: Any) -> None:
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, shape=(), name="a")
        b = af.placeholder(af.float32, shape=(), name="b")
        with af.device(W0):
            r1 = af.add(a, 1.0, name="r1")
        with af.device(W1):
            r2 = af.multiply(r1, b, name="r2")
    async with af.Session(cluster, graph=g) as sess:
        h = await sess.partial_run_setup([r1, r2], [a, b])
        assert await sess.partial_run(h, r1, {a: 2.0}) == 3.0
        assert await sess.partial_run(h, r2, {b: 4.0}) == 12.0


async def test_a_py_func_that_cannot_ship_is_a_clear_error(cluster: Any) -> None:
    import threading

    lock = threading.Lock()

    def locked(v: np.ndarray) -> np.ndarray:
        with lock:
            return v

    g = af.Graph()
    with g.as_default(), af.device(W0):
        y = af.py_func(locked, [af.constant(1.0)], af.float32, name="locked")
    async with af.Session(cluster, graph=g) as sess:
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match="cannot register the partitions of task /job:worker",
        ):
            await sess.run(y)
        with g.as_default(), af.device(W1):
            ok = af.constant(2.0, name="ok") * 2.0
        assert await sess.run(ok) == 4.0


def test_run_sync_from_several_threads(cluster: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        with af.device(W0):
            a = x + 1.0
        with af.device(W1):
            b = a * 3.0
    with af.Session(cluster, graph=g) as sess, ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda k: sess.run_sync(b, {x: float(k)}), range(24)))
    assert [float(v) for v in outs] == [3.0 * (k + 1) for k in range(24)]


async def test_a_cluster_that_is_not_started_or_closed_says_so() -> None:
    g = af.Graph()
    with g.as_default(), af.device(W0):
        y = af.constant(1.0, name="y") + 1.0
    cluster = afd.LocalCluster(jobs={"worker": 1})
    async with af.Session(cluster, graph=g) as sess:
        with pytest.raises(af.errors.UnavailableError, match="not started"):
            await sess.run(y)


async def test_sharded_saver_writes_each_tasks_variables_on_that_task(
    cluster: Any, tmp_path: Any
) -> None:
    import json

    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            a = af.Variable(np.arange(3, dtype=np.float32), name="a")
        with af.device(W1):
            b = af.Variable(np.float64(2.5), name="b")
        c = af.Variable(np.int32(7), name="c")  # the client's own
        saver = af.train.Saver(sharded=True)
        bump = af.group(
            a.assign_add(np.ones(3, np.float32)), b.assign(np.float64(-1.0)), c.assign(np.int32(0))
        )
    async with af.Session(cluster, graph=g) as sess:
        await sess.run([a.initializer, b.initializer, c.initializer])
        path = await saver.save(sess, str(tmp_path / "model.ckpt"), global_step=1)
        assert af.train.latest_checkpoint(tmp_path) == path
        await sess.run(bump)
        await saver.restore(sess, path)
        got = await sess.run([a, b, c])
    assert got[0].tolist() == [0.0, 1.0, 2.0]
    assert (got[1], got[2]) == (2.5, 7)

    async def worker_pids() -> dict[str, int]:
        return await cluster.client.run(os.getpid)  # type: ignore[no-any-return]

    pids = await cluster._call(worker_pids())
    writers = {}
    for shard in sorted(tmp_path.glob("model.ckpt-1.shard-*-of-3.npz")):
        with np.load(shard) as data:
            index = json.loads(bytes(data["__asyncflow_index__"]).decode())
        writers[tuple(index["variables"])] = index["writer_pid"]
    # Each task's variables were written by that task's process; the client's by itself.
    assert writers == {
        ("c",): os.getpid(),
        ("a",): pids[cluster.assignment["/job:ps/replica:0/task:0"]],
        ("b",): pids[cluster.assignment["/job:worker/replica:0/task:1"]],
    }
