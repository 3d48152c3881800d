"""Queue ops that can finish at once do so in the step's first slice, with no task and
no future (their ``nowait`` twin); ops that must wait take the general path (a task
awaiting the queue).  Both paths keep the queue's arrival order and its errors."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from tests.ordering import wait_in_flight


@contextmanager
def _counting_tasks() -> Iterator[list[int]]:
    """Counts the tasks created on the running loop (a task factory)."""
    loop = asyncio.get_running_loop()
    made = [0]

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        yield made
    finally:
        loop.set_task_factory(None)


async def test_ops_that_can_finish_at_once_make_no_task(graph: af.Graph) -> None:
    q = af.FIFOQueue(2, af.int32, shapes=[()])
    x = af.placeholder(af.int32, ())
    enq, deq = q.enqueue(x), q.dequeue()
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {x: 0})  # compiles
        assert await sess.run(deq) == 0
        with _counting_tasks() as made:
            await sess.run(enq, {x: 1})
            await sess.run(enq, {x: 2})
            assert await sess.run(deq) == 1
            await sess.run(enq, {x: 3})
            assert made == [0]
            assert sess.statistics().in_flight == 0
            # Full: this enqueue must wait, as a task of its step (the general path).
            blocked = asyncio.create_task(sess.run(enq, {x: 4}))
            await wait_in_flight(sess, 1)
            assert not blocked.done()
            assert made[0] >= 1  # at least the caller's task: the step waits
            assert sess.statistics().in_flight == 1
            assert await sess.run(deq) == 2
            await blocked
            assert [await sess.run(deq) for _ in range(2)] == [3, 4]
        # Empty: a dequeue waits, then the next enqueue hands it the element.
        waiting = asyncio.create_task(sess.run(deq))
        await wait_in_flight(sess, 1)
        await sess.run(enq, {x: 5})
        assert await waiting == 5
        assert await sess.run(q.size()) == 0


async def test_a_dequeue_never_overtakes_a_waiting_one(graph: af.Graph) -> None:
    q = af.FIFOQueue(10, af.int32, shapes=[()])
    x = af.placeholder(af.int32, ())
    enq, deq, deq5 = q.enqueue(x), q.dequeue(), q.dequeue_many(5)
    async with af.Session(graph=graph) as sess:
        many = asyncio.create_task(sess.run(deq5))
        await wait_in_flight(sess, 1)
        for i in range(3):
            await sess.run(enq, {x: i})
        # Three elements are queued, but dequeue_many(5) came first: this one waits.
        one = asyncio.create_task(sess.run(deq))
        await wait_in_flight(sess, 2)
        assert not many.done()
        assert not one.done()
        for i in range(3, 6):
            await sess.run(enq, {x: i})
        np.testing.assert_array_equal(await many, [0, 1, 2, 3, 4])
        assert await one == 5


async def test_an_enqueue_never_overtakes_a_waiting_one(graph: af.Graph) -> None:
    q = af.FIFOQueue(2, af.int32, shapes=[()])
    x = af.placeholder(af.int32, ())
    enq, deq = q.enqueue(x), q.dequeue()
    enq_many = q.enqueue_many(af.constant(np.array([10, 11, 12], np.int32)))
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {x: 0})
        # Three elements, room for one: puts 10, waits with 11 and 12.
        many = asyncio.create_task(sess.run(enq_many))
        await wait_in_flight(sess, 1)
        assert not many.done()
        assert await sess.run(deq) == 0  # room for 11; 12 still waits
        late = asyncio.create_task(sess.run(enq, {x: 1}))
        await wait_in_flight(sess, 2)
        assert not late.done()
        assert await sess.run(deq) == 10  # room for 12 (the first waiter), not for 1
        await many
        assert not late.done()
        got = [await sess.run(deq) for _ in range(3)]
        await late
        assert got == [11, 12, 1]


async def test_errors_are_the_same_on_both_paths(graph: af.Graph) -> None:
    q = af.FIFOQueue(1, af.int32, shapes=[()])
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x, name="put")
    deq = q.dequeue(name="take")
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {x: 1})
        blocked = asyncio.create_task(sess.run(enq, {x: 2}))  # waits: the general path
        await wait_in_flight(sess, 1)
        await sess.run(q.close())
        assert await sess.run(deq) == 1
        await blocked  # it put its element when the dequeue made room
        assert await sess.run(deq) == 2
        # At once (nowait path): enqueue on a closed queue; dequeue on a drained one.
        with pytest.raises(af.errors.CancelledError, match=r"(?s)closed.*node put"):
            await sess.run(enq, {x: 3})
        with pytest.raises(af.errors.OutOfRangeError, match=r"(?s)insufficient.*node take"):
            await sess.run(deq)


async def test_a_scalar_fast_conversion_stores_what_the_general_one_does(graph: af.Graph) -> None:
    q = af.FIFOQueue(5, [af.int32, af.float64], shapes=[(), ()])
    a = af.placeholder(af.int32, ())
    b = af.placeholder(af.float64, ())
    enq = q.enqueue((a, b))
    deq = q.dequeue()
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {a: 1, b: 2.5})  # numpy scalars of the dtypes
        await sess.run(enq, {a: np.int32(3), b: 4})  # converted by the feed
        first, second = await sess.run(deq), await sess.run(deq)
    assert [type(v) for v in (*first, *second)] == [np.int32, np.float64] * 2
    assert [*first, *second] == [1, 2.5, 3, 4.0]


async def test_traced_queue_ops_record_their_stats(graph: af.Graph) -> None:
    q = af.FIFOQueue(5, af.int32, shapes=[()])
    x = af.placeholder(af.int32, ())
    enq, deq = q.enqueue(x, name="put"), q.dequeue(name="take")
    trace = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    async with af.Session(graph=graph) as sess:
        md = af.RunMetadata()
        await sess.run(enq, {x: 7}, options=trace, run_metadata=md)
        assert {ns.node_name for ns in md.step_stats.dev_stats[0].node_stats} >= {"put"}
        assert await sess.run(deq, options=trace, run_metadata=md) == 7
        (take,) = [ns for ns in md.step_stats.dev_stats[0].node_stats if ns.node_name == "take"]
        assert take.output[0].dtype == "int32"
