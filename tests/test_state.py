"""State and resources: variables, FIFO queues, many concurrent steps on one session."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from tests.ordering import wait_in_flight

# -- variables ---------------------------------------------------------------------------


async def test_variable_lifecycle(graph: af.Graph) -> None:
    v = af.Variable(1.0, name="v")
    w = af.Variable(np.arange(3, dtype=np.int64), name="w")
    assert v.name == "v:0"
    assert v.op.name == "v"
    assert v.dtype is af.float32
    assert tuple(w.shape) == (3,)
    init = af.global_variables_initializer()
    assert af.global_variables() == [v, w]
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.FailedPreconditionError, match="uninitialized value v"):
            await sess.run(v)
        assert await sess.run(init) is None
        assert await sess.run(v) == 1.0
        np.testing.assert_array_equal(await sess.run(w), [0, 1, 2])
        assert await sess.run(v.assign(5.0)) == 5.0
        assert await sess.run(v.assign_add(2.0)) == 7.0
        assert await sess.run(v.assign_sub(10.0)) == -3.0
        assert await sess.run(v) == -3.0  # persists across runs
        assert await sess.run(v * 2.0) == -6.0  # usable as a tensor
        assert await sess.run(v + 1.0, {v: 100.0}) == 101.0  # fed for one step
        assert await sess.run(v) == -3.0


async def test_fetched_values_are_copies(graph: af.Graph) -> None:
    v = af.Variable(np.zeros(2, np.float32))
    async with af.Session(graph=graph) as sess:
        await sess.run(v.initializer)
        out = await sess.run(v)
        out[0] = 99.0
        np.testing.assert_array_equal(await sess.run(v), [0.0, 0.0])


async def test_read_after_write_through_control_dependencies(graph: af.Graph) -> None:
    v = af.Variable(0, name="counter")
    inc = v.assign_add(1)
    with af.control_dependencies([inc]):
        after = v.read_value()
    async with af.Session(graph=graph) as sess:
        await sess.run(v.initializer)
        for expected in (1, 2, 3):
            assert await sess.run(after) == expected


async def test_sessions_have_separate_variables(graph: af.Graph) -> None:
    v = af.Variable(1)
    async with af.Session(graph=graph) as a, af.Session(graph=graph) as b:
        await a.run(v.initializer)
        await a.run(v.assign(10))
        with pytest.raises(af.errors.FailedPreconditionError):
            await b.run(v)
        assert await a.run(v) == 10


def test_variable_build_errors(graph: af.Graph) -> None:
    v = af.Variable(1.0)
    with pytest.raises(TypeError):
        v.assign(np.array("text", dtype=object))
    with pytest.raises(ValueError, match="shape"):
        v.assign([1.0, 2.0])
    with pytest.raises(TypeError, match="bool"):
        bool(v)


async def test_untaken_branch_assign_never_runs(graph: af.Graph) -> None:
    v = af.Variable(0)
    p = af.placeholder(af.bool, shape=())
    out = af.cond(p, lambda: v.assign_add(1), lambda: af.constant(-1))
    async with af.Session(graph=graph) as sess:
        await sess.run(v.initializer)
        assert await sess.run(out, {p: False}) == -1
        assert await sess.run(v) == 0
        assert await sess.run(out, {p: True}) == 1
        assert await sess.run(v) == 1


async def test_thousand_concurrent_assign_adds(graph: af.Graph) -> None:
    v = af.Variable(0, name="hits")
    inc = v.assign_add(1)
    async with af.Session(graph=graph) as sess:
        await sess.run(v.initializer)
        await asyncio.gather(*(sess.run(inc) for _ in range(1000)))
        assert await sess.run(v) == 1000


async def test_concurrent_async_steps_updating_a_variable(graph: af.Graph) -> None:
    async def pause(x: Any) -> Any:
        await asyncio.sleep(0)
        return x

    v = af.Variable(0)
    inc = v.assign_add(af.reshape(af.py_func(pause, [af.constant(1)], af.int32), ()))
    async with af.Session(graph=graph) as sess:
        await sess.run(v.initializer)
        await asyncio.gather(*(sess.run(inc) for _ in range(300)))
        assert await sess.run(v) == 300


def test_threads_of_run_sync_assign_adds(graph: af.Graph) -> None:
    v = af.Variable(0)
    inc = v.assign_add(1)
    errors: list[BaseException] = []
    with af.Session(graph=graph) as sess:
        sess.run_sync(v.initializer)

        def worker() -> None:
            try:
                for _ in range(100):
                    sess.run_sync(inc)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sess.run_sync(v) == 400


# -- queues ------------------------------------------------------------------------------------


async def test_queue_fifo_order_and_components(graph: af.Graph) -> None:
    q = af.FIFOQueue(10, [af.int32, af.float32], shapes=[(), (2,)])
    x = af.placeholder(af.int32, ())
    enq = q.enqueue((x, af.fill([2], af.cast(x, af.float32))))
    deq = q.dequeue()
    assert isinstance(deq, list)
    async with af.Session(graph=graph) as sess:
        for i in range(3):
            await sess.run(enq, {x: i})
        assert await sess.run(q.size()) == 3
        for i in range(3):
            a, b = await sess.run(deq)
            assert a == i
            np.testing.assert_array_equal(b, [i, i])


async def test_enqueue_many_dequeue_many(graph: af.Graph) -> None:
    q = af.FIFOQueue(10, af.int64, shapes=[()])
    enq = q.enqueue_many(af.constant(np.arange(6, dtype=np.int64)))
    many = q.dequeue_many(4)
    one = q.dequeue()
    assert not isinstance(one, list)
    assert tuple(many.shape) == (4,)
    async with af.Session(graph=graph) as sess:
        await sess.run(enq)
        np.testing.assert_array_equal(await sess.run(many), [0, 1, 2, 3])
        assert await sess.run(one) == 4


async def test_full_queue_blocks_enqueue_and_empty_blocks_dequeue(graph: af.Graph) -> None:
    q = af.FIFOQueue(2, af.int32)
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x)
    deq = q.dequeue()
    async with af.Session(graph=graph) as sess:
        waiting = asyncio.create_task(sess.run(deq))
        await wait_in_flight(sess, 1)
        assert not waiting.done()
        await sess.run(enq, {x: 1})
        assert await waiting == 1
        await sess.run(enq, {x: 2})
        await sess.run(enq, {x: 3})
        blocked = asyncio.create_task(sess.run(enq, {x: 4}))
        await wait_in_flight(sess, 1)
        assert not blocked.done()
        # Waiting holds no thread: no worker thread was ever started for it.
        assert not any(t.name.startswith("asyncflow-") for t in threading.enumerate())
        assert await sess.run(deq) == 2
        await blocked
        assert [await sess.run(deq) for _ in range(2)] == [3, 4]


async def test_close_semantics(graph: af.Graph) -> None:
    q = af.FIFOQueue(5, af.int32)
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x)
    deq = q.dequeue()
    deq3 = q.dequeue_many(3)
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {x: 1})
        await sess.run(enq, {x: 2})
        blocked = asyncio.create_task(sess.run(deq3))
        await wait_in_flight(sess, 1)
        await sess.run(q.close())
        with pytest.raises(af.errors.OutOfRangeError, match="insufficient"):
            await blocked
        # The blocked dequeue_many took nothing: both elements are still there, in order.
        assert await sess.run(deq) == 1
        assert await sess.run(deq) == 2
        with pytest.raises(af.errors.OutOfRangeError):
            await sess.run(deq)
        with pytest.raises(af.errors.CancelledError, match="closed"):
            await sess.run(enq, {x: 3})


async def test_close_cancels_pending_enqueues(graph: af.Graph) -> None:
    q = af.FIFOQueue(1, af.int32)
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x)
    async with af.Session(graph=graph) as sess:
        await sess.run(enq, {x: 1})
        pending = asyncio.create_task(sess.run(enq, {x: 2}))
        await wait_in_flight(sess, 1)
        await sess.run(q.close(cancel_pending_enqueues=True))
        with pytest.raises(af.errors.CancelledError):
            await pending
        assert await sess.run(q.size()) == 1


async def test_wrong_component_shape(graph: af.Graph) -> None:
    q = af.FIFOQueue(5, af.float32, shapes=[(2,)])
    with pytest.raises(ValueError, match="shape"):
        q.enqueue(af.constant([1.0, 2.0, 3.0]))
    x = af.placeholder(af.float32, shape=None)
    enq = q.enqueue(x)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="Shape mismatch"):
            await sess.run(enq, {x: [1.0, 2.0, 3.0]})


async def test_shared_name(graph: af.Graph) -> None:
    a = af.FIFOQueue(5, af.int32, shared_name="shared")
    b = af.FIFOQueue(5, af.int32, shared_name="shared")
    bad = af.FIFOQueue(7, af.int32, shared_name="shared")
    async with af.Session(graph=graph) as sess:
        await sess.run(a.enqueue(42))
        assert await sess.run(b.dequeue()) == 42
        with pytest.raises(af.errors.InvalidArgumentError, match="capacity 5 vs 7"):
            await sess.run(bad.size())


async def test_producers_and_consumers_move_every_element_once(graph: af.Graph) -> None:
    q = af.FIFOQueue(4, af.int32)
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x)
    deq = q.dequeue()
    async with af.Session(graph=graph) as sess:
        producers = [sess.run(enq, {x: i}) for i in range(200)]
        consumers = [sess.run(deq) for _ in range(200)]
        results = await asyncio.gather(*producers, *consumers)
    got = sorted(int(v) for v in results[200:])
    assert got == list(range(200))


def test_queue_across_threads(graph: af.Graph) -> None:
    q = af.FIFOQueue(3, af.int32)
    x = af.placeholder(af.int32, ())
    enq = q.enqueue(x)
    deq = q.dequeue()
    received: list[int] = []
    with af.Session(graph=graph) as sess:

        def consume() -> None:
            for _ in range(50):
                received.append(int(sess.run_sync(deq)))

        def produce(base: int) -> None:
            for i in range(25):
                sess.run_sync(enq, {x: base + i})

        threads = [
            threading.Thread(target=consume),
            threading.Thread(target=produce, args=(0,)),
            threading.Thread(target=produce, args=(100,)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
    assert sorted(received) == [*range(25), *range(100, 125)]


async def test_session_close_cancels_steps_blocked_on_queues(graph: af.Graph) -> None:
    q = af.FIFOQueue(1, af.int32)
    deq = q.dequeue()
    sess = af.Session(graph=graph)
    blocked = asyncio.create_task(sess.run(deq))
    await wait_in_flight(sess, 1)
    await sess.close()
    with pytest.raises(af.errors.CancelledError):
        await blocked
    assert sess.statistics().in_flight == 0


# -- hypothesis: queue against a Python model -------------------------------------------------


Action = tuple[str, int]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["enq", "deq", "deq_many", "close", "size"]), st.integers(0, 3)),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 4),
)
def test_queue_matches_python_model(actions: list[Action], capacity: int) -> None:
    queue = _QueueModel(capacity)

    async def scenario() -> None:
        async with af.Session(graph=queue.graph) as sess:
            for kind, n in actions:
                await queue.act(sess, kind, n)
            assert await sess.run(queue.ops["size"]) == len(queue.model)

    asyncio.run(scenario())


class _QueueModel:
    """A FIFOQueue's graph ops beside a Python deque of what it must hold: each action
    runs on both and checks the queue against the model."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.graph = af.Graph()
        with self.graph.as_default():
            q = af.FIFOQueue(capacity, af.int32)
            self.x = af.placeholder(af.int32, ())
            self.ops: dict[str, Any] = {
                "enq": q.enqueue(self.x),
                "deq": q.dequeue(),
                "size": q.size(),
                "close": q.close(),
                **{f"deq_many{n}": q.dequeue_many(n) for n in range(4)},
            }
        self.model: collections.deque[int] = collections.deque()
        self.closed = False
        self.counter = 0

    async def act(self, sess: af.Session, kind: str, n: int) -> None:
        if kind == "enq":
            await self._enqueue(sess)
        elif kind in ("deq", "deq_many"):
            await self._dequeue(sess, 1 if kind == "deq" else n, kind == "deq")
        elif kind == "close":
            if self.closed:  # TF: closing a closed queue is CancelledError
                with pytest.raises(af.errors.CancelledError, match="already closed"):
                    await sess.run(self.ops["close"])
            else:
                await sess.run(self.ops["close"])
            self.closed = True
        else:
            assert await sess.run(self.ops["size"]) == len(self.model)

    async def _enqueue(self, sess: af.Session) -> None:
        feed = {self.x: self.counter}
        if self.closed:
            with pytest.raises(af.errors.CancelledError):
                await sess.run(self.ops["enq"], feed)
        elif len(self.model) < self.capacity:
            await sess.run(self.ops["enq"], feed)
            self.model.append(self.counter)
        else:
            # Full: the enqueue waits; a concurrent dequeue frees a slot.
            waiting = asyncio.create_task(sess.run(self.ops["enq"], feed))
            await wait_in_flight(sess, 1)
            assert not waiting.done()
            assert await sess.run(self.ops["deq"]) == self.model.popleft()
            await waiting
            self.model.append(self.counter)
        self.counter += 1

    async def _dequeue(self, sess: af.Session, want: int, single: bool) -> None:
        fetch = self.ops["deq"] if single else self.ops[f"deq_many{want}"]
        if len(self.model) >= want:
            got = await sess.run(fetch)
            expected = [self.model.popleft() for _ in range(want)]
            if single:
                assert got == expected[0]
            else:
                assert list(got) == expected
        elif self.closed:
            with pytest.raises(af.errors.OutOfRangeError):
                await sess.run(fetch)
        else:
            waiting = asyncio.create_task(sess.run(fetch))
            await wait_in_flight(sess, 1)
            assert not waiting.done()
            waiting.cancel()  # the model: nothing was taken
            with pytest.raises(asyncio.CancelledError):
                await waiting


async def test_assign_ops_land_with_their_variable(graph: af.Graph) -> None:
    with af.device("/cpu:1"):
        v = af.Variable(1.0, name="remote_var")
    with af.device("/cpu:0"):
        bump = v.assign_add(1.0, name="bump")  # colocation wins over the device scope
    md = af.RunMetadata()
    config = af.SessionConfig(device_count={"CPU": 2})
    async with af.Session(graph=graph, config=config) as sess:
        await sess.run(v.initializer)
        assert (
            await sess.run(
                bump, options=af.RunOptions(output_partition_graphs=True), run_metadata=md
            )
            == 2.0
        )
    where = {n["name"]: pg["device"] for pg in md.partition_graphs for n in pg["node"]}
    assert where["bump"].endswith("CPU:1")
