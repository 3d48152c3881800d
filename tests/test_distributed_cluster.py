"""asyncflow on a real command-line Dask cluster: ``dask scheduler`` and ``dask worker``
processes started here, killed, stopped and restarted by pid.

Every process is tracked by the ``procs`` fixture and killed by pid when the test ends,
whatever happened; every wait is bounded.  Each test starts its own scheduler, so the
task → worker map it records starts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncflow as af

afd = pytest.importorskip("asyncflow.distributed")

PS = "/job:ps/replica:0/task:0"
W0 = "/job:worker/replica:0/task:0"
_DASK = str(Path(sys.executable).with_name("dask"))
_START_TIMEOUT = 60.0


class Procs:
    """Dask processes of one test, killed by pid at its end."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._procs: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self._n += 1
        log = open(self._tmp / f"proc-{self._n}.log", "wb")  # noqa: SIM115 - closed below
        try:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        finally:
            log.close()
        self._procs.append(proc)
        return proc

    def outside_loopback(self) -> list[str]:
        """Every listening socket of these processes bound beyond 127.0.0.1."""
        import psutil  # type: ignore[import-untyped]  # Dask's own dependency, untyped

        found = []
        for proc in self._procs:
            if proc.poll() is None:
                for conn in psutil.Process(proc.pid).net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.ip != "127.0.0.1":
                        found.append(f"pid {proc.pid}: {conn.laddr.ip}:{conn.laddr.port}")
        return found

    def python(self, code: str, *args: str) -> subprocess.Popen[bytes]:
        """``python -c code args...`` whose stdout the test reads (a master process)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self._procs.append(proc)
        return proc

    def scheduler(self, port: int = 0, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
        """A ``dask scheduler`` on 127.0.0.1; (its process, its address)."""
        path = self._tmp / f"scheduler-{self._n + 1}.json"
        proc = self._spawn(
            [
                _DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
                # Dask still serves HTTP (health, metrics) without its dashboard, on all
                # interfaces unless told: keep it on loopback like everything else here.
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(path),
                *extra,
            ]
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            if path.exists():
                try:
                    return proc, str(json.loads(path.read_text())["address"])
                except (ValueError, KeyError):
                    pass  # written but not complete yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: {self.log(proc)}")
            time.sleep(0.05)

    def worker(
        self, address: str, name: str, *extra: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A ``dask worker`` named ``name`` (no nanny: its pid is the worker's)."""
        return self._spawn(
            [
                _DASK,
                "worker",
                address,
                "--host",
                "127.0.0.1",
                "--name",
                name,
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                # Dask still serves HTTP (health, metrics) without its dashboard, on all
                # interfaces unless told: keep it on loopback like everything else here.
                "--dashboard-address",
                "127.0.0.1:0",
                *extra,
            ],
            env=env,
        )

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        k = self._procs.index(proc) + 1
        return (self._tmp / f"proc-{k}.log").read_text(errors="replace")[-3000:]

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(timeout=30)
        elif sig == signal.SIGSTOP:
            _wait_stopped(proc.pid)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot die otherwise
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Return once every thread of ``pid`` is stopped: a SIGSTOP takes hold only when its
    threads next get a core, and on a loaded machine a thread may run on for
    milliseconds (a whole step) after ``kill`` returned."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():  # no procfs: nothing to wait on
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = set()
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):  # a thread that just ended
                stat = (task / "stat").read_text()
                states.add(stat[stat.rindex(")") + 2])
        if states <= {"T", "t"}:
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()
        gc.collect()  # a quiet point (see the testing note in docs/distributed.md)


async def _wait_for_names(cluster: Any, names: set[str]) -> None:
    """Until the scheduler lists workers of every name in ``names`` (bounded)."""

    async def listed() -> set[str]:
        info = await cluster.client.scheduler.identity(n_workers=-1)
        return {str(w["name"]) for w in info["workers"].values()}

    async with asyncio.timeout(_START_TIMEOUT):
        while not names <= await cluster._call(listed()):  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.1)


async def _joined(address: str, names: set[str]) -> None:
    """Until workers of every name in ``names`` joined the scheduler (bounded)."""
    import distributed

    async with (
        distributed.Client(address, asynchronous=True, set_as_default=False) as c,  # type: ignore[no-untyped-call]
        asyncio.timeout(_START_TIMEOUT),
    ):
        while not names <= {  # noqa: ASYNC110
            str(w["name"]) for w in (await c.scheduler.identity(n_workers=-1))["workers"].values()
        }:
            await asyncio.sleep(0.1)


def _ps_graph() -> tuple[af.Graph, Any, Any]:
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            v = af.Variable(np.float32(1.0), name="v")
        with af.device(W0):
            bump = af.identity(v.assign_add(np.float32(1.0)) * 1.0, name="bump")
    return g, v, bump


# -- stable task identity ----------------------------------------------------------------


async def test_tasks_are_bound_by_worker_name_and_never_move(procs: Procs) -> None:
    _, address = procs.scheduler()
    procs.worker(address, "ps-0")
    procs.worker(address, "w-0")
    named = await afd.Cluster.connect(
        address, jobs={"ps": ["ps-0"], "worker": ["w-0"]}, timeout_s=_START_TIMEOUT
    )
    async with named:
        assert named.names == {PS: "ps-0", W0: "w-0"}
        # A task count: asyncflow chooses a free worker once ("ps-0" and "w-0" are
        # recorded as taken by the named client) and records the choice on the scheduler.
        procs.worker(address, "c-1")
        await _wait_for_names(named, {"c-1"})
        counted = await afd.Cluster.connect(address, jobs={"extra": 1})
        async with counted:
            assert counted.names == {"/job:extra/replica:0/task:0": "c-1"}
            # A worker whose address or name sorts first joins: nothing moves, and a
            # client connecting later sees the same map.
            procs.worker(address, "a-0")
            await _wait_for_names(named, {"a-0"})
            again = await afd.Cluster.connect(address, jobs={"extra": 1})
            async with again:
                assert again.names == counted.names
                assert again.assignment == counted.assignment
        g, v, bump = _ps_graph()
        async with af.Session(named, graph=g) as sess:
            await sess.run(v.initializer)
            assert await sess.run(bump) == 2.0
    # The scheduler and the workers serve nothing beyond loopback (Dask's HTTP server
    # listens on every interface unless given an address, dashboard or not).
    assert procs.outside_loopback() == []


async def test_a_worker_back_under_its_name_takes_its_task_back(procs: Procs) -> None:
    _, address = procs.scheduler()
    ps = procs.worker(address, "ps-0")
    procs.worker(address, "w-0")
    cluster = await afd.Cluster.connect(
        address, jobs={"ps": ["ps-0"], "worker": ["w-0"]}, timeout_s=_START_TIMEOUT
    )
    g, v, bump = _ps_graph()
    async with cluster, af.Session(cluster, graph=g) as sess:
        await sess.run(v.initializer)
        assert await sess.run(bump) == 2.0
        old = cluster.assignment[PS]
        procs.kill(ps)
        with pytest.raises(
            af.errors.UnavailableError, match=rf"task {PS} \(Dask worker 'ps-0'.*is unavailable"
        ):
            await asyncio.wait_for(sess.run(bump), 30)
        procs.worker(address, "ps-0")  # a new process under the same name
        await _wait_for_names(cluster, {"ps-0"})
        with pytest.raises(
            af.errors.AbortedError,
            match=rf"task {PS} \(Dask worker 'ps-0'\) restarted: its state "
            r"is gone",
        ):
            await asyncio.wait_for(sess.run(bump), 30)
        assert cluster.assignment[PS] != old
        # Later steps run: the variable is uninitialized, as TF after a ps restart.
        with pytest.raises(af.errors.FailedPreconditionError, match="uninitialized"):
            await asyncio.wait_for(sess.run(bump), 30)
        await sess.run(v.initializer)
        assert await sess.run(bump) == 2.0
        # A new session on the same cluster runs too.
        async with af.Session(cluster, graph=g) as fresh:
            assert await fresh.run(bump) == 3.0


# -- deployment checks -----------------------------------------------------------------


async def test_version_mismatch_missing_asyncflow_and_removed_plugin_name_the_worker(
    procs: Procs, tmp_path: Path
) -> None:
    old = tmp_path / "old_asyncflow.py"
    old.write_text("import asyncflow\nasyncflow.__version__ = '0.0.1-old'\n")
    bare = tmp_path / "no_asyncflow.py"
    bare.write_text("import sys\nsys.modules['asyncflow'] = None  # as if not installed\n")
    _, address = procs.scheduler()
    old_worker = procs.worker(address, "old-0", "--preload", str(old))
    bare_worker = procs.worker(address, "bare-0", "--preload", str(bare))
    procs.worker(address, "ok-0")
    await _joined(address, {"old-0", "bare-0", "ok-0"})  # before the service is installed
    # The first connect installs the service: bare-0 cannot load it.
    with pytest.raises(
        af.errors.FailedPreconditionError,
        match=r"Dask worker 'bare-0' .* has no asyncflow service for task "
        r"/job:ps/replica:0/task:0: installing it failed: .*No module "
        r"named 'asyncflow.distributed'",
    ):
        await afd.Cluster.connect(address, jobs={"ps": ["bare-0"]}, timeout_s=_START_TIMEOUT)
    mine = af.__version__
    with pytest.raises(
        af.errors.FailedPreconditionError,
        match=rf"Dask worker 'old-0' .* runs asyncflow 0\.0\.1-old \(protocol "
        rf"\d+\) but this client runs {mine}",
    ):
        await afd.Cluster.connect(address, jobs={"ps": ["old-0"]}, timeout_s=_START_TIMEOUT)
    # Choosing by count passes over both: the task goes to the one compatible worker.
    chosen = await afd.Cluster.connect(address, jobs={"extra": 1})
    async with chosen:
        assert chosen.names == {"/job:extra/replica:0/task:0": "ok-0"}
    cluster = await afd.Cluster.connect(address, jobs={"ps": ["ok-0"]}, timeout_s=_START_TIMEOUT)
    g = af.Graph()
    with g.as_default(), af.device(PS):
        y = af.constant(np.float32(2.0)) * 3.0
    async with cluster, af.Session(cluster, graph=g) as sess:
        assert await sess.run(y) == 6.0

        for proc in (old_worker, bare_worker):  # (bare-0 has no plugin to unregister)
            procs.kill(proc)

        async def unregister() -> None:
            await cluster.client.unregister_worker_plugin("asyncflow")

        await cluster._call(unregister())
        for _ in range(2):  # the session stays usable: the same clear error each time
            with pytest.raises(
                af.errors.FailedPreconditionError,
                match=r"Dask worker 'ok-0' .* has no asyncflow service for "
                r"task /job:ps/replica:0/task:0: its worker plugin "
                r"'asyncflow' was unregistered",
            ):
                await asyncio.wait_for(sess.run(y), 30)
    # Connecting again installs the service again.
    again = await afd.Cluster.connect(address, jobs={"ps": ["ok-0"]})
    async with again, af.Session(again, graph=g) as sess:
        assert await sess.run(y) == 6.0
    # A worker without asyncflow joining once the service is installed is refused by
    # Dask: a task named after it fails within the connect timeout, naming it.
    procs.worker(address, "late-0", "--preload", str(bare))
    with pytest.raises(
        af.errors.UnavailableError,
        match=r"no Dask worker named 'late-0' joined the cluster within 3 s",
    ):
        await afd.Cluster.connect(address, jobs={"ps": ["late-0"]}, timeout_s=3)


async def test_tls_local_cluster_and_connect_with_security(tls_security: Any) -> None:
    security = tls_security
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            a = af.constant(np.arange(3.0), name="a")
        with af.device(W0):
            b = af.reduce_sum(a * a, name="b")
    async with afd.LocalCluster(jobs={"ps": 1, "worker": 1}, security=security) as cluster:
        assert all(addr.startswith("tls://") for addr in cluster.assignment.values())
        # A step's messages go over asyncflow's comm backend, over TLS too.
        assert all(addr.startswith("aftls://") for addr in cluster.service.values())
        async with af.Session(cluster, graph=g) as sess:
            assert await sess.run(b) == 5.0
        address = cluster.dask_cluster.scheduler_address
        assert address.startswith("tls://")
        other = await afd.Cluster.connect(address, jobs={"ps": 1, "worker": 1}, security=security)
        async with other, af.Session(other, graph=g) as sess:
            assert other.names == cluster.names  # the map recorded on the scheduler
            assert await sess.run(b) == 5.0
    gc.collect()


# -- health ------------------------------------------------------------------------------


async def test_a_stopped_worker_fails_its_steps_after_the_health_timeout(procs: Procs) -> None:
    _, address = procs.scheduler()
    ps = procs.worker(address, "ps-0")
    procs.worker(address, "w-0")
    cluster = await afd.Cluster.connect(
        address,
        jobs={"ps": ["ps-0"], "worker": ["w-0"]},
        timeout_s=_START_TIMEOUT,
        health_timeout_s=1.0,
    )
    g, v, bump = _ps_graph()
    with g.as_default(), af.device(W0):
        alone = af.constant(np.float32(3.0)) * 2.0
    async with cluster, af.Session(cluster, graph=g) as sess:
        await sess.run(v.initializer)
        assert await sess.run(bump) == 2.0
        procs.kill(ps, signal.SIGSTOP)  # a hung host: connected, silent
        start = time.perf_counter()
        with pytest.raises(
            af.errors.UnavailableError,
            match=rf"task {PS} \(Dask worker 'ps-0'.* did not answer for 1 s",
        ):
            await asyncio.wait_for(sess.run(bump), 30)
        assert time.perf_counter() - start < 5.0  # Dask's own worker-ttl is minutes
        assert await sess.run(alone) == 6.0  # steps not touching it run
        procs.kill(ps, signal.SIGCONT)
        # The same process answers again: its state is intact, steps simply run.
        async with asyncio.timeout(30):
            while True:
                try:
                    assert await sess.run(bump) == 3.0
                    break
                except af.errors.UnavailableError:
                    await asyncio.sleep(0.2)


async def test_a_deadline_returns_even_when_a_thread_kernel_ignores_it(procs: Procs) -> None:
    _, address = procs.scheduler()
    procs.worker(address, "w-0")

    def stubborn(x: np.ndarray) -> np.ndarray:
        time.sleep(4.0)  # ignores cancellation, as blocking code does
        return x

    g = af.Graph()
    with g.as_default(), af.device(W0):
        x = af.placeholder(af.float32, shape=(), name="x")
        stuck = af.py_func(stubborn, [x], af.float32, expensive=True, name="stuck")
        quick = af.py_func(lambda v: v + 1.0, [x], af.float32, expensive=True, name="quick")
    cluster = await afd.Cluster.connect(address, jobs={"worker": ["w-0"]}, timeout_s=_START_TIMEOUT)
    async with cluster, af.Session(cluster, graph=g) as sess:
        assert await sess.run(quick, {x: 1.0}) == 2.0
        start = time.perf_counter()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(stuck, {x: 1.0}, options=af.RunOptions(timeout_in_ms=500))
        assert time.perf_counter() - start < 2.0
        # The next kernel on that task does not wait for the stuck thread, which the
        # task's device counts until it returns.
        start = time.perf_counter()
        assert await sess.run(quick, {x: 2.0}) == 3.0
        assert time.perf_counter() - start < 2.0
        assert await _stuck_threads(cluster) == {"w-0": 1}


async def _stuck_threads(cluster: Any) -> dict[str, int]:
    def stuck(dask_worker: Any) -> int:
        envs = dask_worker.plugins["asyncflow"]._envs.values()
        return sum(d.stuck for env in envs for d in env.devices)

    async def run() -> dict[str, int]:
        return await cluster.client.run(stuck)  # type: ignore[no-any-return]

    by_address = await cluster._call(run())
    return {cluster.names[t]: by_address[a] for t, a in cluster.assignment.items()}


# -- leases ------------------------------------------------------------------------------

_MASTER = """
import asyncio, sys
import numpy as np
import asyncflow as af, asyncflow.distributed as afd

address, marker, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])

async def slow(x):
    with open(marker, "a") as f:
        f.write("started\\n")
    try:
        await asyncio.sleep(8.0)
    except asyncio.CancelledError:
        with open(marker, "a") as f:
            f.write("cancelled\\n")
        raise
    with open(marker, "a") as f:
        f.write("finished\\n")
    return x

async def main():
    g = af.Graph()
    with g.as_default():
        with af.device("/job:ps/task:0"):
            v = af.Variable(np.float32(0.0), name="v")
        with af.device("/job:worker/task:0"):
            y = af.py_func(slow, [af.constant(np.float32(1.0))], af.float32, name="slow")
        with af.device("/job:ps/task:0"), af.control_dependencies([y.op]):
            bump = v.assign_add(np.float32(1.0))
    cluster = await afd.Cluster.connect(address, jobs={"ps": ["ps-0"], "worker": ["w-0"]},
                                        master_lease_s=lease)
    async with af.Session(cluster, graph=g) as sess:
        await sess.run(v.initializer)
        print("running", flush=True)
        await sess.run(bump)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("how", "lease"),
    [
        ("kill", 60.0),  # the client's connection drops: Dask removes it, tasks hear at once
        ("stop", 1.0),  # a hung master: connected but silent, its lease runs out
    ],
)
async def test_a_dead_masters_steps_are_cancelled_and_its_writes_never_land(
    procs: Procs, tmp_path: Path, how: str, lease: float
) -> None:
    _, address = procs.scheduler()
    procs.worker(address, "ps-0")
    procs.worker(address, "w-0")
    await _joined(address, {"ps-0", "w-0"})
    marker = tmp_path / "kernel.txt"
    master = procs.python(_MASTER, address, str(marker), str(lease))
    assert master.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(master.stdout.readline), _START_TIMEOUT)
    assert line == b"running\n"
    async with asyncio.timeout(30):
        while not marker.exists():  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.05)
    procs.kill(master, signal.SIGKILL if how == "kill" else signal.SIGSTOP)  # mid-step
    killed = time.perf_counter()
    async with asyncio.timeout(10):
        while "cancelled" not in marker.read_text():  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.05)
    assert time.perf_counter() - killed < 4.0  # well before the kernel's 8 s
    g = af.Graph()
    with g.as_default(), af.device("/job:ps/task:0"):
        v = af.Variable(np.float32(0.0), name="v")
    cluster = await afd.Cluster.connect(address, jobs={"ps": ["ps-0"], "worker": ["w-0"]})
    async with cluster, af.Session(cluster, graph=g) as sess:
        await asyncio.sleep(max(0.0, killed + 9.0 - time.perf_counter()))  # past the kernel
        assert await sess.run(v) == 0.0  # the orphaned step's write never landed
        assert marker.read_text() == "started\ncancelled\n"
        # The dead master's sessions and graphs are gone from every task.
        assert await _sessions(cluster) == {"ps-0": 1, "w-0": 0}  # (this session's, on ps)
        await afd.reset(cluster)


async def _sessions(cluster: Any) -> dict[str, int]:
    def count(dask_worker: Any) -> int:
        envs = dask_worker.plugins["asyncflow"]._envs.values()
        return sum(len(env.sessions.all()) for env in envs)

    async def run() -> dict[str, int]:
        return await cluster.client.run(count)  # type: ignore[no-any-return]

    by_address = await cluster._call(run())
    return {cluster.names[t]: by_address[a] for t, a in cluster.assignment.items()}


# -- recovery ----------------------------------------------------------------------------


async def test_monitored_session_recovers_from_a_killed_ps(procs: Procs, tmp_path: Path) -> None:
    _, address = procs.scheduler()
    ps = procs.worker(address, "ps-0")
    procs.worker(address, "w-0")
    cluster = await afd.Cluster.connect(
        address, jobs={"ps": ["ps-0"], "worker": ["w-0"]}, timeout_s=_START_TIMEOUT
    )
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            v = af.Variable(np.float32(0.0), name="v")
        with af.device(W0):
            delta = af.constant(np.float32(0.5)) * 2.0
        with af.device(PS):
            step = v.assign_add(delta)
    async with (
        cluster,
        af.train.MonitoredSession(
            lambda: af.Session(cluster, graph=g),
            checkpoint_dir=str(tmp_path / "ckpt"),
            save_steps=5,
            recovery_timeout_s=60,
        ) as msess,
    ):
        for _ in range(12):
            last = await msess.run(step)
        assert last == 12.0
        assert af.train.latest_checkpoint(tmp_path / "ckpt") == str(
            tmp_path / "ckpt" / "model.ckpt-10"
        )
        procs.kill(ps)

        async def restart() -> None:
            await asyncio.sleep(1.0)
            procs.worker(address, "ps-0")

        async with asyncio.TaskGroup() as tg:
            tg.create_task(restart())
            # Fails (ps gone), waits for ps-0 to come back, restores model.ckpt-10 and
            # runs the step again: steps 11 and 12 are lost, as in TF.
            assert await asyncio.wait_for(msess.run(step), 60) == 11.0
        assert msess.recoveries == 1
        assert msess.global_step == 11
        assert await msess.run(step) == 12.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_monitored_session_survives_a_scheduler_restart(procs: Procs, tmp_path: Path) -> None:
    port = _free_port()
    scheduler, address = procs.scheduler(port)
    workers = [procs.worker(address, "ps-0"), procs.worker(address, "w-0")]
    cluster = await afd.Cluster.connect(
        address,
        jobs={"ps": ["ps-0"], "worker": ["w-0"]},
        timeout_s=_START_TIMEOUT,
        health_timeout_s=2.0,
    )
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            v = af.Variable(np.float32(0.0), name="v")
        with af.device(W0):
            delta = af.constant(np.float32(1.0))
        with af.device(PS):
            step = v.assign_add(delta)
    async with (
        cluster,
        af.train.MonitoredSession(
            lambda: af.Session(cluster, graph=g),
            checkpoint_dir=str(tmp_path / "ckpt"),
            save_steps=3,
            recovery_timeout_s=90,
        ) as msess,
    ):
        for _ in range(4):
            await msess.run(step)
        # The scheduler dies and every worker with it (all ps state gone); the
        # deployment brings them back on the same address under the same names.
        for proc in (scheduler, *workers):
            procs.kill(proc)

        async def restart() -> None:
            await asyncio.sleep(1.0)
            procs.scheduler(port)
            procs.worker(address, "ps-0")
            procs.worker(address, "w-0")

        async with asyncio.TaskGroup() as tg:
            tg.create_task(asyncio.to_thread(asyncio.run, restart()))
            assert await asyncio.wait_for(msess.run(step), 90) == 4.0  # from model.ckpt-3
        # Each restarted task aborts the first step touching it: the restore (ps only),
        # then the step (w-0 too).
        assert msess.recoveries == 2
        assert await msess.run(step) == 5.0


# -- living inside a Dask cluster ----------------------------------------------------------


async def test_adaptive_scaling_never_retires_a_task_and_runs_show_as_events() -> None:
    g = af.Graph()
    with g.as_default():
        with af.device(PS):
            v = af.Variable(np.float32(1.0), name="v")
        with af.device(W0):
            y = af.multiply(v, 3.0, name="y")
    async with (
        afd.LocalCluster(jobs={"ps": 1, "worker": 1}) as cluster,
        af.Session(cluster, graph=g) as sess,
    ):
        await sess.run(v.initializer)
        dask_cluster = cluster.dask_cluster

        async def adapt_and_wait() -> set[str]:
            adaptive = dask_cluster.adapt(minimum=1, maximum=2, interval="50ms", wait_count=1)
            await asyncio.sleep(2.0)  # forty rounds: Dask would retire one idle worker
            adaptive.stop()
            info = await cluster.client.scheduler.identity(n_workers=-1)
            return {str(w["name"]) for w in info["workers"].values()}

        assert await cluster._call(adapt_and_wait()) == {"ps-0", "worker-0"}
        assert await sess.run(y) == 3.0

        async def runs() -> set[tuple[str, str, str]]:
            events = [msg for _, msg in await cluster.client.get_events("asyncflow")]
            return {
                (e["task"], e["step"], e["status"])
                for e in events
                if e["action"] == "run_graph" and e["runs"] == len(e["step_ids"]) >= 1
            }

        # Events travel batched with the workers' other messages: wait for them (bounded).
        async with asyncio.timeout(15):
            while not {(PS, "y:0", "ok"), (W0, "y:0", "ok")} <= await cluster._call(  # noqa: ASYNC110
                runs()
            ):
                await asyncio.sleep(0.05)
    gc.collect()
