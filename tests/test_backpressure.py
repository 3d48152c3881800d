"""SessionConfig(max_concurrent_steps=N) and Session.statistics()."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from tests.ordering import wait_until


def _gated(
    graph: af.Graph,
) -> tuple[af.Tensor, af.Tensor, list[int], dict[int, asyncio.Event], list[int]]:
    """y = a kernel that records its feed on entry, then waits for that feed's gate."""
    x = af.placeholder(af.int32, shape=(), name="x")
    entered: list[int] = []
    gates: dict[int, asyncio.Event] = {}
    running = [0, 0]  # now, max

    async def gate(v: Any) -> Any:
        k = int(v)
        entered.append(k)
        running[0] += 1
        running[1] = max(running)
        try:
            await gates.setdefault(k, asyncio.Event()).wait()
        finally:
            running[0] -= 1
        return v

    return x, af.py_func(gate, [x], af.int32), entered, gates, running


def _entered(entered: list[int], n: int) -> Callable[[], bool]:
    return lambda: len(entered) == n


async def test_steps_beyond_the_limit_wait_in_fifo_order(graph: af.Graph) -> None:
    x, y, entered, gates, running = _gated(graph)
    async with af.Session(graph=graph, config=af.SessionConfig(max_concurrent_steps=2)) as sess:
        tasks = [asyncio.create_task(sess.run(y, {x: k})) for k in range(5)]
        await wait_until(lambda: len(entered) == 2, "two steps in their kernels")
        assert sess.statistics().waiting == 3
        for k in range(5):
            gates.setdefault(k, asyncio.Event()).set()
            await tasks[k]
            await wait_until(_entered(entered, min(k + 3, 5)), "the next step admitted")
        assert [t.result() for t in tasks] == [0, 1, 2, 3, 4]
        assert entered == [0, 1, 2, 3, 4]  # FIFO
        assert running[1] == 2
        stats = sess.statistics()
        assert (stats.waiting, stats.completed, stats.failed) == (0, 5, 0)


async def test_the_wait_counts_against_the_deadline(graph: af.Graph) -> None:
    x, y, entered, gates, _ = _gated(graph)
    async with af.Session(graph=graph, config=af.SessionConfig(max_concurrent_steps=1)) as sess:
        blocker = asyncio.create_task(sess.run(y, {x: 0}))
        await wait_until(lambda: entered == [0], "the first step in its kernel")
        start = time.monotonic()
        with pytest.raises(af.errors.DeadlineExceededError, match="waiting for a step slot"):
            await sess.run(y, {x: 1}, options=af.RunOptions(timeout_in_ms=50))
        assert time.monotonic() - start < 2.0
        assert entered == [0]  # the late step never started
        assert sess.statistics().waiting == 0
        gates[0].set()
        assert await blocker == 0
        gates[2] = asyncio.Event()
        gates[2].set()
        assert await sess.run(y, {x: 2}) == 2  # the slot was given back
        stats = sess.statistics()
        assert (stats.completed, stats.failed) == (2, 1)


async def test_a_cancelled_waiter_takes_no_slot(graph: af.Graph) -> None:
    x, y, entered, gates, _ = _gated(graph)
    async with af.Session(graph=graph, config=af.SessionConfig(max_concurrent_steps=1)) as sess:
        blocker = asyncio.create_task(sess.run(y, {x: 0}))
        await wait_until(lambda: entered == [0], "the first step in its kernel")
        waiter = asyncio.create_task(sess.run(y, {x: 1}))
        await wait_until(lambda: sess.statistics().waiting == 1, "one step waiting for a slot")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert sess.statistics().waiting == 0
        gates[0].set()
        await blocker
        gates[2] = asyncio.Event()
        gates[2].set()
        assert await asyncio.wait_for(sess.run(y, {x: 2}), 5) == 2
        assert entered == [0, 2]


async def test_close_fails_the_running_and_the_waiting_steps(graph: af.Graph) -> None:
    x, y, entered, _, _ = _gated(graph)
    fast = x * 2  # an all-inline plan: it would run at once if it got a slot
    sess = af.Session(graph=graph, config=af.SessionConfig(max_concurrent_steps=1))
    running = asyncio.create_task(sess.run(y, {x: 0}))
    await wait_until(lambda: entered == [0], "the first step in its kernel")
    waiting = asyncio.create_task(sess.run(fast, {x: 1}))
    await wait_until(lambda: sess.statistics().waiting == 1, "one step waiting for a slot")
    await sess.close()
    with pytest.raises(af.errors.CancelledError, match="closed"):
        await running
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    stats = sess.statistics()
    assert (stats.completed, stats.failed, stats.waiting) == (0, 2, 0)


def test_steps_from_several_threads_and_loops_share_the_limit(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    lock = threading.Lock()
    running = [0, 0]

    async def slow(v: Any) -> Any:
        with lock:
            running[0] += 1
            running[1] = max(running)
        await asyncio.sleep(0.002)
        with lock:
            running[0] -= 1
        return v

    y = af.py_func(slow, [x], af.float32)
    inline = x * 2.0  # an all-inline plan counts too (it takes a slot like any step)
    with af.Session(graph=graph, config=af.SessionConfig(max_concurrent_steps=1)) as sess:

        def work() -> None:
            for i in range(5):
                assert sess.run_sync(y, {x: float(i)}) == float(i)
                assert sess.run_sync(inline, {x: 1.0}) == 2.0

        async def also_async() -> None:
            for i in range(5):
                assert await sess.run(y, {x: float(i)}) == float(i)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        asyncio.run(also_async())
        for t in threads:
            t.join()
        stats = sess.statistics()
    assert running[1] == 1
    assert (stats.completed, stats.failed, stats.waiting) == (25, 0, 0)


async def test_statistics_count_outcomes_and_compiles_per_plan(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.identity(x * 2.0, name="y")

    def boom(v: Any) -> Any:
        raise ValueError("boom")

    bad = af.py_func(boom, [x], af.float32, name="bad")
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: 1.0}) == 2.0
        assert await sess.run(y, {x: 2.0}) == 4.0
        with pytest.raises(af.errors.OpError, match="bad"):
            await sess.run(bad, {x: 1.0})
        fn = sess.make_callable(y, [x])
        assert await fn(np.float32(3)) == 6.0
        stats = sess.statistics()
    assert (stats.completed, stats.failed, stats.waiting) == (3, 1, 0)
    assert stats.compiles == 2  # make_callable's signature is run's
    assert stats.compiles_per_plan == {"[y:0] <- [x:0]": 1, "[bad:0] <- [x:0]": 1}
    with pytest.raises(AttributeError):
        stats.completed = 0  # type: ignore[misc]  # a frozen snapshot


def test_sync_fast_path_counts_outcomes(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = x * 2.0
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(y, {x: 1.0}) == 2.0
        assert sess.statistics().completed == 1


def test_max_concurrent_steps_is_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent_steps"):
        af.SessionConfig(max_concurrent_steps=-1)
