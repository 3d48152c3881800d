"""The concurrency and service family: many concurrent tiny runs against
``asyncio.gather``, queues fed and drained by threads, variables updated concurrently,
and the HTTP service (its app and load generator in :mod:`benchmarks.service`)."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import numpy as np

from benchmarks import service as svc
from benchmarks.common import (
    Af,
    atimed,
    check,
)
from benchmarks.executor import tiny_graph
from benchmarks.report import Row
from benchmarks.sizes import Sizes, clock

# --------------------------------------------------------------------------- concurrent


def concurrent_runs(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """``asyncio.gather`` of ``concurrent_runs`` ``await sess.run(...)`` of the tiny
    graph against ``asyncio.gather`` of as many coroutines doing the same numpy ops:
    runs per second of each (``concurrent_batches`` gathers per timed repeat)."""
    g, x, y = tiny_graph(af)
    runs, batches = s.concurrent_runs, s.concurrent_batches
    one, two = np.float32(1.0), np.float32(2.0)

    async def plain(v: Any) -> Any:
        return np.multiply(np.add(v, one), two)

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            value = await sess.run(y, feed_dict={x: 1.0})
            check(value == 4.0, f"tiny graph computed {value!r}, expected 4.0")
            results: dict[str, list[Any]] = {}

            async def ours_batches() -> None:
                for _ in range(batches):
                    results["ours"] = await asyncio.gather(
                        *(sess.run(y, feed_dict={x: 1.0}) for _ in range(runs))
                    )

            async def anchor_batches() -> None:
                v = np.float32(1.0)
                for _ in range(batches):
                    results["anchor"] = await asyncio.gather(*(plain(v) for _ in range(runs)))

            ours, anchor = [], []
            for _ in range(s.repeats):
                anchor.append(await atimed(anchor_batches))
                ours.append(await atimed(ours_batches))
                for key, got in results.items():
                    check(
                        len(got) == runs and all(v == 4.0 for v in got),
                        f"concurrent ({key}): {len(got)} results, not {runs} times 4.0",
                    )
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["concurrent"]
    row.record(ours, anchor, per=lambda t: runs * batches / t)
    assert row.ours is not None
    assert row.anchor is not None
    row.notes.append(
        f"{batches} x asyncio.gather of {runs:,} `await sess.run(y, feed_dict={{x: 1.0}})` "
        f"per repeat (one session); {1e6 / row.ours:.2f} us per run vs "
        f"{1e6 / row.anchor:.2f} us per gathered coroutine"
    )


# --------------------------------------------------------------------------- queue


def _spread(total: int, workers: int) -> list[int]:
    """``total`` split into ``workers`` near-equal shares."""
    return [total // workers + (1 if k < total % workers else 0) for k in range(workers)]


def _check_exactly_once(what: str, received: list[list[int]], total: int) -> None:
    got = sorted(v for part in received for v in part)
    if got != list(range(total)):
        missing = len(set(range(total)) - set(got))
        check(
            False,
            f"{what}: {len(got):,} elements received for {total:,} sent "
            f"({missing:,} missing, {len(got) - len(set(got)):,} duplicated)",
        )


async def _asyncio_queue_round(
    capacity: int, total: int, producers: int, shares: list[int]
) -> list[list[int]]:
    """The queue workload's anchor: ``total`` integers through an ``asyncio.Queue``,
    ``producers`` tasks putting and one consumer task per share getting."""
    aq: asyncio.Queue[int] = asyncio.Queue(capacity)
    received: list[list[int]] = [[] for _ in shares]

    async def produce(k: int) -> None:
        for i in range(k, total, producers):
            await aq.put(i)

    async def consume(k: int) -> None:
        out = received[k]
        for _ in range(shares[k]):
            out.append(await aq.get())

    await asyncio.gather(
        *(produce(k) for k in range(producers)), *(consume(k) for k in range(len(shares)))
    )
    return received


def queue(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """Elements per second through a FIFOQueue, one element per enqueue step and per
    dequeue step, with producer and consumer tasks running their steps concurrently on
    one loop; the anchor moves the same integers through an ``asyncio.Queue``."""
    total, producers, consumers = s.queue_n, s.queue_producers, s.queue_consumers
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.int32, shape=(), name="x")
        q = af.FIFOQueue(s.queue_capacity, af.int32, shapes=[()])
        enq = q.enqueue(x)
        deq = q.dequeue()
        size = q.size()
    shares = _spread(total, consumers)
    timeout = 60.0  # a lost element must fail the row, not hang it

    async def main() -> tuple[list[float], list[float]]:
        async with af.Session(graph=g) as sess:
            await sess.run(enq, feed_dict={x: 7})  # compiles both plans
            value = await sess.run(deq)
            check(value == 7, f"queue: dequeued {value!r} after enqueueing 7")

            async def ours_steps() -> list[list[int]]:
                received: list[list[int]] = [[] for _ in range(consumers)]

                async def produce(k: int) -> None:
                    for i in range(k, total, producers):
                        await sess.run(enq, feed_dict={x: i})

                async def consume(k: int) -> None:
                    out = received[k]
                    for _ in range(shares[k]):
                        out.append(int(await sess.run(deq)))

                await asyncio.wait_for(
                    asyncio.gather(
                        *(produce(k) for k in range(producers)),
                        *(consume(k) for k in range(consumers)),
                    ),
                    timeout,
                )
                return received

            ours, anchor = [], []
            for _ in range(s.state_repeats):
                gc.collect()
                start = clock()
                received = await _asyncio_queue_round(s.queue_capacity, total, producers, shares)
                anchor.append(clock() - start)
                _check_exactly_once("asyncio.Queue anchor", received, total)
                gc.collect()
                start = clock()
                received = await ours_steps()
                ours.append(clock() - start)
                _check_exactly_once("queue", received, total)
                left = await sess.run(size)
                check(left == 0, f"queue: {left} elements left after the run")
            return ours, anchor

    ours, anchor = asyncio.run(main())
    row = rows["queue"]
    row.record(ours, anchor, per=lambda t: total / t)
    assert row.ours is not None
    row.notes.append(
        f"capacity {s.queue_capacity}, {producers} producer + {consumers} consumer tasks; "
        f"every element arrived exactly once; {1e6 / row.ours:.1f} us per element = two "
        f"steps (an enqueue, a dequeue), best run {min(ours):.2f} s"
    )


# --------------------------------------------------------------------------- variable


def variable(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """``assign_add`` steps per second with ``variable_tasks`` tasks each awaiting
    ``sess.run(inc)`` in a loop; the anchor: the same tasks bumping a Python int,
    each update followed by ``await asyncio.sleep(0)``."""
    total, tasks = s.variable_n, s.variable_tasks
    shares = _spread(total, tasks)
    g = af.Graph()
    with g.as_default():
        v = af.Variable(0, name="v")
        inc = v.assign_add(1)

    async def plain() -> int:
        counter = 0

        async def bump(n: int) -> None:
            nonlocal counter
            for _ in range(n):
                counter += 1
                await asyncio.sleep(0)

        await asyncio.gather(*(bump(n) for n in shares))
        return counter

    async def main() -> tuple[list[float], list[float], int]:
        async with af.Session(graph=g) as sess:
            await sess.run(v.initializer)
            await sess.run(inc)  # compiles
            # Untimed: how often consecutive steps came from different tasks.
            await sess.run(v.initializer)
            order: list[int] = []

            async def traced(k: int) -> None:
                for _ in range(3):
                    await sess.run(inc)
                    order.append(k)

            await asyncio.gather(*(traced(k) for k in range(tasks)))
            switches = sum(a != b for a, b in itertools.pairwise(order))

            async def steps(n: int) -> None:
                for _ in range(n):
                    await sess.run(inc)

            ours, anchor = [], []
            for _ in range(s.state_repeats):
                gc.collect()
                start = clock()
                counted = await plain()
                anchor.append(clock() - start)
                check(counted == total, f"variable anchor counted {counted}, not {total}")
                await sess.run(v.initializer)
                gc.collect()
                start = clock()
                await asyncio.gather(*(steps(n) for n in shares))
                ours.append(clock() - start)
                value = await sess.run(v)
                check(value == total, f"variable ended at {value!r}, expected {total}")
            return ours, anchor, switches

    ours, anchor, switches = asyncio.run(main())
    row = rows["variable"]
    row.record(ours, anchor, per=lambda t: total / t)
    assert row.ours is not None
    row.notes.append(
        f"{tasks} tasks x {total // tasks:,} steps; the variable ended exactly at {total:,} "
        f"every run; {1e6 / row.ours:.2f} us per step, best run {min(ours):.2f} s"
    )
    sequential = switches < tasks
    row.notes.append(
        f"untimed check ({tasks} tasks x 3 steps): consecutive steps changed task "
        f"{switches} times"
        + (
            ": an all-inline plan's `await sess.run` never yields to the loop, so "
            "each task's steps run back to back (the anchor's sleep(0) switches "
            "task on every update)"
            if sequential
            else ""
        )
    )


# --------------------------------------------------------------------------- service


def service(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """An ASGI app under load: ``await sess.run`` vs ``asyncio.gather`` of the same
    coroutines, endpoint beside endpoint in one server (see :mod:`benchmarks.service`)."""
    del af  # served from a child process
    ids = ("service.cpu", "service.p50", "service.p99", "service.ops")
    missing = svc.missing_modules()
    if missing:
        for row_id in ids:
            rows[
                row_id
            ].skipped = (
                f'not installed: {", ".join(missing)} (the bench extra: pip install -e ".[bench]")'
            )
        return
    reps = svc.measure(
        s.service_requests, s.service_concurrency, s.service_sleep, s.service_repeats
    )
    by = {ep: [r for r in reps if r.endpoint == ep] for ep in svc.ENDPOINTS}
    n = s.service_requests
    rows["service.cpu"].record(
        [r.server_cpu / n for r in by["run"]],
        [r.server_cpu / n for r in by["gather"]],
        per=lambda t: t * 1e6,
    )
    rows["service.p50"].record(
        [r.percentile(0.5) for r in by["run"]],
        [r.percentile(0.5) for r in by["gather"]],
        per=lambda t: t * 1e3,
    )
    rows["service.p99"].record(
        [r.percentile(0.99) for r in by["run"]],
        [r.percentile(0.99) for r in by["gather"]],
        per=lambda t: t * 1e3,
    )

    def summary(ep: str) -> str:
        best = min(by[ep], key=lambda r: r.wall)
        gc_counts = "/".join(str(c) for c in best.gc_collections)
        return (
            f"/{ep} {n / best.wall:,.0f} req/s, load generator "
            f"{best.client_cpu / n * 1e6:.0f} us CPU/req, server GC collections "
            f"(gen 0/1/2) {gc_counts}"
        )

    import uvicorn

    rows["service.cpu"].notes.append(
        f"Starlette on uvicorn {uvicorn.__version__} (asyncio loop, {svc.http_impl()}) in a "
        f"child process on a local port; load: aiohttp client in this process, "
        f"{s.service_concurrency} requests in flight, {n:,} requests per repeat, endpoints "
        f"alternating; each request awaits two {s.service_sleep * 1e3:g} ms sleeps (I/O "
        f"stand-ins) and 3 numpy ops: /run as sess.run of a graph with 2 async py_funcs, "
        f"/gather as asyncio.gather of the same coroutines (the anchor); CPU = server "
        f"process CPU time / requests; latency at the client"
    )
    rows["service.cpu"].notes.append(f"best repeats: {summary('run')}; {summary('gather')}")

    counts = svc.census(s.service_census_requests)
    ops = rows["service.ops"]
    ops.record([counts["run"]["all"]], [counts["gather"]["all"]])
    ops.notes.append(
        f"the same app driven through ASGI in this process (no HTTP), one request at a "
        f"time, asyncio.sleep(0) as the I/O; bytecodes counted with sys.settrace over "
        f"{s.service_census_requests} requests per endpoint (the same count every run): "
        f"asyncflow's own {counts['run']['asyncflow']:,.0f} of /run's "
        f"{counts['run']['all']:,.0f}; /gather runs {counts['gather']['all']:,.0f}"
    )
