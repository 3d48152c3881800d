"""Step outcomes: nothing lost under deadlines, cancellations, close and failures."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from tests.ordering import block_until, wait_until


async def test_finished_step_is_reported_finished_when_close_lands_in_the_same_iteration(
    graph: af.Graph,
) -> None:
    sessions: list[af.Session] = []

    async def last(v: Any) -> Any:
        await asyncio.sleep(0)
        # close() is asked for while this kernel returns: the step's last node is done.
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(sessions[0].close()))
        return v

    counter = af.Variable(0, name="counter")
    out = af.reshape(af.py_func(last, [counter.assign_add(1)], af.int32), [])
    sess = af.Session(graph=graph)
    sessions.append(sess)
    await sess.run(counter.initializer)
    assert await sess.run(out) == 1  # the results, not CancelledError
    await wait_until(lambda: sess.statistics().closed, "the close() asked for by the kernel")
    with pytest.raises(RuntimeError, match="closed"):
        await sess.run(out)


async def test_deadlines_never_hide_work_that_finished(graph: af.Graph) -> None:
    # An async kernel followed by an inline assign_add: a step whose assign_add ran
    # has finished and must be reported so; one reported timed out must not have run it.
    async def nap(v: Any) -> Any:
        await asyncio.sleep(random.uniform(0.0, 0.004))
        return v

    counter = af.Variable(0, name="counter")
    one = af.reshape(af.py_func(nap, [af.constant(1)], af.int32), [])
    bump = counter.assign_add(one)
    random.seed(7)
    async with af.Session(graph=graph) as sess:
        await sess.run(counter.initializer)
        results = await asyncio.gather(
            *(
                sess.run(bump, options=af.RunOptions(timeout_in_ms=random.choice([1, 2, 3, 4])))
                for _ in range(300)
            ),
            return_exceptions=True,
        )
        ok = sum(1 for r in results if not isinstance(r, BaseException))
        timed_out = [r for r in results if isinstance(r, af.errors.DeadlineExceededError)]
        assert ok + len(timed_out) == 300
        assert await sess.run(counter) == ok


@pytest.mark.parametrize("cancel_callers", [False, True])
async def test_queue_conserves_elements_under_deadlines_cancels_and_failures(
    graph: af.Graph, cancel_callers: bool
) -> None:
    q = af.FIFOQueue(50, af.int32, shapes=[()], name="q")
    x = af.placeholder(af.int32, shape=(), name="x")
    put = q.enqueue(x)
    take = q.dequeue()
    take_many = q.dequeue_many(3)
    size = q.size()
    rng = random.Random(11)
    enqueued_ok: list[int] = []
    dequeued: list[int] = []

    async def producer(sess: af.Session, i: int) -> None:
        opts = af.RunOptions(timeout_in_ms=rng.choice([1, 5, 50]))
        try:
            await sess.run(put, {x: i}, options=opts)
            enqueued_ok.append(i)
        except af.errors.DeadlineExceededError:
            pass

    async def consumer(sess: af.Session, many: bool) -> None:
        opts = af.RunOptions(timeout_in_ms=rng.choice([1, 3, 10]))
        try:
            got = await sess.run(take_many if many else take, options=opts)
            dequeued.extend(np.atleast_1d(got).tolist())
        except af.errors.DeadlineExceededError:
            pass

    async with af.Session(graph=graph) as sess:
        producers, consumers = [], []
        for i in range(600):
            producers.append(asyncio.ensure_future(producer(sess, i)))
            if i % 2 == 0:
                consumers.append(asyncio.ensure_future(consumer(sess, many=i % 6 == 0)))
        cancelled_consumers = 0
        if cancel_callers:
            await asyncio.sleep(0.005)
            for t in rng.sample(producers + consumers, 60):
                cancelled_consumers += t in consumers and t.cancel()
        await asyncio.gather(*producers, *consumers, return_exceptions=True)
        remaining: list[int] = []
        for _ in range(int(await sess.run(size))):
            remaining.append(int(await sess.run(take)))
    seen = dequeued + remaining
    assert len(seen) == len(set(seen)), "an element was delivered twice"
    assert set(seen) <= set(range(600))
    lost = set(enqueued_ok) - set(seen)
    # Deadlines and failures lose nothing: a dequeue still waiting takes nothing, one
    # handed its elements gives them back if cancelled, a finished step returns them.
    # A caller who cancels a step after its dequeue returned gets CancelledError
    # (asyncio: the cancellation wins) and those elements were consumed (TF's rule
    # for a dequeue that completed in a failed step): at most 3 per such caller.
    assert len(lost) <= 3 * cancelled_consumers, sorted(lost)


@pytest.mark.parametrize("kind", ["inline", "async", "expensive"])
async def test_kernel_raising_cancelled_error_is_a_node_failure(graph: af.Graph, kind: str) -> None:
    def sync_raise(v: Any) -> Any:
        raise asyncio.CancelledError("kernel gave up")

    async def async_raise(v: Any) -> Any:
        raise asyncio.CancelledError("kernel gave up")

    func = async_raise if kind == "async" else sync_raise
    with af.device("/cpu:0"):
        bad = af.py_func(
            func, [af.constant(1.0)], af.float32, name="quitter", expensive=kind == "expensive"
        )
    with af.device("/cpu:1"):
        waiting = af.identity(bad) + 1.0  # another partition waits on it
    async with af.Session(graph=graph, config=af.SessionConfig(device_count={"CPU": 2})) as s:
        for fetch in (bad, waiting):
            with pytest.raises(af.errors.CancelledError) as info:
                await asyncio.wait_for(s.run(fetch), 5)
            assert info.value.node_name == "quitter"
        assert await s.run(af.constant(2.0)) == 2.0


def test_no_never_awaited_coroutine_when_deadlines_land_as_tasks_start() -> None:
    import warnings

    g = af.Graph()

    async def nap(v: Any) -> Any:
        await asyncio.sleep(0.002)
        return v

    def spin(v: Any) -> Any:  # inline work between the dispatches of async kernels
        end = time.perf_counter() + 200e-6
        while time.perf_counter() < end:
            pass
        return v

    with g.as_default():
        x = af.constant(0.0)
        outs = []
        for _ in range(20):
            x = af.py_func(spin, [x], af.float32)
            outs.append(af.reshape(af.py_func(nap, [x], af.float32), []))
        total = af.add_n(outs)

    async def main() -> None:
        async with af.Session(graph=g) as sess:
            timed_out = 0
            for ms in [1, 1, 2, 1, 3] * 20:
                try:
                    await sess.run(total, options=af.RunOptions(timeout_in_ms=ms))
                except af.errors.DeadlineExceededError:
                    timed_out += 1
            assert timed_out > 50  # deadlines landed mid-step, as async tasks were made

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asyncio.run(main())
        gc.collect()


async def test_finished_and_failed_steps_leave_no_cyclic_garbage(graph: af.Graph) -> None:
    async def nap(v: Any) -> Any:
        await asyncio.sleep(0.02)
        return v

    def bad(v: Any) -> Any:
        raise ValueError("bad")

    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.add(x, 1.0)
    slow = af.py_func(nap, [y], af.float32)
    fail = af.py_func(bad, [y], af.float32)
    loop = af.while_loop(lambda i: i < 3, lambda i: i + 1, [af.constant(0)])
    with af.device("/cpu:1"):
        far = af.multiply(y, 2.0)
    config = af.SessionConfig(device_count={"CPU": 2})
    async with af.Session(graph=graph, config=config) as sess:

        async def every_kind() -> None:
            for fetch in (y, slow, loop, far):
                await sess.run(fetch, {x: 1.0})
            with pytest.raises(af.errors.InvalidArgumentError):
                await sess.run(fail, {x: 1.0})
            with pytest.raises(af.errors.DeadlineExceededError):
                await sess.run(slow, {x: 1.0}, options=af.RunOptions(timeout_in_ms=1))

        await every_kind()  # compile everything first
        gc.collect()
        gc.disable()
        try:
            await every_kind()
            found = gc.collect()
        finally:
            gc.enable()
    assert found == 0


def test_closing_from_another_thread_never_loses_a_finished_step() -> None:
    g = af.Graph()

    async def nap(v: Any) -> Any:
        await asyncio.sleep(0.001)
        return v

    with g.as_default():
        counter = af.Variable(0, name="counter")
        bump = counter.assign_add(af.reshape(af.py_func(nap, [af.constant(1)], af.int32), []))
    sess = af.Session(graph=g)
    sess.run_sync(counter.initializer)
    outcomes: list[Any] = []

    async def many() -> None:
        outcomes.extend(
            await asyncio.gather(*(sess.run(bump) for _ in range(200)), return_exceptions=True)
        )

    runner = threading.Thread(target=lambda: asyncio.run(many()))
    runner.start()
    # Close once the other thread's steps have begun (a monotonic count: they may all
    # finish between two looks, so "in flight" could be missed for good).
    block_until(lambda: sess.statistics().steps_started > 1, "steps started on the other thread")
    sess.close_sync()
    runner.join(10)
    assert not runner.is_alive()
    ok = sum(1 for o in outcomes if not isinstance(o, BaseException))
    assert all(
        isinstance(o, af.errors.CancelledError | RuntimeError)
        for o in outcomes
        if isinstance(o, BaseException)
    )
    # Every step whose assign_add ran returned its result: the variable's final value
    # equals the successful steps (read from the store, the session is closed).
    store = sess._resources.get("", "counter") if len(sess._resources) else None
    assert store is None or int(store.read()) == ok
