"""Edge cases of the core (session, executor, devices, plan) found in review.

Each test pins a behaviour that was once wrong (a hang, a wrong error, a derived
error winning, a cache collision) or that was checked and found right, so that no
later change regresses it.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import subprocess
import sys
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import asyncflow as af

if TYPE_CHECKING:
    from tests.conftest import Hangs

# -- helpers ---------------------------------------------------------------------------


def _run_isolated(code: str, timeout: float = 5.0) -> str:
    """Run ``code`` in a fresh interpreter (for bugs that hang a loop forever)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.stdout.strip()


def _worker_names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("asyncflow-")]


# == kernels raising unusual exceptions ================================================


async def test_async_kernel_raising_cancelled_error_fails_the_step(graph: af.Graph) -> None:
    async def bad(v: Any) -> Any:
        raise asyncio.CancelledError()  # e.g. awaited a future someone else cancelled

    y = af.py_func(bad, [af.constant(1.0)], af.float32, name="bad")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.OpError) as info:
            await asyncio.wait_for(sess.run(y), 0.5)
    assert info.value.node_name == "bad"


async def test_thread_kernel_raising_cancelled_error_fails_the_step(graph: af.Graph) -> None:
    def bad(v: Any) -> Any:
        raise asyncio.CancelledError()

    y = af.py_func(bad, [af.constant(1.0)], af.float32, expensive=True, name="bad")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.OpError) as info:
            await asyncio.wait_for(sess.run(y), 0.5)
    assert info.value.node_name == "bad"


def test_thread_kernel_raising_stop_iteration_is_out_of_range() -> None:
    out = _run_isolated("""
        import os, threading, asyncflow as af
        g = af.Graph()
        with g.as_default():
            it = iter(())
            y = af.py_func(lambda v: next(it), [af.constant(1.0)], af.float32,
                           expensive=True, name="exhausted")
        sess = af.Session(g)
        result = []
        def run():
            try:
                sess.run_sync(y, options=af.RunOptions(timeout_in_ms=200))
            except BaseException as exc:
                result.append(f"{type(exc).__name__} {getattr(exc, 'node_name', None)}")
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(1.0)
        print(result[0] if result else "HUNG", flush=True)
        os._exit(0)  # a hung step would otherwise keep the interpreter from exiting
    """)
    assert out == "OutOfRangeError exhausted"


class _Abort(BaseException):
    """A BaseException that is neither cancellation nor KeyboardInterrupt/SystemExit."""


async def test_base_exception_from_async_kernel_propagates_unwrapped(graph: af.Graph) -> None:
    async def bad(v: Any) -> Any:
        raise _Abort("stop everything")

    y = af.py_func(bad, [af.constant(1.0)], af.float32, name="bad")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(_Abort):
            await sess.run(y)


@pytest.mark.parametrize("kind", ["inline", "async", "thread"])
def test_keyboard_interrupt_propagates(graph: af.Graph, kind: str) -> None:
    """KeyboardInterrupt from any kind of kernel reaches run_sync's caller as itself.

    Run in a worker thread so that an escaping KeyboardInterrupt cannot stop pytest.
    """

    def ki(v: Any) -> Any:
        raise KeyboardInterrupt("from kernel")

    async def aki(v: Any) -> Any:
        raise KeyboardInterrupt("from kernel")

    x = af.constant(1.0)
    if kind == "async":
        y = af.py_func(aki, [x], af.float32)
    else:
        y = af.py_func(ki, [x], af.float32, expensive=(kind == "thread"))
    seen: list[type[BaseException]] = []
    sess = af.Session(graph=graph)

    def call() -> None:
        try:
            sess.run_sync(y)
        except BaseException as exc:  # inspected below
            seen.append(type(exc))
        # asyncio.run leaves the interrupted task's exception unretrieved; let it be
        # collected (and logged) here, not concurrently with pytest in the main thread
        # (CPython 3.11's traceback formatting uses ast, which is not thread-safe).
        gc.collect()

    t = threading.Thread(target=call)
    t.start()
    t.join(5)
    sess.close_sync()
    assert seen == [KeyboardInterrupt]
    assert sess.statistics().in_flight == 0


async def test_multi_output_kernel_wrong_count_names_node(graph: af.Graph) -> None:
    def two(v: Any) -> Any:
        return [v, v, v]

    async def atwo(v: Any) -> Any:
        return (v,)

    x = af.constant(1.0)
    for fn, expensive, name in [(two, False, "inl"), (two, True, "thr"), (atwo, False, "asy")]:
        outs = af.py_func(fn, [x], [af.float32, af.float32], expensive=expensive, name=name)
        async with af.Session(graph=graph) as sess:
            with pytest.raises(af.errors.InvalidArgumentError) as info:
                await sess.run(outs[1])
        assert info.value.node_name == name
        assert "2 values" in str(info.value)


# == first error, deadlines, cancellation, close ======================================


async def test_first_error_wins_over_a_later_deadline(graph: af.Graph) -> None:
    loop = asyncio.get_running_loop()
    thread_started = asyncio.Event()

    def slow(v: Any) -> Any:
        loop.call_soon_threadsafe(thread_started.set)
        time.sleep(0.25)  # outlives the 30 ms deadline; cannot be interrupted
        return v

    async def failing(v: Any) -> Any:
        await thread_started.wait()
        raise ValueError("root cause")

    x = af.constant(1.0)
    a = af.py_func(slow, [x], af.float32, expensive=True, name="slow")
    b = af.py_func(failing, [x], af.float32, name="failing")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.OpError) as info:
            await sess.run(af.add(a, b), options=af.RunOptions(timeout_in_ms=30))
    assert info.value.node_name == "failing"
    assert "root cause" in str(info.value)


async def test_deadline_waits_for_thread_kernel(
    graph: af.Graph, no_leaked_threads: None, hanging_kernel: Hangs
) -> None:
    blocked = hanging_kernel.thread_kernel()

    y = af.py_func(blocked, [af.constant(1.0)], af.float32, expensive=True)
    async with af.Session(graph=graph) as sess:
        task = asyncio.create_task(sess.run(y, options=af.RunOptions(timeout_in_ms=20)))
        await blocked.wait_started()
        await asyncio.sleep(0.06)  # past the deadline
        assert not task.done()  # the deadline fired but the kernel still runs
        blocked.release()
        with pytest.raises(af.errors.DeadlineExceededError):
            await task
        assert blocked.finished == 1
        assert sess.statistics().in_flight == 0
    assert len(asyncio.all_tasks()) == 1


async def test_cancel_caller_while_thread_kernel_runs(
    graph: af.Graph,
    no_leaked_threads: None,
    hanging_kernel: Hangs,
) -> None:
    blocked = hanging_kernel.thread_kernel()

    other = hanging_kernel.async_kernel()
    x = af.constant(1.0)
    y = af.add(
        af.py_func(blocked, [x], af.float32, expensive=True), af.py_func(other, [x], af.float32)
    )
    async with af.Session(graph=graph) as sess:
        task = asyncio.create_task(sess.run(y))
        await blocked.wait_started()
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # still waiting for the thread
        blocked.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert blocked.finished == 1
        assert sess.statistics().in_flight == 0
    assert len(asyncio.all_tasks()) == 1


async def test_no_node_starts_after_the_caller_was_cancelled(
    graph: af.Graph, hanging_kernel: Hangs
) -> None:
    ran_after_cancel: list[bool] = []
    # finishes cleanly when cancelled instead of re-raising (e.g. cleanup code)
    stubborn = hanging_kernel.async_kernel(swallow=True)

    def record(v: Any) -> Any:
        ran_after_cancel.append(True)
        return v

    s = af.py_func(stubborn, [af.constant(1.0)], af.float32)
    y = af.py_func(record, [s], af.float32, name="record")
    async with af.Session(graph=graph) as sess:
        task = asyncio.create_task(sess.run(y))
        await stubborn.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert ran_after_cancel == []


def test_close_cancels_steps_on_other_threads_loops(
    graph: af.Graph, no_leaked_threads: None
) -> None:
    n = 3
    lock = threading.Lock()
    count = [0]
    all_started = threading.Event()
    release = threading.Event()
    thread_done: list[bool] = []

    async def forever(v: Any) -> Any:
        with lock:
            count[0] += 1
            if count[0] == n:
                all_started.set()
        await asyncio.sleep(30)
        return v

    def blocked(v: Any) -> Any:
        release.wait(5)
        thread_done.append(True)
        return v

    x = af.constant(1.0)
    y = af.add(
        af.py_func(forever, [x], af.float32), af.py_func(blocked, [x], af.float32, expensive=True)
    )
    sess = af.Session(graph=graph, config=af.SessionConfig(inter_op_parallelism_threads=n))
    errors_seen: list[BaseException] = []

    def worker() -> None:
        try:
            sess.run_sync(y)
        except BaseException as exc:  # inspected below
            errors_seen.append(exc)

    workers = [threading.Thread(target=worker) for _ in range(n)]
    for t in workers:
        t.start()
    assert all_started.wait(5)
    closer = threading.Thread(target=sess.close_sync)
    closer.start()
    closer.join(0.05)
    assert closer.is_alive()  # close waits for the thread kernels
    release.set()
    closer.join(5)
    for t in workers:
        t.join(5)
    assert len(thread_done) == n
    assert len(errors_seen) == n
    assert all(type(e) is af.errors.CancelledError for e in errors_seen)
    assert sess.statistics().in_flight == 0
    with pytest.raises(RuntimeError, match="closed"):
        sess.run_sync(y)


async def test_concurrent_runs_each_get_their_own_error(graph: af.Graph) -> None:
    async def maybe_fail(v: Any) -> Any:
        await asyncio.sleep(0)
        if int(v) % 2:
            raise ValueError(f"odd {int(v)}")
        return v

    x = af.placeholder(af.float32, name="x")
    y = af.multiply(af.py_func(maybe_fail, [x], af.float32, name="maybe"), 2.0)
    async with af.Session(graph=graph) as sess:
        results = await asyncio.gather(
            *(sess.run(y, {x: float(i)}) for i in range(40)), return_exceptions=True
        )
        assert sess.statistics().in_flight == 0
    for i, r in enumerate(results):
        if i % 2:
            assert type(r) is af.errors.InvalidArgumentError
            assert f"odd {i}" in str(r)
            assert r.node_name == "maybe"
        else:
            assert r == 2.0 * i


def test_concurrent_run_sync_with_thread_kernels(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.add(af.py_func(lambda v: v * 2, [x], af.float32, expensive=True), 1.0)
    failures: list[BaseException] = []
    with af.Session(graph=graph, config=af.SessionConfig(inter_op_parallelism_threads=2)) as sess:

        def worker(k: int) -> None:
            try:
                for i in range(20):
                    assert sess.run_sync(y, {x: float(k * 100 + i)}) == 2 * (k * 100 + i) + 1
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    assert _worker_names() == []


async def test_outstanding_count_returns_to_zero(graph: af.Graph) -> None:
    from asyncflow.runtime.call_frame import CallFrame
    from asyncflow.runtime.step import Step

    async def hop(v: Any) -> Any:
        await asyncio.sleep(0)
        return v + 1

    a = af.py_func(hop, [af.constant(1.0)], af.float32)
    b = af.py_func(hop, [a], af.float32)
    c = af.py_func(hop, [b], af.float32)
    async with af.Session(graph=graph) as sess:
        (bound,) = sess._prepare(c, None).bound
        step = Step(bound, CallFrame(()))
        assert await step.run() == [4.0]
        assert step._outstanding == 0


# == last-use freeing ====================================================================


async def test_last_use_freeing_edge_cases(graph: af.Graph) -> None:
    async def slow_id(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    def two(v: Any) -> Any:
        return [v + 1, v + 2]

    x = af.placeholder(af.float32, shape=(3,), name="x")
    p = af.py_func(slow_id, [af.multiply(x, 1.0)], af.float32, name="p")
    twice = af.add(p, p, name="twice")  # reads the same slot twice
    also = af.py_func(slow_id, [p], af.float32, name="also")  # async reader of p
    m0, m1 = af.py_func(two, [x], [af.float32, af.float32], name="multi")
    only_second = af.multiply(m1, 10.0)  # output 0 of multi is never read
    with af.control_dependencies([p.op]):
        after = af.identity(af.constant(5.0))  # control-only consumer of p
    fed_mid = af.add(x, 100.0, name="fed_mid")
    uses_fed = af.add(fed_mid, fed_mid)
    async with af.Session(graph=graph) as sess:
        feeds = {x: [1.0, 2.0, 3.0]}
        out = await sess.run([twice, p, also, only_second, after], feeds)
        np.testing.assert_array_equal(out[0], [2.0, 4.0, 6.0])
        np.testing.assert_array_equal(out[1], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(out[2], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(out[3], [30.0, 40.0, 50.0])
        assert out[4] == 5.0
        # Feeding an intermediate that is also fetched and read twice.
        got = await sess.run([uses_fed, fed_mid, m0], {x: [0.0, 0.0, 0.0], fed_mid: [1, 2, 3]})
        np.testing.assert_array_equal(got[0], [2.0, 4.0, 6.0])
        np.testing.assert_array_equal(got[1], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(got[2], [1.0, 1.0, 1.0])


# == fetches ============================================================================


async def test_fetch_dicts_with_equal_but_different_keys(graph: af.Graph) -> None:
    a = af.constant(1.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run({1: a}) == {1: 1.0}
        out = await sess.run({True: a})
    assert [type(k) for k in out] == [bool]


async def test_fetch_defaultdict(graph: af.Graph) -> None:
    a = af.constant(1.0)
    fetch: collections.defaultdict[str, Any] = collections.defaultdict(list, {"a": a})
    async with af.Session(graph=graph) as sess:
        out = await sess.run(fetch)
    assert type(out) is collections.defaultdict
    assert out.default_factory is list
    assert out["a"] == 1.0


async def test_fetch_structures_and_rules(graph: af.Graph) -> None:
    Pair = collections.namedtuple("Pair", ["x", "y"])

    class MyDict(dict):  # type: ignore[type-arg]
        pass

    a = af.constant(1.0, name="a")
    x = af.placeholder(af.float32, name="x")
    y = af.add(x, 1.0, name="y")
    target = af.no_op(name="t")
    async with af.Session(graph=graph) as sess:
        out = await sess.run(
            collections.OrderedDict(p=Pair(a, [y, "y:0"]), m=MyDict(q=(x, "t", target))), {x: 2.0}
        )
        assert type(out) is collections.OrderedDict
        assert type(out["p"]) is Pair
        assert out["p"] == Pair(1.0, [3.0, 3.0])
        assert type(out["m"]) is MyDict
        assert out["m"] == {"q": (2.0, None, None)}
        # fed-and-fetched by name gives the fed value; the op name as a target gives None
        assert await sess.run(["x:0", "y"], {"x:0": 5.0}) == [5.0, None]


# == feeds ==============================================================================


async def test_feed_nan(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.identity(x)
    async with af.Session(graph=graph) as sess:
        assert np.isnan(await sess.run(y, {x: float("nan")}))


async def test_feed_out_of_range_int(graph: af.Graph) -> None:
    x = af.placeholder(af.int8, name="x")
    y = af.identity(x)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(TypeError, match="x:0"):
            await sess.run(y, {x: 300})


async def test_control_dependency_on_fed_placeholder(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    with af.control_dependencies([x]):
        y = af.add(af.constant(2.0), 1.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: 1.0}) == 3.0


# == plan cache ===========================================================================


def test_run_sync_counts_one_lookup(graph: af.Graph) -> None:
    async def echo(v: Any) -> Any:
        return v

    y = af.py_func(echo, [af.constant(1.0)], af.float32)
    with af.Session(graph=graph) as sess:
        sess.run_sync(y)
        stats = sess.statistics()
    assert (stats.compiles, stats.cache_hits, stats.steps_started) == (1, 0, 1)


def test_close_while_threads_start_and_end_steps_waits_for_every_step(
    graph: af.Graph, no_leaked_threads: None
) -> None:
    """Steps register and leave without a lock; a close landing among them still lists
    or refuses each one, and waits for every step it listed: no thread hangs, nothing
    stays in flight, and every step started is counted completed or failed."""

    async def io(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    y = af.py_func(io, [af.constant(1.0)], af.float32) * 2.0
    sess = af.Session(graph=graph)
    outcomes: list[str] = []
    many = threading.Barrier(5)

    def worker() -> None:
        many.wait(5)
        for _ in range(2_000):  # bounded: the close lands well before
            try:
                assert sess.run_sync(y) == 2.0
            except af.errors.CancelledError:
                outcomes.append("cancelled")
            except RuntimeError as exc:
                outcomes.append("refused" if "closed" in str(exc) else repr(exc))
                return
        outcomes.append("ran out")

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for t in workers:
        t.start()
    many.wait(5)
    deadline = time.monotonic() + 5
    while sess.statistics().completed < 200 and time.monotonic() < deadline:
        time.sleep(0.001)  # (polling a count, not ordering events)
    closer = threading.Thread(target=sess.close_sync)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close hung waiting for a step"
    for t in workers:
        t.join(10)
    assert not any(t.is_alive() for t in workers)
    assert outcomes.count("refused") == 4, outcomes
    stats = sess.statistics()
    assert stats.in_flight == 0
    assert stats.steps_started == stats.completed + stats.failed
    assert stats.completed >= 200


def test_a_step_leaving_while_close_lists_it_wakes_close(graph: af.Graph) -> None:
    """The window the lock-free registration leaves: a step ends right after close
    listed it, before close made the future it waits on.  The step's leave sees the
    session closed, waits for close's lock and sets that future: close returns."""

    class FakeStep:
        def __init__(self) -> None:
            self.aborted: list[BaseException] = []

        def release(self) -> None:
            pass

        def abort_threadsafe(self, error: BaseException) -> None:
            self.aborted.append(error)

    sess = af.Session(graph=graph)
    step = FakeStep()
    leaving: list[threading.Thread] = []

    class LeavesWhileListed(dict):  # type: ignore[type-arg]
        def get(self, key: Any, default: Any = None) -> Any:
            # The step ends here, on another thread, while close holds its lock.
            leaver = threading.Thread(target=sess._leave, args=(key, True))
            leaver.start()
            leaver.join(0.2)
            leaving.append(leaver)
            return super().get(key, default)

    sess._in_flight = LeavesWhileListed()
    sess._enter(step)  # type: ignore[arg-type]
    closer = threading.Thread(target=sess.close_sync, daemon=True)  # (hung: not joined at exit)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close waits on a future the leaving step never set"
    assert len(leaving) == 1
    assert not leaving[0].is_alive()
    assert sess.statistics().in_flight == 0
    assert sess.statistics().completed == 1


def test_a_step_refused_after_close_listed_it_wakes_close(graph: af.Graph) -> None:
    """The other window: a step is put in flight, a close lands and lists it (and makes
    the future it waits on) before the step reads that the session is closed.  The
    refused step leaves as it raises: close returns."""

    class FakeStep:
        def __init__(self) -> None:
            self.released = False

        def release(self) -> None:
            self.released = True

        def abort_threadsafe(self, error: BaseException) -> None:
            pass

    sess = af.Session(graph=graph)
    step = FakeStep()
    closing: list[threading.Thread] = []

    class ClosesWhenEntered(dict):  # type: ignore[type-arg]
        def __setitem__(self, key: Any, value: Any) -> None:
            super().__setitem__(key, value)
            if value is None and not closing:  # the step's entry: close lands now
                closer = threading.Thread(target=sess.close_sync, daemon=True)
                closing.append(closer)
                closer.start()
                deadline = time.monotonic() + 5
                while super().get(key) is None and time.monotonic() < deadline:
                    time.sleep(0.001)  # (polling for close's future: no event to wait on)

    sess._in_flight = ClosesWhenEntered()
    with pytest.raises(RuntimeError, match="closed"):
        sess._enter(step)  # type: ignore[arg-type]
    closing[0].join(10)
    assert not closing[0].is_alive(), "close waits on a step that was refused"
    assert step.released
    assert sess.statistics().in_flight == 0
    assert sess.statistics().steps_started == 0
