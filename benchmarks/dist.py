"""``python -m benchmarks distributed``: asyncflow on a Dask cluster, beside Dask itself.

One ``afd.LocalCluster`` of two worker processes (``/job:worker/task:0`` and ``:1``)
serves every row; each asyncflow figure is measured in the same run, repeat by
repeat, beside Dask's own anchor on the same workers through the same client:

* ``dist.step``  — a 2-task step passing one 8-byte tensor (task 0 computes it, task 1
  consumes it, the session fetches the result); anchor: a ``client.submit`` chain of
  the same two tasks pinned to the same two workers (one worker-to-worker pull); notes
  give Dask's own client→worker round trip (one message to a worker handler and its
  answer), both from the benchmark's loop through a connection pool of that loop (as
  a step's messages go) and through the Dask client's loop (a hop to its thread and
  back, as any call from another loop pays), and the step's ratio to each (the
  target: at most 1.5x the second, medians); and
  Dask's floor for the step's own shape (the same five messages, three in a row,
  between handlers of Dask's own worker servers that compute nothing), and for an
  rpc relayed through worker 0 to worker 1 (four in a row), with the step's ratios.
  Dask's functions are ``operator`` functions, pickled by reference (as a deployed
  module's would be), never shipped by value on each call.
* ``dist.bytes`` — a 64 MiB float32 tensor made on task 0 and summed on task 1, in
  GB/s of tensor crossing tasks; anchor: ``np.ones`` on worker 0 summed on worker 1.
* ``dist.concurrent`` — steps/s with 100 concurrent tiny 2-task steps; anchor: 100
  concurrent submit chains.
* ``dist.kill`` — ms from ``kill -9`` of task 0's worker mid-step to the caller's
  ``UnavailableError`` (no anchor).

Every figure is measured interleaved with its anchor, repeat by repeat, and reported
as the best repeat and the median.  Exit status 0 when every row ran (targets are
reported, never asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks import report
from benchmarks.report import Row, Target

#: The target: a 2-task step costs at most this many of Dask's own client->worker
#: round trips (through the Dask client's loop, medians).
_RTT_TARGET = 1.5
W0 = "/job:worker/task:0"
W1 = "/job:worker/task:1"


def _rows(mib: int) -> dict[str, Row]:
    rows = [
        Row(
            "dist.step",
            "2-task step, 8-byte tensor",
            "ms/step",
            "client.submit chain of 2 tasks on the same 2 workers",
            Target("<=", 2.0),
        ),
        Row(
            "dist.bytes",
            f"{mib} MiB float32 across tasks",
            "GB/s",
            "np.ones on worker 0, np.sum on worker 1 (submit)",
            Target(">=", 1.0),
            better="higher",
        ),
        Row(
            "dist.concurrent",
            "100 concurrent 2-task steps",
            "steps/s",
            "100 concurrent 2-task submit chains",
            better="higher",
        ),
        Row("dist.kill", "kill -9 of a worker mid-step", "ms", "(none)", Target("<=", 1000.0)),
    ]
    return {r.id: r for r in rows}


async def _per_call(fn: Callable[[], Awaitable[object]], n: int) -> float:
    """Mean seconds per call over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n


async def _interleaved(
    fns: list[Callable[[], Awaitable[object]]], n: int, repeats: int
) -> list[list[float]]:
    """Each function's seconds per call, repeat by repeat, measured in turn (so a busy
    moment of a shared machine hits them alike)."""
    for fn in fns:
        await fn()  # warm: compiled, registered, connected
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            out[k].append(await _per_call(fn, n))
    return out


async def run(quick: bool, rows: dict[str, Row]) -> bool:
    import asyncflow as af
    import asyncflow.distributed as afd

    n_steps, repeats, mib = (20, 2, 4) if quick else (200, 5, 64)
    async with afd.LocalCluster(jobs={"worker": 2}) as cluster:
        bench = _Bench(af, cluster, n_steps, repeats, mib * 2**20 // 4)
        async with af.Session(cluster, graph=bench.graph) as sess:
            bench.sess = sess
            ok = True
            for row_id, measure in (
                ("dist.step", bench.step),
                ("dist.bytes", bench.bytes),
                ("dist.concurrent", bench.concurrent),
                ("dist.kill", bench.kill),
            ):
                try:
                    await measure(rows[row_id])
                except Exception as exc:
                    ok = _failed(rows[row_id], exc) and ok
    return ok


class _Bench:
    """The rows' shared setup: one graph over the two tasks, its session, and Dask's
    anchors on the same two workers through the same client."""

    sess: Any

    def __init__(self, af: Any, cluster: Any, n_steps: int, repeats: int, elems: int) -> None:
        self.af, self.cluster, self.client = af, cluster, cluster.client
        self.n_steps, self.repeats, self.elems = n_steps, repeats, elems
        self.w0, self.w1 = (cluster.assignment[f"/job:worker/replica:0/task:{t}"] for t in (0, 1))
        self.graph = g = af.Graph()
        with g.as_default():
            self.x = af.placeholder(af.float64, shape=(), name="x")
            with af.device(W0):
                a = af.add(self.x, 1.0, name="a")
                big = af.ones((elems,), af.float32, name="big")
            with af.device(W1):
                self.b = af.multiply(a, 2.0, name="b")
                self.total = af.reduce_sum(big, name="total")

    def on_client(self, coro_fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        """``coro_fn`` run on the Dask client's loop (where its futures live)."""

        async def call() -> Any:
            async def inner() -> Any:
                return await coro_fn()

            return await self.cluster._call(inner())

        return call

    async def dask_chain(self) -> Any:
        fa = self.client.submit(operator.add, 1.0, 1.0, workers=[self.w0], pure=False)
        fb = self.client.submit(operator.mul, fa, 2.0, workers=[self.w1], pure=False)
        return await fb

    async def step(self, row: Row) -> None:
        from distributed.core import ConnectionPool

        x, b, client, w0 = self.x, self.b, self.client, self.w0

        async def dask_rtt() -> Any:
            # Dask's own client->worker round trip: one message to a worker handler and
            # its answer over the client's comms (no scheduler, no task).
            return await client.rpc(w0).identity()

        # The same round trip from this loop, over a pool of this loop (no thread hop).
        own = client.rpc
        pool = await ConnectionPool(
            serializers=own.serializers,
            deserializers=own.deserializers,
            connection_args=own.connection_args,
            timeout=own.timeout,
        )

        async def dask_rtt_here() -> Any:
            return await pool(w0).identity()

        shape, relay = await _relays(self.cluster, pool, w0, self.w1)
        try:
            assert await self.sess.run(b, {x: 1.0}) == 4.0
            ours, anchor, rtt, rtt_here, same, nested = await _interleaved(
                [
                    lambda: self.sess.run(b, {x: 1.0}),
                    self.on_client(self.dask_chain),
                    self.on_client(dask_rtt),
                    dask_rtt_here,
                    shape,
                    relay,
                ],
                self.n_steps,
                self.repeats,
            )
        finally:
            await pool.close()
        row.record(ours, anchor, per=lambda t: t * 1e3)
        step_ms = _median(ours) * 1e3
        ratio = step_ms / (_median(rtt) * 1e3)
        row.notes.append(
            f"target: a step <= {_RTT_TARGET}x Dask's client->worker round trip through "
            f"the Dask client's loop (medians): {ratio:.2f}x, "
            + ("met" if ratio <= _RTT_TARGET else "NOT met")
        )
        for what, times in (
            ("from this loop, a pool of its own", rtt_here),
            ("through the Dask client's loop", rtt),
        ):
            rtt_ms = _median(times) * 1e3
            row.notes.append(
                f"Dask's client->worker round trip ({what}; rpc to the worker's "
                f"identity handler, median of {self.repeats} interleaved repeats): "
                f"{rtt_ms:.2f} ms (best {min(times) * 1e3:.2f}); a step "
                f"{step_ms:.2f} ms costs {step_ms / rtt_ms:.1f}x it (medians), "
                f"{min(ours) / min(times):.1f}x (best repeats)"
            )
        for what, times in (
            (
                "the step's own shape on Dask's comms: five messages, three in a row "
                "(an rpc to worker 0's handler, which pushes one way to worker 1 and "
                "answers; an rpc to worker 1's handler, answered when the push came)",
                same,
            ),
            (
                "an rpc relayed: worker 0's handler makes an rpc to worker 1 and "
                "answers with its answer (four messages in a row)",
                nested,
            ),
        ):
            row.notes.append(
                f"Dask's floor for {what}, from this loop: {_median(times) * 1e3:.2f} ms "
                f"(best {min(times) * 1e3:.2f}); a step costs {step_ms / (_median(times) * 1e3):.2f}x "
                f"it (medians), {min(ours) / min(times):.2f}x (best repeats)"
            )
        pull = await _dask_pull(self.cluster, w0, self.w1, self.n_steps)
        row.notes.append(
            f"Dask's own worker-to-worker pull of the same 8 bytes (get_data_from_"
            f"worker, timed inside worker 1): {pull * 1e3:.2f} ms"
        )

    async def bytes(self, row: Row) -> None:
        client, elems, w0, w1 = self.client, self.elems, self.w0, self.w1

        async def dask_bytes() -> Any:
            fa = client.submit(np.ones, (elems,), np.float32, workers=[w0], pure=False)
            fb = client.submit(np.sum, fa, workers=[w1], pure=False)
            return await fb

        assert await self.sess.run(self.total) == elems
        nbytes = elems * 4
        ours, anchor = await _interleaved(
            [lambda: self.sess.run(self.total), self.on_client(dask_bytes)],
            max(self.n_steps // 20, 3),
            self.repeats,
        )
        row.record(ours, anchor, per=lambda t: nbytes / t / 1e9)

    async def concurrent(self, row: Row) -> None:
        async def ours_100() -> None:
            await asyncio.gather(*(self.sess.run(self.b, {self.x: 1.0}) for _ in range(100)))

        async def dask_100() -> None:
            await asyncio.gather(*(self.dask_chain() for _ in range(100)))

        ours, anchor = await _interleaved([ours_100, self.on_client(dask_100)], 1, self.repeats)
        row.record(ours, anchor, per=lambda t: 100 / t)

    async def kill(self, row: Row) -> None:
        row.ours = await _kill(self.af, self.cluster, self.sess, self.w0) * 1e3


async def _relays(
    cluster: Any, pool: Any, w0: str, w1: str
) -> tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[object]]]:
    """Dask's own floors for a step's shape: handlers of Dask's own worker servers
    (on Dask's loop, with Dask's comms), called from this loop through ``pool``.

    ``shape``: what a 2-task step sends, with nothing computed: the caller writes an
    rpc to worker 0, whose handler sends 8 bytes one way to worker 1 and answers, and
    an rpc to worker 1, whose handler answers once those bytes arrived.  ``relay``:
    worker 0's handler makes an rpc to worker 1 and answers with its answer.
    """

    def install(dask_worker: Any) -> None:
        arrived: dict[int, asyncio.Future[Any]] = {}

        def slot(key: int) -> asyncio.Future[Any]:
            if key not in arrived:
                arrived[key] = asyncio.get_running_loop().create_future()
            return arrived[key]

        async def wait(comm: Any, key: int) -> Any:
            try:
                return await slot(key)
            finally:
                del arrived[key]

        async def put(comm: Any, key: int, value: Any) -> None:
            slot(key).set_result(value)

        async def push(comm: Any, key: int, peer: str, value: Any) -> Any:
            await dask_worker.rpc(peer).asyncflow_bench_put(key=key, value=value, reply=False)
            return value

        async def relay(comm: Any, peer: str) -> Any:
            return await dask_worker.rpc(peer).identity()

        for name, handler in (("wait", wait), ("put", put), ("push", push), ("relay", relay)):
            dask_worker.handlers[f"asyncflow_bench_{name}"] = handler

    async def run_install() -> None:
        await cluster.client.run(install, workers=[w0, w1])

    await cluster._call(run_install())
    keys = iter(range(1 << 62))
    value = np.float64(1.0).tobytes()

    async def shape() -> object:
        key = next(keys)
        return await asyncio.gather(
            pool(w0).asyncflow_bench_push(key=key, peer=w1, value=value),
            pool(w1).asyncflow_bench_wait(key=key),
        )

    async def relay() -> object:
        return await pool(w0).asyncflow_bench_relay(peer=w1)

    return shape, relay


def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


async def _dask_pull(cluster: Any, w0: str, w1: str, n: int) -> float:
    """Seconds per worker-to-worker pull of an 8-byte value, measured on worker 1."""
    client = cluster.client

    def one() -> Any:
        return np.float64(1.0)

    async def timed_pulls(dask_worker: Any, key: Any) -> float:
        from distributed.worker import get_data_from_worker

        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                await get_data_from_worker(dask_worker.rpc, [key], w0, who=dask_worker.address)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    async def measure() -> float:
        fut = client.submit(one, workers=[w0], pure=False)
        await fut
        out = await client.run(timed_pulls, key=fut.key, workers=[w1])
        return float(out[w1])

    seconds: float = await cluster._call(measure())
    return seconds


async def _kill(af: Any, cluster: Any, sess: Any, w0: str) -> float:
    g = af.Graph()

    async def slow(v: np.ndarray) -> np.ndarray:
        await asyncio.sleep(30)
        return v

    with g.as_default(), af.device(W0):
        hang = af.py_func(slow, [af.constant(1.0)], af.float32)

    async def pids() -> Any:
        return await cluster.client.run(os.getpid)

    pid = (await cluster._call(pids()))[w0]
    async with af.Session(cluster, graph=g) as s:
        step = asyncio.ensure_future(s.run(hang))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        start = time.perf_counter()
        try:
            await step
        except af.errors.UnavailableError:
            return time.perf_counter() - start
    raise RuntimeError("the step did not fail with UnavailableError")


def _failed(row: Row, exc: Exception) -> bool:
    row.error = f"{type(exc).__name__}: {exc}"
    print(f"[benchmarks] {row.id} FAILED:\n{traceback.format_exc()}", file=sys.stderr)
    return False


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks distributed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, few repeats: a smoke run, not a measurement",
    )
    args = p.parse_args(argv)
    rows = _rows(4 if args.quick else 64)
    start = time.perf_counter()
    ok = asyncio.run(run(args.quick, rows))
    table = list(rows.values())
    print(
        f"asyncflow distributed benchmarks ({'quick' if args.quick else 'full'}) - "
        f"Dask LocalCluster of 2 worker processes, {os.cpu_count()} CPUs, "
        f"{time.perf_counter() - start:.0f} s"
    )
    print()
    print(report.render_table(table))
    print()
    print(report.render_anchor_legend(table))
    notes = report.render_notes(table)
    if notes:
        print()
        print(notes)
    print()
    print("targets:")
    print(report.render_targets(table))
    return 0 if ok else 1
