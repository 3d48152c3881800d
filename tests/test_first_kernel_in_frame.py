"""A step whose pending work is several async nodes (a service's step: two I/O calls)
awaits the first one in the caller's task and runs only the others as tasks of its own
group; every outcome rule holds as on the all-tasks path: results, the first error
naming its node (wherever it ran), the caller's cancellation and deadlines reaching
every kernel, and no task or cancellation left behind."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.propagators import CHECK_EVERY
from asyncflow.runtime.step import SLICE
from tests.closing import assert_closed, closed_run

if TYPE_CHECKING:
    from tests.conftest import Hangs

#: Every test twice: awaited by the driver's own loop and by ``Step.run``.
pytestmark = pytest.mark.usefixtures("awaited_both_ways")


def _two(a: Any, b: Any) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """``(a(x) + b(x + 1)) * 2``: two async kernels, both ready at once."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        first = af.py_func(a, [x], af.float32, name="first")
        second = af.py_func(b, [x + 1.0], af.float32, name="second")
        y = (first + second) * 2.0
    return g, x, y


async def _quick(v: Any) -> Any:
    await asyncio.sleep(0)
    return v


async def _fails(v: Any) -> Any:
    await asyncio.sleep(0)
    raise ValueError("kernel says no")


def _others() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_the_first_kernel_runs_in_the_callers_task_the_other_in_one_task() -> None:
    where: dict[str, asyncio.Task[Any] | None] = {}
    made: list[int] = []

    def kernel(name: str) -> Any:
        async def run(v: Any) -> Any:
            where[name] = asyncio.current_task()
            made.append(len(_others()))
            await asyncio.sleep(0)
            return v

        return run

    g, x, y = _two(kernel("first"), kernel("second"))
    async with af.Session(graph=g) as sess:
        me = asyncio.current_task()
        assert await sess.run(y, {x: 1.0}) == 6.0
        # The first dispatched (the ready stack's order) runs here, the other in a task.
        assert [where["first"], where["second"]].count(me) == 1
        assert max(made) == 1  # one task beside the caller's, not two
        assert not _others()
        assert me is not None
        assert me.cancelling() == 0


async def test_the_in_frame_kernel_failing_cancels_the_task_beside_it(
    hanging_kernel: Hangs,
) -> None:
    hang = hanging_kernel.async_kernel()
    g, x, y = _two(_fails, hang)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="first") as info:
            await sess.run(y, {x: 1.0})
        assert "kernel says no" in str(info.value)
        assert hang.ended == ["cancelled"]  # stopped before run returned
        assert not _others()
        assert await sess.run(x, {x: 1.0}) == 1.0  # the session stays usable


async def test_the_task_failing_cancels_the_kernel_in_the_callers_frame(
    hanging_kernel: Hangs,
) -> None:
    hang = hanging_kernel.async_kernel()
    g, x, y = _two(hang, _fails)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="second"):
            await sess.run(y, {x: 1.0})
        assert hang.ended == ["cancelled"]
        assert not _others()
        me = asyncio.current_task()
        assert me is not None
        assert me.cancelling() == 0  # the step's abort taken back


@pytest.mark.parametrize("swallow", [False, True])
async def test_cancelling_the_caller_stops_both_kernels(
    hanging_kernel: Hangs, swallow: bool
) -> None:
    first = hanging_kernel.async_kernel(swallow=swallow)
    second = hanging_kernel.async_kernel()
    g, x, y = _two(first, second)
    async with af.Session(graph=g) as sess:
        caller = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await first.started.wait()
        await second.started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert first.ended == ["cancelled"]
        assert second.ended == ["cancelled"]
        assert not _others()
        assert sess.statistics().in_flight == 0


async def test_a_deadline_names_both_kernels_still_running(hanging_kernel: Hangs) -> None:
    first = hanging_kernel.async_kernel()
    second = hanging_kernel.async_kernel()
    g, x, y = _two(first, second)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DeadlineExceededError, match=r"first.*second"):
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=50))
        assert first.ended == ["cancelled"]
        assert second.ended == ["cancelled"]
        assert not _others()


@pytest.mark.parametrize("gate_first", [True, False])
async def test_a_drain_that_yields_beside_the_awaited_kernel_goes_on_from_the_loop(
    gate_first: bool,
) -> None:
    """The task's kernel finishes; what it readies is inline work longer than a time
    slice, then the node the kernel awaited in the caller's frame waits for: the drain
    yields, and with no loop of the step waiting, it must go on from the event loop
    (else the step would hang until the awaited kernel's own timeout)."""
    gate = asyncio.Event()

    async def waits_for_gate(v: Any) -> Any:
        await gate.wait()
        return v

    def slow(v: Any) -> Any:
        time.sleep(SLICE * 3)  # longer than one time slice: the drain yields after it
        return v

    def opens(v: Any) -> Any:
        gate.set()
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        # (Either creation order: one of them puts the gate's kernel in the caller's
        # frame, the path this is about.)
        if gate_first:
            first = af.py_func(waits_for_gate, [x], af.float32, name="first")
            second = af.py_func(_quick, [x], af.float32, name="second")
        else:
            second = af.py_func(_quick, [x], af.float32, name="second")
            first = af.py_func(waits_for_gate, [x], af.float32, name="first")
        after = af.py_func(slow, [second], af.float32, name="slow")
        for _ in range(CHECK_EVERY + 8):  # the clock is looked at every CHECK_EVERY nodes
            after = after * 1.0
        opened = af.py_func(opens, [after], af.float32, name="opens")
        y = first + opened
    async with af.Session(graph=g) as sess:
        async with asyncio.timeout(10):
            assert await sess.run(y, {x: np.float32(1.0)}) == 2.0
        assert not _others()


async def test_with_an_asyncio_task_group_every_kernel_is_a_task() -> None:
    where: list[asyncio.Task[Any] | None] = []

    async def kernel(v: Any) -> Any:
        where.append(asyncio.current_task())
        await asyncio.sleep(0)
        return v

    g, x, y = _two(kernel, kernel)
    config = af.SessionConfig(executor_options=af.ExecutorOptions(own_task_group=False))
    async with af.Session(graph=g, config=config) as sess:
        assert await sess.run(y, {x: 1.0}) == 6.0
        assert asyncio.current_task() not in where
        assert len(where) == 2


# -- the first kernel returned, the other still runs: the frame awaits the step's wake-up


class _Phase(NamedTuple):
    """A step whose in-frame kernel returns at once while its task kernel hangs."""

    graph: af.Graph
    x: af.Tensor
    y: af.Tensor
    returned: asyncio.Event  # set as the in-frame kernel returns
    where: dict[str, asyncio.Task[Any] | None]  # the task each kernel ran in


def _first_returns(hang: Any) -> _Phase:
    """``_two`` whose in-frame kernel (``second``, the one the ready stack dispatches
    first) returns at once and whose task kernel (``first``) is ``hang``.  Once
    ``returned`` is set, the caller's task goes on, without yielding, into awaiting
    the step's wake-up future: by the time anything else runs after the event, the
    step waits for its task there."""
    returned = asyncio.Event()
    where: dict[str, asyncio.Task[Any] | None] = {}

    async def returns(v: Any) -> Any:
        where["second"] = asyncio.current_task()
        await asyncio.sleep(0)
        returned.set()
        return v

    async def hangs(v: Any) -> Any:
        where["first"] = asyncio.current_task()
        return await hang(v)

    g, x, y = _two(hangs, returns)
    return _Phase(g, x, y, returned, where)


def _awaiting(task: asyncio.Task[Any]) -> list[str]:
    """What ``task`` is suspended in: its coroutines' names, outermost first, then the
    type of what the innermost awaits."""
    chain: list[str] = []
    at: Any = task.get_coro()
    while inspect.iscoroutine(at):
        chain.append(at.cr_code.co_qualname)
        at = at.cr_await
    return [*chain, type(at).__name__]


@pytest.mark.parametrize("swallow", [False, True])
async def test_cancelling_the_caller_while_it_waits_for_the_task_stops_it(
    hanging_kernel: Hangs, swallow: bool
) -> None:
    hang = hanging_kernel.async_kernel(swallow=swallow)
    g, x, y, returned, where = _first_returns(hang)
    async with af.Session(graph=g) as sess:
        caller = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await returned.wait()
        await hang.started.wait()
        assert where["second"] is caller  # the in-frame kernel, returned
        assert where["first"] is not caller  # the one in the step's task, hanging
        # The awaiting frame (the driver's, or Step.run's under a deadline) awaits the
        # step's wake-up future itself: no coroutine of the step's waiting loop.
        chain = _awaiting(caller)
        assert chain[-2] in ("Session._drive", "Step.run"), chain
        assert chain[-1] == "FutureIter", chain
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert hang.ended == ["cancelled"]  # stopped before the caller's cancel ended
        assert not _others()
        assert sess.statistics().in_flight == 0
        assert await sess.run(x, {x: 1.0}) == 1.0


async def test_a_deadline_while_the_caller_waits_for_the_task_names_that_kernel(
    hanging_kernel: Hangs,
) -> None:
    hang = hanging_kernel.async_kernel()
    g, x, y, returned, _ = _first_returns(hang)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DeadlineExceededError, match="first") as info:
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=50))
        assert returned.is_set()
        assert "'second'" not in str(info.value)  # it had returned
        assert hang.ended == ["cancelled"]
        assert not _others()


async def test_the_callers_cancel_reaches_the_cancellation_manager_before_the_task() -> None:
    """A kernel that watches the step's cancellation manager (a thread kernel would
    poll it) finds it cancelled by the time its own task is cancelled."""
    seen: list[bool] = []
    watching = asyncio.Event()

    async def watches(v: Any) -> Any:
        manager = af.get_cancellation_manager()
        assert manager is not None
        watching.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.Event().wait()  # until its task is cancelled
        finally:
            seen.append(manager.is_cancelled)
        return v

    g, x, y, returned, _ = _first_returns(watches)
    async with af.Session(graph=g) as sess:
        caller = asyncio.ensure_future(sess.run(y, {x: 1.0}))
        await returned.wait()
        await watching.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert seen == [True]
        assert not _others()


@pytest.mark.parametrize("swallow", [False, True])
async def test_close_while_the_caller_waits_for_the_task_fails_the_step_not_the_caller(
    hanging_kernel: Hangs, swallow: bool
) -> None:
    hang = hanging_kernel.async_kernel(swallow=swallow)
    g, x, y, returned, _ = _first_returns(hang)
    sess = af.Session(graph=g)
    task = asyncio.ensure_future(closed_run(sess, y, {x: 1.0}))
    await returned.wait()
    await hang.started.wait()
    await sess.close()
    assert_closed(await task)
    assert hang.ended == ["cancelled"]


async def test_the_task_failing_while_the_caller_waits_for_it_names_its_node() -> None:
    g, x, y, returned, _ = _first_returns(_fails)
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="first"):
            await sess.run(y, {x: 1.0})
        assert returned.is_set()
        assert not _others()
        assert await sess.run(x, {x: 1.0}) == 1.0  # the session stays usable
