"""End-to-end Session tests: every fetch / feed / run / close rule of the API."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import asyncflow as af

if TYPE_CHECKING:
    from tests.conftest import Hangs


def counting(counter: list[int]) -> Any:
    def f(v: Any) -> Any:
        counter.append(1)
        return v

    return f


# -- fetches -------------------------------------------------------------------------


async def test_fetch_structures(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.constant(np.array([1, 2], np.int32), name="b")
    op = af.no_op(name="target")
    Pair = collections.namedtuple("Pair", ["x", "y"])
    async with af.Session(graph=graph) as sess:
        assert await sess.run(a) == np.float32(1.0)
        out = await sess.run([a, (b, {"k": a, "op": op}), Pair(a, b)])
        assert isinstance(out, list)
        assert out[0] == 1.0
        inner = out[1]
        assert isinstance(inner, tuple)
        np.testing.assert_array_equal(inner[0], [1, 2])
        assert inner[1] == {"k": 1.0, "op": None}
        assert isinstance(out[2], Pair)
        assert out[2].x == 1.0
        assert await sess.run(op) is None
        assert await sess.run("target") is None
        assert await sess.run("a:0") == 1.0
        assert (await sess.run({"only": "b:0"}))["only"].tolist() == [1, 2]
        assert await sess.run([]) == []


async def test_result_types(graph: af.Graph) -> None:
    s = af.reduce_sum(af.constant([1.0, 2.0, 3.0, 4.0, 5.0]))
    i = af.constant(7, name="i")
    v = af.constant([[1.5]], dtype=af.float64)
    async with af.Session(graph=graph) as sess:
        out_s, out_i, out_v = await sess.run([s, i, v])
    assert type(out_s) is np.float32
    assert out_s == np.float32(15.0)
    assert type(out_i) is np.int32
    assert isinstance(out_v, np.ndarray)
    assert out_v.dtype == np.float64
    # Fetched constants are copies the caller may write to.
    out_v[0, 0] = 2.0


async def test_duplicate_fetch_computed_once(graph: af.Graph) -> None:
    calls: list[int] = []
    y = af.py_func(counting(calls), [af.constant(2.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        out = await sess.run([y, y, {"again": y}])
    assert out[0] == out[1] == out[2]["again"] == 2.0
    assert len(calls) == 1


async def test_invalid_fetches(graph: af.Graph) -> None:
    af.constant(1.0, name="a")
    other = af.Graph()
    with other.as_default():
        foreign = af.constant(1.0)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(TypeError, match="Fetch argument"):
            await sess.run(None)
        with pytest.raises(TypeError, match="Fetch argument"):
            await sess.run(3.5)
        with pytest.raises(ValueError, match="nope"):
            await sess.run("nope:0")
        with pytest.raises(ValueError, match="nope"):
            await sess.run("nope")
        with pytest.raises(ValueError, match="not an element of this graph"):
            await sess.run(foreign)
        # The session is still usable after client-side errors.
        assert await sess.run("a:0") == 1.0


# -- feeds ---------------------------------------------------------------------------


async def test_feed_by_tensor_and_name(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.reduce_sum(x * 2.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: np.ones((2, 3))}) == 12.0
        assert await sess.run(y, {"x:0": [[1, 1, 1]]}) == 6.0
        out = await sess.run(y, {x: np.ones((4, 3), np.float32)})
        assert type(out) is np.float32


async def test_feed_intermediate_cuts_ancestors(graph: af.Graph) -> None:
    calls: list[int] = []
    upstream = af.py_func(counting(calls), [af.constant(1.0)], af.float32, name="upstream")
    mid = af.add(upstream, 1.0, name="mid")
    out = af.multiply(mid, 10.0, name="out")
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out, {mid: 5.0}) == 50.0
        assert calls == []
        assert await sess.run(out) == 20.0
        assert calls == [1]


async def test_fed_and_fetched_returns_fed_value(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(2,), name="x")
    y = af.add(x, 1.0)
    async with af.Session(graph=graph) as sess:
        fx, fy = await sess.run([x, y], {x: [1.0, 2.0]})
    np.testing.assert_array_equal(fx, [1.0, 2.0])
    np.testing.assert_array_equal(fy, [2.0, 3.0])


async def test_unneeded_feed_is_ignored(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    unused = af.placeholder(af.int32, name="unused")
    y = af.add(x, 1.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: 1.0, unused: 3}) == 2.0


async def test_feed_errors(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.reduce_sum(x)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(ValueError, match=r"Cannot feed value of shape \(2, 2\)"):
            await sess.run(y, {x: np.ones((2, 2))})
        with pytest.raises(ValueError, match="Cannot feed value of shape"):
            await sess.run(y, {x: np.ones(3)})
        with pytest.raises(TypeError, match=r"cannot be an af\.Tensor"):
            await sess.run(y, {x: y})
        with pytest.raises(TypeError, match="refers to an Operation"):
            await sess.run(y, {"x": np.ones((1, 3))})
        with pytest.raises(ValueError, match="missing"):
            await sess.run(y, {"missing:0": 1.0})
        with pytest.raises(TypeError):
            await sess.run(y, {3: 1.0})
        # still usable
        assert await sess.run(y, {x: np.ones((1, 3))}) == 3.0


async def test_unfed_placeholder_names_it(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.reduce_sum(x)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(y)
    msg = str(info.value)
    assert "You must feed a value for placeholder tensor 'x'" in msg
    assert info.value.node_name == "x"
    assert "test_session.py" in msg


async def test_placeholder_with_default(graph: af.Graph) -> None:
    p = af.placeholder_with_default(af.constant([1.0, 2.0]), shape=(None,))
    s = af.reduce_sum(p)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(s) == 3.0
        assert await sess.run(s, {p: [5.0]}) == 5.0


# -- failures ------------------------------------------------------------------------


def explode(v: Any) -> Any:
    raise ValueError("kaboom")


async def test_kernel_error_names_node_type_and_site(graph: af.Graph) -> None:
    x = af.constant(1.0)
    bad = af.py_func(explode, [x], af.float32, name="bad_node")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(bad)
        err = info.value
        assert err.node_name == "bad_node"
        assert err.op is bad.op
        assert "kaboom" in str(err)
        assert "PyFunc" in str(err)
        assert f"test_session.py:{bad.op.traceback.rsplit(':', 1)[1]}" in str(err)
        assert isinstance(err.__cause__, ValueError)
        # The session stays usable after a failed step.
        assert await sess.run(x) == 1.0


async def test_unknown_exception_is_unknown_error(graph: af.Graph) -> None:
    def weird(v: Any) -> Any:
        raise KeyError("missing")

    bad = af.py_func(weird, [af.constant(1.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.UnknownError) as info:
            await sess.run(bad)
    assert isinstance(info.value.__cause__, KeyError)


async def test_first_error_wins_and_cancels_the_rest(
    graph: af.Graph, hanging_kernel: Hangs
) -> None:
    slow = hanging_kernel.async_kernel()

    async def fail_after_start(v: Any) -> Any:
        await slow.started.wait()
        raise ValueError("root cause")

    x = af.constant(1.0)
    a = af.py_func(slow, [x], af.float32, name="slow")
    b = af.py_func(fail_after_start, [x], af.float32, name="failing")
    c = af.add(a, b)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await asyncio.wait_for(sess.run(c), 5)
    assert info.value.node_name == "failing"
    assert "root cause" in str(info.value)
    # run() returned only after the other kernel was cancelled and finished.
    assert slow.ended == ["cancelled"]
    assert len(asyncio.all_tasks()) == 1


async def test_error_in_inline_kernel_after_async(graph: af.Graph) -> None:
    async def ok(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    a = af.py_func(ok, [af.constant(1.0)], af.float32)
    bad = af.py_func(explode, [a], af.float32, name="late_bad")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="late_bad"):
            await sess.run(bad)


async def test_failed_expensive_kernel_and_late_thread_results(
    graph: af.Graph, no_leaked_threads: None, hanging_kernel: Hangs
) -> None:
    slow_thread = hanging_kernel.thread_kernel()

    async def fail_soon(v: Any) -> Any:
        await slow_thread.wait_started()
        slow_thread.release()
        raise RuntimeError("async failure")

    x = af.constant(1.0)
    a = af.py_func(slow_thread, [x], af.float32, expensive=True)
    b = af.py_func(fail_soon, [x], af.float32, name="fail_soon")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.UnknownError, match="fail_soon"):
            await sess.run(af.add(a, b))
        # The thread's work finished before run() returned.
        assert slow_thread.finished == 1


# -- kernel kinds and scheduling -------------------------------------------------------


async def test_inline_plan_creates_no_task(graph: af.Graph) -> None:
    seen: list[int] = []

    def probe(v: Any) -> Any:
        seen.append(len(asyncio.all_tasks()))
        return v

    y = af.py_func(probe, [af.constant(1.0)], af.float32)
    z = af.add(y, 1.0)
    async with af.Session(graph=graph) as sess:
        before = len(asyncio.all_tasks())
        assert await sess.run(z) == 2.0
    assert seen == [before]


async def test_async_kernels_overlap(graph: af.Graph) -> None:
    gate = asyncio.Event()
    arrived: list[int] = []

    async def wait_for_all(v: Any) -> Any:
        arrived.append(1)
        if len(arrived) == 20:
            gate.set()
        await gate.wait()  # deadlocks unless all 20 run concurrently
        return v

    x = af.constant(1.0)
    outs = [af.py_func(wait_for_all, [x], af.float32) for _ in range(20)]
    total = af.add_n(outs)
    async with af.Session(graph=graph) as sess:
        assert await asyncio.wait_for(sess.run(total), 5) == 20.0


async def test_expensive_kernels_use_threads_in_parallel(
    graph: af.Graph, no_leaked_threads: None
) -> None:
    barrier = threading.Barrier(2, timeout=5)
    threads: list[str] = []

    def meet(v: Any) -> Any:
        threads.append(threading.current_thread().name)
        barrier.wait()  # raises BrokenBarrierError unless both run at once
        return v

    x = af.constant(1.0)
    a = af.py_func(meet, [x], af.float32, expensive=True)
    b = af.py_func(meet, [x], af.float32, expensive=True)
    config = af.SessionConfig(inter_op_parallelism_threads=2)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(af.add(a, b)) == 2.0
    assert all(name.startswith("asyncflow-") for name in threads)
    assert threading.current_thread().name not in threads


async def test_thread_limit_bounds_expensive_kernels(graph: af.Graph) -> None:
    active: list[int] = []
    peak: list[int] = [0]
    lock = threading.Lock()

    def work(v: Any) -> Any:
        with lock:
            active.append(1)
            peak[0] = max(peak[0], len(active))
        threading.Event().wait(0.01)
        with lock:
            active.pop()
        return v

    x = af.constant(1.0)
    total = af.add_n([af.py_func(work, [x], af.float32, expensive=True) for _ in range(6)])
    config = af.SessionConfig(inter_op_parallelism_threads=1)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(total) == 6.0
    assert peak[0] == 1


async def test_values_freed_after_last_use(graph: af.Graph) -> None:
    import weakref

    refs: list[weakref.ref[np.ndarray]] = []
    checked = asyncio.Event()
    alive_during_wait: list[bool] = []

    def produce(v: Any) -> Any:
        big = np.ones(1000, np.float32)
        refs.append(weakref.ref(big))
        return big

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        alive_during_wait.append(refs[0]() is not None)
        checked.set()
        return v

    x = af.constant(1.0)
    big = af.py_func(produce, [x], af.float32)
    small = af.reduce_sum(big)  # the only reader of `big`
    out = af.py_func(later, [small], af.float32)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out) == 1000.0
    assert alive_during_wait == [False]


# -- run_sync, concurrency, cache, graph growth -----------------------------------------


def test_run_sync(graph: af.Graph) -> None:
    async def double(v: Any) -> Any:
        await asyncio.sleep(0)
        return v * 2

    x = af.placeholder(af.float32, name="x")
    y = af.py_func(double, [x], af.float32)
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(y, {x: 2.0}) == 4.0
        assert sess.run_sync(af.add(x, 1.0), feed_dict={x: 1.0}) == 2.0


async def test_run_sync_inside_loop_raises(graph: af.Graph) -> None:
    x = af.constant(1.0)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(RuntimeError, match=r"await sess.run"):
            sess.run_sync(x)


async def test_plan_cache_skips_compile(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.add(x, 1.0)
    async with af.Session(graph=graph) as sess:
        await sess.run(y, {x: 1.0})
        first = sess.statistics()
        for i in range(5):
            assert await sess.run(y, {x: float(i)}) == i + 1
        after = sess.statistics()
        assert first.compiles == after.compiles == 1
        assert after.cache_hits == first.cache_hits + 5
        assert after.cached_plans == 1
        assert after.steps_started == 6
        await sess.run([y], {x: 1.0})  # another signature
        assert sess.statistics().compiles == 2
        assert "cached_plans=2" in repr(sess)


async def test_graph_extension_between_runs(graph: af.Graph) -> None:
    x = af.constant(2.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(x) == 2.0
        y = af.multiply(x, 3.0)
        assert await sess.run(y) == 6.0
        graph.finalize()
        with pytest.raises(RuntimeError, match="finalized"):
            af.add(x, 1.0)
        assert await sess.run(y) == 6.0


async def test_concurrent_runs_one_loop(graph: af.Graph) -> None:
    async def echo(v: Any) -> Any:
        await asyncio.sleep(0.001)
        return v

    x = af.placeholder(af.float32, name="x")
    y = af.multiply(af.py_func(echo, [x], af.float32), 2.0)
    async with af.Session(graph=graph) as sess:
        results = await asyncio.gather(*(sess.run(y, {x: float(i)}) for i in range(200)))
    assert results == [2.0 * i for i in range(200)]


def test_concurrent_run_sync_from_threads(graph: af.Graph) -> None:
    async def echo(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    x = af.placeholder(af.float32, name="x")
    y = af.add(af.py_func(echo, [x], af.float32), 1.0)
    z = af.add(x, 2.0)  # all-inline signature, no loop at all
    failures: list[BaseException] = []
    with af.Session(graph=graph) as sess:

        def worker(k: int) -> None:
            try:
                for i in range(50):
                    assert sess.run_sync(y, {x: float(k * 100 + i)}) == k * 100 + i + 1
                    assert sess.run_sync(z, {x: float(i)}) == i + 2
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sess.statistics().compiles == 2
    assert failures == []


# -- deadlines, cancellation, close -------------------------------------------------------


async def test_deadline(graph: af.Graph, hanging_kernel: Hangs) -> None:
    forever = hanging_kernel.async_kernel()
    y = af.py_func(forever, [af.constant(1.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.DeadlineExceededError) as info:
            await sess.run(y, options=af.RunOptions(timeout_in_ms=20))
        assert isinstance(info.value, TimeoutError)
    config = af.SessionConfig(operation_timeout_in_ms=20)
    async with af.Session(graph=graph, config=config) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y)
    assert len(asyncio.all_tasks()) == 1


async def test_cancelling_the_caller_cancels_the_step(
    graph: af.Graph, hanging_kernel: Hangs
) -> None:
    forever = hanging_kernel.async_kernel()
    y = af.py_func(forever, [af.constant(1.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        task = asyncio.create_task(sess.run(y))
        await forever.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert forever.ended == ["cancelled"]
        assert sess.statistics().in_flight == 0


async def test_close_cancels_in_flight_steps(
    graph: af.Graph, no_leaked_threads: None, hanging_kernel: Hangs
) -> None:
    forever = hanging_kernel.async_kernel()
    y = af.py_func(forever, [af.constant(1.0)], af.float32)
    sess = af.Session(graph=graph)
    task = asyncio.create_task(sess.run(y))
    await forever.started.wait()
    await sess.close()
    with pytest.raises(af.errors.CancelledError, match="closed"):
        await task
    with pytest.raises(RuntimeError, match="closed"):
        await sess.run(y)
    await sess.close()  # idempotent


def test_sync_close_and_closed_errors(graph: af.Graph) -> None:
    x = af.constant(1.0)
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(x) == 1.0
    with pytest.raises(RuntimeError, match="closed"):
        sess.run_sync(x)
    assert sess.statistics().closed


def test_session_arguments(graph: af.Graph) -> None:
    with pytest.raises(TypeError):
        af.Session(graph="not a graph")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device_count"):
        af.SessionConfig(device_count={"CPU": 0})
    with pytest.raises(ValueError, match="GPU"):
        af.SessionConfig(device_count={"GPU": 1})
    sess = af.Session(graph)
    assert sess.graph is graph
    assert sess.list_devices() == ["/job:localhost/replica:0/task:0/device:CPU:0"]
    sess.close_sync()


async def test_unknown_device_fails_the_run(graph: af.Graph) -> None:
    with af.device("/cpu:3"):
        y = af.constant(1.0, name="far_away")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="far_away"):
            await sess.run(y)
    config = af.SessionConfig(allow_soft_placement=True)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(y) == 1.0


async def test_explicit_cpu0_device(graph: af.Graph) -> None:
    with af.device("/cpu:0"):
        y = af.add(af.constant(1.0), 2.0)
    with af.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        z = af.multiply(y, 2.0)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(z) == 6.0


async def test_make_callable(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.add(x, 1.0)
    async with af.Session(graph=graph) as sess:
        fn = sess.make_callable([y], feed_list=[x])
        assert await fn(1.0) == [2.0]
        assert await fn(np.float32(5)) == [6.0]
        with pytest.raises(TypeError):
            await fn()
        with pytest.raises(ValueError, match="duplicate"):
            sess.make_callable(y, feed_list=[x, x])


async def test_trace_fills_step_stats(graph: af.Graph) -> None:
    async def io(v: Any) -> Any:
        await asyncio.sleep(0.001)
        return v

    a = af.py_func(io, [af.constant(1.0)], af.float32, name="io")
    b = af.py_func(lambda v: v * 2, [a], af.float32, expensive=True, name="heavy")
    c = af.add(b, 1.0, name="c")
    md = af.RunMetadata()
    opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(c, options=opts, run_metadata=md) == 3.0
        (dev,) = md.step_stats.dev_stats
        assert dev.device.endswith("device:CPU:0")
        by_name = {ns.node_name: ns for ns in dev.node_stats}
        assert by_name["io"].kind == "async"
        assert by_name["heavy"].kind == "thread"
        assert by_name["c"].kind == "inline"
        assert by_name["c"].output[0].dtype == "float32"
        assert by_name["io"].all_start_micros <= by_name["c"].all_start_micros
        # Refilled from scratch on the next run.
        await sess.run(c, options=opts, run_metadata=md)
        assert len(md.step_stats.dev_stats[0].node_stats) == 3
