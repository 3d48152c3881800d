"""A finished step leaves no cyclic garbage, whatever its outcome (no GC
pauses on the hot path): after ``gc.collect()`` with the collector off, many steps
of one kind leave at most a few objects for the next collection (not some per step).
Step, propagator, task group, errors and their tracebacks are freed by reference
counting when the caller lets go of them."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from tests.ordering import wait_in_flight

STEPS = 30
#: Objects a whole batch of STEPS steps may leave (none per step).
SLACK = 5

TRACE = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)


@contextmanager
def _collector_off() -> Iterator[list[int]]:
    gc.collect()
    gc.disable()
    found: list[int] = []
    try:
        yield found
        found.append(gc.collect())
    finally:
        gc.enable()


def _graph() -> dict[str, Any]:
    """Every kind of node a step can run, on two devices."""
    x = af.placeholder(af.float32, shape=(), name="x")

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    async def never(v: Any) -> Any:
        await asyncio.sleep(60)
        return v

    async def fails(v: Any) -> Any:
        await asyncio.sleep(0)
        raise ValueError("kernel failed")

    def fails_inline(v: Any) -> Any:
        raise ValueError("inline kernel failed")

    def body(i: Any, t: Any, kernel: Any) -> tuple[Any, Any]:
        return i + 1, t + af.reshape(af.py_func(kernel, [x], af.float32), ())

    @af.Defun(af.float32)
    def triple(a: Any) -> Any:
        return a * 3.0

    q = af.FIFOQueue(4, af.float32, shapes=[()])
    with af.device("/cpu:1"):
        doubled = af.multiply(x, 2.0, name="doubled")
    start = [af.constant(0), af.constant(0.0)]
    return {
        "x": x,
        "inline": af.add(x, 1.0),
        "async": af.py_func(later, [x], af.float32),
        "never": af.py_func(never, [x], af.float32),
        "fails": af.py_func(fails, [x], af.float32, name="fails"),
        "fails_inline": af.py_func(fails_inline, [x], af.float32),
        "thread": af.py_func(lambda v: v, [x], af.float32, expensive=True),
        "loop": af.while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t + x), start)[1],
        "loop_fails": af.while_loop(lambda i, t: i < 3, lambda i, t: body(i, t, fails), start)[1],
        "loop_never": af.while_loop(lambda i, t: i < 3, lambda i, t: body(i, t, never), start)[1],
        "two_devices": doubled,
        "call": triple(x),
        "enqueue": q.enqueue(x),
        "dequeue": q.dequeue(),
        # Two async nodes at once: the step's own task group (or asyncio's).
        "pair": af.py_func(later, [x], af.float32) + af.py_func(later, [x + 1.0], af.float32),
        "pair_fails": af.py_func(fails, [x], af.float32, name="fails_beside")
        + af.py_func(never, [x], af.float32),
        "pair_never": af.py_func(never, [x], af.float32) + af.py_func(never, [x], af.float32),
    }


Scenario = Callable[[af.Session, dict[str, Any]], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


def _feed(ops: dict[str, Any]) -> dict[Any, float]:
    return {ops["x"]: 1.0}


async def _fails_with(error: type[BaseException], run: Awaitable[Any]) -> None:
    with pytest.raises(error):
        await run


async def _in_a_task(run: Awaitable[Any]) -> BaseException | None:
    """Run in a task the caller lets go of: the task holds its exception."""
    tasks = [asyncio.ensure_future(run)]
    await asyncio.wait(tasks)
    error = tasks[0].exception()
    tasks.clear()
    return error


async def _cancelled_by_the_caller(sess: af.Session, run: Awaitable[Any]) -> None:
    """Run in a task, cancel it while it runs, and let go of it."""
    tasks = [asyncio.ensure_future(run)]
    await wait_in_flight(sess, 1)
    tasks[0].cancel()
    await asyncio.wait(tasks)
    assert tasks[0].cancelled()
    tasks.clear()


@scenario
async def inline(sess: af.Session, ops: dict[str, Any]) -> None:
    await sess.run(ops["inline"], _feed(ops))


@scenario
async def async_kernel(sess: af.Session, ops: dict[str, Any]) -> None:
    await sess.run(ops["async"], _feed(ops))


@scenario
async def thread_kernel(sess: af.Session, ops: dict[str, Any]) -> None:
    await sess.run(ops["thread"], _feed(ops))


@scenario
async def kernel_error(sess: af.Session, ops: dict[str, Any]) -> None:
    await _fails_with(af.errors.InvalidArgumentError, sess.run(ops["fails"], _feed(ops)))
    await _fails_with(af.errors.InvalidArgumentError, sess.run(ops["fails_inline"], _feed(ops)))


@scenario
async def kernel_error_held_by_a_task(sess: af.Session, ops: dict[str, Any]) -> None:
    error = await _in_a_task(sess.run(ops["fails"], _feed(ops)))
    assert isinstance(error, af.errors.InvalidArgumentError)


@scenario
async def deadline(sess: af.Session, ops: dict[str, Any]) -> None:
    options = af.RunOptions(timeout_in_ms=1)
    await _fails_with(
        af.errors.DeadlineExceededError, sess.run(ops["never"], _feed(ops), options=options)
    )
    error = await _in_a_task(sess.run(ops["never"], _feed(ops), options=options))
    assert isinstance(error, af.errors.DeadlineExceededError)


@scenario
async def cancelled_by_the_caller(sess: af.Session, ops: dict[str, Any]) -> None:
    await _cancelled_by_the_caller(sess, sess.run(ops["never"], _feed(ops)))


@scenario
async def traced(sess: af.Session, ops: dict[str, Any]) -> None:
    for fetch in ("inline", "async", "loop", "two_devices"):
        md = af.RunMetadata()
        await sess.run(ops[fetch], _feed(ops), options=TRACE, run_metadata=md)
        assert md.step_stats.dev_stats[0].node_stats


@scenario
async def loops(sess: af.Session, ops: dict[str, Any]) -> None:
    assert await sess.run(ops["loop"], _feed(ops)) == 3.0
    await _fails_with(af.errors.InvalidArgumentError, sess.run(ops["loop_fails"], _feed(ops)))
    await _fails_with(
        af.errors.DeadlineExceededError,
        sess.run(ops["loop_never"], _feed(ops), options=af.RunOptions(timeout_in_ms=1)),
    )


@scenario
async def two_devices(sess: af.Session, ops: dict[str, Any]) -> None:
    assert await sess.run(ops["two_devices"], _feed(ops)) == 2.0
    error = await _in_a_task(sess.run([ops["two_devices"], ops["fails"]], _feed(ops)))
    assert isinstance(error, af.errors.InvalidArgumentError)
    await _fails_with(
        af.errors.DeadlineExceededError,
        sess.run(
            [ops["two_devices"], ops["never"]], _feed(ops), options=af.RunOptions(timeout_in_ms=1)
        ),
    )
    tasks = [asyncio.ensure_future(sess.run([ops["two_devices"], ops["never"]], _feed(ops)))]
    await wait_in_flight(sess, 1)
    tasks[0].cancel()
    await asyncio.wait(tasks)
    tasks.clear()


@scenario
async def queues(sess: af.Session, ops: dict[str, Any]) -> None:
    await sess.run(ops["enqueue"], _feed(ops))  # at once
    assert await sess.run(ops["dequeue"]) == 1.0
    waiting = [asyncio.ensure_future(sess.run(ops["dequeue"]))]  # waits for an element
    await asyncio.sleep(0)
    await sess.run(ops["enqueue"], _feed(ops))
    await asyncio.wait(waiting)
    waiting.clear()
    await _fails_with(
        af.errors.DeadlineExceededError,
        sess.run(ops["dequeue"], options=af.RunOptions(timeout_in_ms=1)),
    )


@scenario
async def function_calls(sess: af.Session, ops: dict[str, Any]) -> None:
    assert await sess.run(ops["call"], _feed(ops)) == 3.0


@scenario
async def streams(sess: af.Session, ops: dict[str, Any]) -> None:
    got = [value async for _, value in sess.run_stream([ops["inline"], ops["async"]], _feed(ops))]
    assert sorted(got) == [1.0, 2.0]


async def _parallel(sess: af.Session, ops: dict[str, Any]) -> None:
    assert await sess.run(ops["pair"], _feed(ops)) == 3.0
    await _fails_with(af.errors.InvalidArgumentError, sess.run(ops["pair_fails"], _feed(ops)))
    error = await _in_a_task(sess.run(ops["pair_fails"], _feed(ops)))
    assert isinstance(error, af.errors.InvalidArgumentError)
    await _fails_with(
        af.errors.DeadlineExceededError,
        sess.run(ops["pair_never"], _feed(ops), options=af.RunOptions(timeout_in_ms=1)),
    )
    await _cancelled_by_the_caller(sess, sess.run(ops["pair_never"], _feed(ops)))


@scenario
async def parallel_async_kernels(sess: af.Session, ops: dict[str, Any]) -> None:
    await _parallel(sess, ops)


@scenario
async def parallel_async_kernels_in_a_task_group(sess: af.Session, ops: dict[str, Any]) -> None:
    await _parallel(sess, ops)  # the session's steps use asyncio.TaskGroup: _OPTIONS


#: Scenarios run by a session with other executor options than the default.
_OPTIONS = {"parallel_async_kernels_in_a_task_group": af.ExecutorOptions(own_task_group=False)}


_NO_INLINING = af.GraphOptions(optimizer_options=af.OptimizerOptions(do_function_inlining=False))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_steps_leave_no_cyclic_garbage(graph: af.Graph, name: str) -> None:
    ops = _graph()
    config = af.SessionConfig(
        device_count={"CPU": 2},
        graph_options=_NO_INLINING,
        executor_options=_OPTIONS.get(name, af.ExecutorOptions()),
    )
    async with af.Session(graph=graph, config=config) as sess:
        run = SCENARIOS[name]
        for _ in range(2):
            await run(sess, ops)  # compiles, binds, warms every cache
        with _collector_off() as found:
            for _ in range(STEPS):
                await run(sess, ops)
            await asyncio.sleep(0.01)  # callbacks of cancelled kernels run
    assert found[0] <= SLACK, f"{found[0]} cyclic objects after {STEPS} x {name}"


def test_run_sync_leaves_no_cyclic_garbage(graph: af.Graph) -> None:
    ops = _graph()
    config = af.SessionConfig(device_count={"CPU": 2})
    feed = _feed(ops)
    with af.Session(graph=graph, config=config) as sess:

        def run() -> None:
            assert sess.run_sync(ops["inline"], feed) == 2.0  # no loop at all
            assert sess.run_sync(ops["async"], feed) == 1.0  # the session's loop
            with pytest.raises(af.errors.InvalidArgumentError):
                sess.run_sync(ops["fails"], feed)
            with pytest.raises(af.errors.DeadlineExceededError):
                sess.run_sync(ops["never"], feed, options=af.RunOptions(timeout_in_ms=1))
            md = af.RunMetadata()
            sess.run_sync(ops["two_devices"], feed, options=TRACE, run_metadata=md)
            assert np.isclose(sess.run_sync(ops["loop"], feed), 3.0)

        for _ in range(2):
            run()
        with _collector_off() as found:
            for _ in range(STEPS):
                run()
    assert found[0] <= SLACK, f"{found[0]} cyclic objects after {STEPS} rounds"
