"""A step with several async nodes runs their tasks in a group of its own
(``ExecutorOptions.own_task_group``, the default), or in an ``asyncio.TaskGroup`` (the general path).
Every test runs both: results, errors naming the node, deadlines, caller
cancellation (a kernel swallowing it still stops the step), ``Session.close``,
``BaseException`` from a kernel, thread kernels beside async ones; and after each
step no task of it is left, none is left cancelling, and the caller's task is as it
was."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.cancellation import awaiting, get_cancellation_manager, running
from asyncflow.runtime.step import current_step
from tests.closing import assert_closed, closed_run

if TYPE_CHECKING:
    from tests.conftest import Hangs


@pytest.fixture(params=["own", "taskgroup"])
def group(request: pytest.FixtureRequest) -> af.ExecutorOptions:
    """The step's own task group (the default), or an ``asyncio.TaskGroup``."""
    return af.ExecutorOptions(own_task_group=request.param == "own")


def _config(options: af.ExecutorOptions, **kwargs: Any) -> af.SessionConfig:
    return af.SessionConfig(executor_options=options, **kwargs)


def _pair(a_kernel: Any, b_kernel: Any) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """``y = (a(x) + b(x + 1)) * 2``: two async nodes outstanding at once."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        a = af.py_func(a_kernel, [x], af.float32, name="io_a")
        b = af.py_func(b_kernel, [x + 1.0], af.float32, name="io_b")
        y = (a + b) * 2.0
    return g, x, y


async def _echo(v: Any) -> Any:
    await asyncio.sleep(0)
    return v


def _assert_clean(before: set[asyncio.Task[Any]]) -> None:
    """No task of the step is left, and the caller's task is not cancelling."""
    me = asyncio.current_task()
    assert me is not None
    assert me.cancelling() == 0
    assert asyncio.all_tasks() == before


async def test_results_and_no_task_left(group: af.ExecutorOptions) -> None:
    g, x, y = _pair(_echo, _echo)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        for v in (1.0, 2.5, -3.0):
            assert await sess.run(y, {x: v}) == np.float32((v + v + 1.0) * 2.0)
        fn = sess.make_callable(y, feed_list=[x])
        assert await fn(1.0) == np.float32(6.0)
    _assert_clean(before)


async def test_many_async_nodes_and_concurrent_steps(group: af.ExecutorOptions) -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = af.add_n([af.py_func(_echo, [x * float(k)], af.float32) for k in range(8)])
        z = af.py_func(_echo, [y], af.float32) + af.py_func(_echo, [y + 1.0], af.float32)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        outs = await asyncio.gather(*(sess.run(z, {x: float(v)}) for v in range(20)))
        assert outs == [np.float32(2 * 28 * v + 1) for v in range(20)]
    _assert_clean(before)


async def test_error_names_the_node_and_cancels_the_other(
    group: af.ExecutorOptions, hanging_kernel: Hangs
) -> None:
    hang = hanging_kernel.async_kernel()

    async def bad(v: Any) -> Any:
        await hang.started.wait()
        raise ValueError("bad value")

    g, x, y = _pair(hang, bad)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="io_b") as info:
            await sess.run(y, {x: 1.0})
        assert "bad value" in str(info.value)
        assert hang.ended == ["cancelled"]
        g2, x2, y2 = _pair(_echo, _echo)
    async with af.Session(graph=g2, config=_config(group)) as sess:  # and a good step after it
        assert await sess.run(y2, {x2: 1.0}) == 6.0
    _assert_clean(before)


@pytest.mark.parametrize("swallow", [False, True])
async def test_deadline_cancels_both_kernels(
    group: af.ExecutorOptions, swallow: bool, hanging_kernel: Hangs
) -> None:
    a, b = hanging_kernel.async_kernel(swallow), hanging_kernel.async_kernel()
    g, x, y = _pair(a, b)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=30))
        assert a.ended == b.ended == ["cancelled"]
        await asyncio.sleep(0)  # no cancellation is left pending on this task
    _assert_clean(before)


@pytest.mark.parametrize("swallow", [False, True])
async def test_caller_cancellation_reaches_both_kernels(
    group: af.ExecutorOptions,
    swallow: bool,
    hanging_kernel: Hangs,
) -> None:
    a, b = (
        hanging_kernel.async_kernel(swallow),
        hanging_kernel.async_kernel(swallow),
    )  # swallowing kernels still end the step
    g, x, y = _pair(a, b)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        run = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await a.started.wait()
        await b.started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert a.ended == b.ended == ["cancelled"]
        assert sess.statistics().in_flight == 0
    _assert_clean(before)


async def test_caller_cancelled_again_while_kernels_stop(
    group: af.ExecutorOptions, hanging_kernel: Hangs
) -> None:
    """The step returns only after its kernels stopped, however often its caller is
    cancelled meanwhile."""
    stopping = asyncio.Event()
    release = asyncio.Event()
    ended: list[str] = []

    async def slow_to_stop(v: Any) -> Any:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            stopping.set()
            await release.wait()  # cleanup that takes a while
            ended.append("stopped")
            raise
        return v

    hang = hanging_kernel.async_kernel()
    g, x, y = _pair(slow_to_stop, hang)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        run = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await hang.started.wait()
        run.cancel()
        await stopping.wait()
        run.cancel()  # again, while the first kernel cleans up
        await asyncio.sleep(0.01)
        assert not run.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert ended == ["stopped"]
    _assert_clean(before)


async def test_a_failure_cancels_the_other_kernel_once(group: af.ExecutorOptions) -> None:
    """The first error cancels the other kernel once: its cleanup runs to the end
    (the step returns after it), it is not interrupted by a second cancellation."""
    release = asyncio.Event()
    stopping = asyncio.Event()
    started = asyncio.Event()
    ended: list[str] = []

    async def slow_to_stop(v: Any) -> Any:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            stopping.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                ended.append("interrupted")
                raise
            ended.append("stopped")
            raise
        return v

    async def bad(v: Any) -> Any:
        await started.wait()
        raise ValueError("bad value")

    g, x, y = _pair(slow_to_stop, bad)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        run = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await stopping.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not run.done()
        release.set()
        with pytest.raises(af.errors.InvalidArgumentError, match="io_b"):
            await run
        assert ended == ["stopped"]
    _assert_clean(before)


@pytest.mark.parametrize("swallow", [False, True])
async def test_close_aborts_the_step_without_cancelling_the_caller(
    group: af.ExecutorOptions,
    swallow: bool,
    hanging_kernel: Hangs,
) -> None:
    a, b = hanging_kernel.async_kernel(swallow), hanging_kernel.async_kernel()
    g, x, y = _pair(a, b)
    sess = af.Session(graph=g, config=_config(group))
    before = asyncio.all_tasks()
    task = asyncio.ensure_future(closed_run(sess, y, {x: 1.0}))
    await a.started.wait()
    await b.started.wait()
    await sess.close()
    assert_closed(await task)
    assert a.ended == b.ended == ["cancelled"]
    _assert_clean(before)


class _Abort(BaseException):
    """Neither an error nor a cancellation."""


async def test_base_exception_from_one_kernel_propagates_and_stops_the_other(
    group: af.ExecutorOptions,
    hanging_kernel: Hangs,
) -> None:
    hang = hanging_kernel.async_kernel()

    async def abort(v: Any) -> Any:
        await hang.started.wait()
        raise _Abort("stop everything")

    g, x, y = _pair(hang, abort)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        with pytest.raises(_Abort, match="stop everything"):
            await sess.run(y, {x: 1.0})
        assert hang.ended == ["cancelled"]
    _assert_clean(before)


async def test_cancellation_manager_fires_before_a_thread_kernel_is_cancelled(
    group: af.ExecutorOptions,
    hanging_kernel: Hangs,
) -> None:
    """A thread kernel beside an async one: on a deadline the manager is cancelled, so
    the thread stops early, and the step returns only after it did."""
    in_thread = threading.Event()
    seen: list[str] = []

    def poll(v: Any) -> Any:
        cm = get_cancellation_manager()
        assert cm is not None
        in_thread.set()
        for _ in range(2000):
            if cm.is_cancelled:
                seen.append("cancelled")
                return v
            threading.Event().wait(0.001)
        seen.append("ran out")
        return v

    hang = hanging_kernel.async_kernel()
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = af.py_func(hang, [x], af.float32, name="hang") + af.py_func(
            poll, [x], af.float32, expensive=True, name="poll"
        )
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=_config(group)) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=50))
        assert seen == ["cancelled"]
        assert hang.ended == ["cancelled"]
    _assert_clean(before)


async def test_the_running_step_is_the_kernels_own_partition(group: af.ExecutorOptions) -> None:
    """Async kernels find their own step through ``running()`` (what a function call
    joins for tracing), in a task or in the caller's task, on either device, also
    when a hand-off from the other device started them; none is left set after."""
    seen: dict[str, list[Any]] = {"a": [], "b": [], "c": []}

    def probe(name: str) -> Any:
        async def kernel(v: Any) -> Any:
            await asyncio.sleep(0)
            seen[name].append(running())
            return v

        return kernel

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        with af.device("/cpu:0"):
            a = af.py_func(probe("a"), [x], af.float32)
            b = af.py_func(probe("b"), [x + 1.0], af.float32)
        with af.device("/cpu:1"):
            c = af.py_func(probe("c"), [a * 2.0], af.float32)  # after a hand-off
        y = a + b + c
    async with af.Session(graph=g, config=_config(group, device_count={"CPU": 2})) as sess:
        assert await sess.run(y, {x: 1.0}) == np.float32(1.0 + 2.0 + 2.0)
        assert await sess.run(a + b, {x: 1.0}) == np.float32(3.0)
    assert current_step.get() is None
    assert awaiting == {}
    first_a, first_b, first_c = seen["a"][0], seen["b"][0], seen["c"][0]
    assert first_a is not None
    assert first_a is first_b  # one partition, one step
    assert first_c is not None
    assert first_c is not first_a  # the other partition's
    assert seen["a"][1] is seen["b"][1] is not None


@pytest.mark.parametrize("parts", [True, False])
async def test_py_func_parts_and_the_kernel_itself_agree(
    group: af.ExecutorOptions, parts: bool
) -> None:
    """``ExecutorOptions.kernel_parts``: an async py_func runs as its function and conversion, or as its
    kernel coroutine: same values, dtypes and errors naming the node, traced too."""
    group = dataclasses.replace(group, kernel_parts=parts)

    async def pair(v: Any) -> Any:
        await asyncio.sleep(0)
        return v, v * 2

    async def wrong_count(v: Any) -> Any:
        await asyncio.sleep(0)
        return v, v, v

    async def raises(v: Any) -> Any:
        await asyncio.sleep(0)
        raise KeyError("missing")

    async def two_args(v: Any, w: Any) -> Any:
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        p, q = af.py_func(pair, [x], [af.float32, af.int64], name="pair")
        y = af.py_func(_echo, [x], af.float64, name="echo") + af.cast(q, af.float64)
        bad_count = af.py_func(wrong_count, [x], [af.float32, af.float32], name="count")
        bad_raise = af.py_func(raises, [x], af.float32, name="raises") + p
        bad_call = af.py_func(two_args, [x], af.float32, name="call") + p
    async with af.Session(graph=g, config=_config(group)) as sess:
        out = await sess.run([p, q, y], {x: 1.5})
        assert out == [np.float32(1.5), np.int64(3), np.float64(4.5)]
        assert [np.asarray(v).dtype for v in out] == [np.float32, np.int64, np.float64]
        meta = af.RunMetadata()
        traced = await sess.run(
            y,
            {x: 2.0},
            options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE),
            run_metadata=meta,
        )
        assert traced == np.float64(6.0)
        with pytest.raises(af.errors.InvalidArgumentError, match="count"):
            await sess.run(bad_count, {x: 1.0})
        with pytest.raises(af.errors.OpError, match="raises") as info:
            await sess.run(bad_raise, {x: 1.0})
        assert isinstance(info.value.__cause__, KeyError)
        with pytest.raises(af.errors.OpError, match="call") as info:
            await sess.run(bad_call, {x: 1.0})
        assert isinstance(info.value.__cause__, TypeError)
        assert await sess.run(y, {x: 0.5}) == np.float64(1.5)  # still usable
