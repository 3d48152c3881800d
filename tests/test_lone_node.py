"""A step whose only pending work is one async node awaits it in the
caller's task (no task group, no task); everything else — results, errors naming the
node, deadlines, caller cancellation, aborts (``Session.close``, a failure on another
device) — behaves as on the task-group path, and the caller's task is left exactly
as it was (no stray cancellation, its context untouched)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.cancellation import awaiting, running
from asyncflow.runtime.step import current_step
from tests.closing import assert_closed, closed_run

if TYPE_CHECKING:
    from tests.conftest import Hangs

TWO = af.SessionConfig(device_count={"CPU": 2})

#: Every test twice: awaited by the driver's own loop and by ``Step.run``.
pytestmark = pytest.mark.usefixtures("awaited_both_ways")


def _graph(kernel: Any) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.py_func(kernel, [x + 1.0], af.float32, name="io") * 2.0
    return g, x, y


async def test_lone_kernel_runs_in_the_callers_task_and_the_first_of_parallel_ones_too() -> None:
    seen: list[Any] = []

    async def who(v: Any) -> Any:
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())
        return v

    g, x, y = _graph(who)
    with g.as_default():
        both = af.py_func(who, [x], af.float32) + af.py_func(who, [x], af.float32)
    async with af.Session(graph=g) as sess:
        me = asyncio.current_task()
        assert await sess.run(y, {x: 1.0}) == 4.0
        assert seen == [me]  # awaited right here: no task was made for it
        seen.clear()
        assert await sess.run(both, {x: 1.5}) == 3.0
        # The first of two parallel kernels is awaited right here, the other in a task.
        assert len(seen) == 2
        assert seen.count(me) == 1
        assert current_step.get() is None


async def test_lone_kernel_then_parallel_work_falls_back_to_the_task_group() -> None:
    async def slow(v: Any) -> Any:
        await asyncio.sleep(0.001)
        return v + np.float32(1)

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        a = af.py_func(slow, [x], af.float32)
        b = af.py_func(slow, [a], af.float32) + af.py_func(slow, [a * 2.0], af.float32)
    async with af.Session(graph=g) as sess:
        assert await sess.run(b, {x: 1.0}) == 3.0 + 5.0


async def test_lone_kernel_error_names_the_node_and_session_stays_usable() -> None:
    async def flaky(v: Any) -> Any:
        await asyncio.sleep(0)
        if v > 2:
            raise ValueError("bad value")
        return v

    g, x, y = _graph(flaky)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="io") as info:
            await sess.run(y, {x: 5.0})
        assert "test_lone_node.py" in str(info.value)
        assert await sess.run(y, {x: 0.5}) == 3.0
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_deadline_cancels_the_lone_kernel(hanging_kernel: Hangs) -> None:
    hang = hanging_kernel.async_kernel()
    g, x, y = _graph(hang)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=30))
        assert hang.ended == ["cancelled"]
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0)  # no cancellation is left pending on this task


async def test_caller_cancellation_reaches_the_lone_kernel(hanging_kernel: Hangs) -> None:
    hang = hanging_kernel.async_kernel()
    g, x, y = _graph(hang)
    async with af.Session(graph=g) as sess:
        run = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await hang.started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert hang.ended == ["cancelled"]
        assert sess.statistics().in_flight == 0


@pytest.mark.parametrize("swallow", [False, True])
async def test_close_aborts_the_lone_kernel_without_cancelling_the_caller(
    swallow: bool, hanging_kernel: Hangs
) -> None:
    hang = hanging_kernel.async_kernel(
        swallow
    )  # a kernel that swallows the cancellation still ends the step
    g, x, y = _graph(hang)
    sess = af.Session(graph=g)
    task = asyncio.ensure_future(closed_run(sess, y, {x: 1.0}))
    await hang.started.wait()
    await sess.close()
    assert_closed(await task)


async def test_failure_on_another_device_aborts_the_lone_kernel(hanging_kernel: Hangs) -> None:
    hang = hanging_kernel.async_kernel()

    async def fail(v: Any) -> Any:
        await hang.started.wait()
        raise RuntimeError("device 1 broke")

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        with af.device("/cpu:0"):
            a = af.py_func(hang, [x], af.float32, name="hang")
        with af.device("/cpu:1"):
            b = af.py_func(fail, [x], af.float32, name="fail")
        out = a + b
    async with af.Session(graph=g, config=TWO) as sess:
        with pytest.raises(af.errors.UnknownError, match="device 1 broke"):
            await sess.run(out, {x: 1.0})
        assert hang.ended == ["cancelled"]
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0)


@pytest.mark.parametrize("fails", [False, True])
async def test_lone_kernel_runs_in_its_callers_context_and_finds_its_step(
    fails: bool,
) -> None:
    """The step sets nothing in its caller's context while it waits (a context variable
    set is a new context map, two objects per step in flight): the kernel runs in the
    caller's context, numpy's error state and ``current_step`` as the caller has them,
    and finds its own step through ``running()`` (its cancellation manager too); the
    caller's values are the same objects afterwards, whether the step returned or
    failed, and nothing stays registered for the task."""
    seen: list[Any] = []

    async def look(v: Any) -> Any:
        await asyncio.sleep(0)
        seen.append(
            (np.geterr()["divide"], current_step.get(), running(), af.get_cancellation_manager())
        )
        if fails:
            raise ValueError("kernel says no")
        return v

    g, x, y = _graph(look)
    async with af.Session(graph=g) as sess:
        with np.errstate(divide="warn"):
            marker = object()
            outer = current_step.set(marker)  # type: ignore[arg-type]
            try:
                if fails:
                    with pytest.raises(af.errors.InvalidArgumentError, match="kernel says no"):
                        await sess.run(y, {x: 1.0})
                else:
                    assert await sess.run(y, {x: 1.0}) == 4.0
                assert current_step.get() is marker
                assert np.geterr()["divide"] == "warn"
            finally:
                current_step.reset(outer)
    assert len(seen) == 1
    divide, in_context, step, manager = seen[0]
    assert divide == "warn"  # the caller's, as any coroutine it awaits sees it
    assert in_context is marker
    assert step is not None
    assert step is not marker
    assert manager is step.cancellation_manager()
    assert awaiting == {}
    assert running() is None


async def test_inline_kernels_run_with_numpy_quiet_on_either_side_of_the_await() -> None:
    """The step's own code (the inline kernels it drains, before and after the kernel
    it awaits) runs with numpy's warnings off, as TF's kernels never warn."""

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        zero = af.constant(np.float32(0.0))
        before = af.divide(x, zero)  # inf, divide by zero: before the await
        waited = af.py_func(later, [before], af.float32, name="io")
        y = af.divide(af.minimum(waited, x), zero)  # 1 / 0 again, after it
    async with af.Session(graph=g) as sess:
        with np.errstate(all="raise"):
            assert await sess.run(y, {x: 1.0}) == np.inf


async def test_lone_kernel_raising_as_it_is_called_fails_its_node() -> None:
    """The kernel's call itself (not its await) raising is the node's failure too."""

    async def two_args(v: Any, w: Any) -> Any:
        return v

    g, x, y = _graph(two_args)  # called with one argument: TypeError at the call
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.OpError, match="io") as info:
            await sess.run(y, {x: 1.0})
        assert isinstance(info.value.__cause__, TypeError)
        assert current_step.get() is None
        assert await sess.run(x, {x: 1.0}) == 1.0
