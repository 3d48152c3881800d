"""One executor, two propagators: loops traced, freed, partitioned across devices and
stopped like any graph; long inline steps honour deadlines and share the loop."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
import weakref
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.interpreter import ProgramPropagator
from asyncflow.runtime.propagators import PropagatorState
from tests.ordering import wait_in_flight

TWO = af.SessionConfig(device_count={"CPU": 2})
TRACE = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)


def _counter_loop(n: int = 5) -> tuple[af.Tensor, af.Tensor]:
    i, s = af.while_loop(
        lambda i, s: i < n,
        lambda i, s: (i + 1, s + af.cast(i, af.float32)),
        [af.constant(0), af.constant(0.0)],
    )
    return i, s


# -- the propagator is chosen per plan ---------------------------------------------------------


async def test_propagator_is_chosen_at_bind_time(graph: af.Graph) -> None:
    plain = af.add(af.placeholder(af.float32, name="x"), 1.0)
    with_cond = af.cond(af.placeholder(af.bool, name="p"), lambda: plain * 2.0, lambda: plain - 1.0)
    _, looped = _counter_loop()
    async with af.Session(graph=graph) as sess:

        def step_of(fetch: Any, feeds: Any) -> Any:
            (bound,) = sess._prepare(fetch, feeds).bound
            from asyncflow.runtime.call_frame import CallFrame
            from asyncflow.runtime.step import Step

            return Step(bound, CallFrame([1.0, True][: len(feeds)]))

        # One general propagator; a plan without loops never makes a frame.
        assert step_of(plain, {"x:0": 1.0})._root is None
        # A cond needs dead tensors but no frames.
        assert isinstance(step_of(with_cond, {"x:0": 1.0, "p:0": True}), PropagatorState)
        assert step_of(with_cond, {"x:0": 1.0, "p:0": True})._root is None
        looped_first = step_of(looped, {})
        assert isinstance(looped_first, PropagatorState)
        assert looped_first._root is not None
        # From its second run, a plan whose root frame routes nothing runs its loop as
        # one instruction of its straight-line program (the loop a closed one).
        assert isinstance(step_of(looped, {}), ProgramPropagator)
        assert await sess.run(with_cond, {"x:0": 1.0, "p:0": True}) == 4.0
        assert await sess.run(with_cond, {"x:0": 1.0, "p:0": False}) == 1.0
        assert await sess.run(looped) == 10.0


# -- tracing inside loops ------------------------------------------------------------------------


async def test_full_trace_records_every_node_of_every_iteration(graph: af.Graph) -> None:
    _, total = _counter_loop(4)
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        assert await sess.run(total, options=TRACE, run_metadata=md) == 6.0
    stats = [ns for d in md.step_stats.dev_stats for ns in d.node_stats]
    adds = [ns for ns in stats if ns.op_type == "Cast"]
    # The body's Cast runs once per iteration (4 live and the final, dead one is skipped).
    assert sorted(ns.iter_id for ns in adds) == [0, 1, 2, 3]
    assert all(ns.frame_name for ns in adds)
    assert all(f"iter {ns.iter_id}]" in ns.timeline_label for ns in adds)
    merges = [ns for ns in stats if ns.op_type == "Merge"]
    assert {ns.iter_id for ns in merges} == {0, 1, 2, 3, 4}
    trace = af.tracing.Timeline(md.step_stats).trace_events()
    iterations = {
        e["args"].get("iteration")
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e["args"].get("op") == "Cast"
    }
    assert iterations == {0, 1, 2, 3}


async def test_cond_steps_are_traced_too(graph: af.Graph) -> None:
    p = af.placeholder(af.bool, shape=(), name="p")
    out = af.cond(p, lambda: af.constant(1.0) * 3.0, lambda: af.constant(2.0) - 1.0)
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out, {p: True}, options=TRACE, run_metadata=md) == 3.0
    kinds = {(ns.op_type, ns.kind) for d in md.step_stats.dev_stats for ns in d.node_stats}
    assert ("Switch", "control") in kinds
    assert ("Merge", "control") in kinds
    assert ("Mul", "inline") in kinds


# -- memory ------------------------------------------------------------------------------------


async def test_loop_values_are_freed_after_last_use(graph: af.Graph) -> None:
    # Each iteration makes a 4 MB array and reduces it; 40 iterations would hold 160 MB
    # if iterations kept their values.
    def big(i: Any) -> Any:
        return np.full(1_000_000, float(i), np.float32)

    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        arr = af.py_func(big, [i], af.float32)
        return i + 1, s + af.reduce_sum(arr)

    _, total = af.while_loop(
        lambda i, s: i < 40, body, [af.constant(0), af.constant(0.0)], parallel_iterations=1
    )
    async with af.Session(graph=graph) as sess:
        tracemalloc.start()
        try:
            got = await sess.run(total)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert got == pytest.approx(sum(range(40)) * 1_000_000)
    assert peak < 30 * 2**20, f"peak {peak / 2**20:.1f} MB"


async def test_values_in_a_graph_with_cond_are_freed_after_last_use(graph: af.Graph) -> None:
    refs: list[weakref.ref[np.ndarray]] = []
    alive_during_wait: list[bool] = []

    def produce(v: Any) -> Any:
        arr = np.ones(1000, np.float32)
        refs.append(weakref.ref(arr))
        return arr

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        alive_during_wait.append(refs[0]() is not None)
        return v

    p = af.placeholder(af.bool, shape=(), name="p")
    big = af.py_func(produce, [af.constant(1.0)], af.float32)
    small = af.reduce_sum(big)
    picked = af.cond(p, lambda: small * 2.0, lambda: small)
    out = af.py_func(later, [picked], af.float32)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out, {p: True}) == 2000.0
    assert alive_during_wait == [False]


async def test_no_task_of_a_finished_iteration_is_kept(graph: af.Graph) -> None:
    seen: list[int] = []

    async def tick(i: Any) -> Any:
        await asyncio.sleep(0)
        seen.append(len(asyncio.all_tasks()))
        return i

    def body(i: af.Tensor) -> af.Tensor:
        return af.reshape(af.py_func(tick, [i], af.int32), []) + 1

    out = af.while_loop(lambda i: i < 60, body, [af.constant(0)], parallel_iterations=1)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out) == [60]
    assert len(seen) == 60
    assert max(seen) == min(seen), seen  # not one more task per iteration


# -- deadlines, cancellation and the first error in loops ---------------------------------------


async def test_loop_deadline_cancellation_and_first_error(graph: af.Graph) -> None:
    async def nap(i: Any) -> Any:
        await asyncio.sleep(0.005)
        return i

    def fail_at_3(i: Any) -> Any:
        if i == 3:
            raise ValueError("iteration three")
        return i

    slow = af.while_loop(
        lambda i: i < 1000,
        lambda i: af.reshape(af.py_func(nap, [i], af.int32, name="nap"), []) + 1,
        [af.constant(0)],
    )
    bad = af.while_loop(
        lambda i: i < 10,
        lambda i: af.reshape(af.py_func(fail_at_3, [i], af.int32, name="bad"), []) + 1,
        [af.constant(0)],
    )
    ok = af.constant(1)
    async with af.Session(graph=graph) as sess:
        start = time.perf_counter()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(slow, options=af.RunOptions(timeout_in_ms=50))
        assert time.perf_counter() - start < 2.0
        task = asyncio.ensure_future(sess.run(slow))
        await wait_in_flight(sess, 1)  # the loop is running
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(af.errors.InvalidArgumentError, match="iteration three") as info:
            await sess.run(bad)
        assert "bad" in str(info.value)
        assert sess.statistics().in_flight == 0
        assert await sess.run(ok) == 1  # the session stays usable


# -- control flow across devices ------------------------------------------------------------------


async def test_loop_body_alternating_two_devices(graph: af.Graph) -> None:
    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        with af.device("/cpu:1"):
            a = s * 2.0
        with af.device("/cpu:0"):
            b = a + af.cast(i, af.float32)
        with af.device("/cpu:1"):
            c = b - 1.0
        return i + 1, c

    with af.device("/cpu:0"):
        _, out = af.while_loop(lambda i, s: i < 6, body, [af.constant(0), af.constant(1.0)])
    expected = 1.0
    for i in range(6):
        expected = expected * 2.0 + i - 1.0
    md = af.RunMetadata()
    opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE, output_partition_graphs=True)
    async with af.Session(graph=graph, config=TWO) as sess:
        assert await sess.run(out, options=opts, run_metadata=md) == expected
        for _ in range(3):  # concurrent steps keep their rendezvous apart
            assert await asyncio.gather(*(sess.run(out) for _ in range(4))) == [expected] * 4
    devices = {d.device[-5:]: d.node_stats for d in md.step_stats.dev_stats}
    assert set(devices) == {"CPU:0", "CPU:1"}
    mul_iters = sorted(ns.iter_id for ns in devices["CPU:1"] if ns.op_type == "Mul")
    assert mul_iters == list(range(6))
    # Every iteration's transfer has its own key: frame id and iteration in its last field.
    recv_keys = {ns.rendezvous_key for ns in devices["CPU:1"] if ns.kind == "recv"}
    suffixes = {k.rsplit(";", 1)[1] for k in recv_keys}
    assert {s.split(":")[1] for s in suffixes} >= {str(k) for k in range(6)}
    # Each partition holding part of the loop has its own control loop.
    for pg in md.partition_graphs:
        ops = [n["op"] for n in pg["node"]]
        assert "_Recv" in ops
        assert "_Send" in ops
        assert any(n["name"].startswith("_cloop") for n in pg["node"]), pg["device"]


async def test_cond_with_branches_on_different_devices(graph: af.Graph) -> None:
    calls: list[str] = []

    def note(tag: str) -> Any:
        def f(v: Any) -> Any:
            calls.append(tag)
            return v

        return f

    p = af.placeholder(af.bool, shape=(), name="p")
    x = af.placeholder(af.float32, shape=(), name="x")
    branch: list[af.Tensor] = []

    def true_fn() -> af.Tensor:
        with af.device("/cpu:1"):
            branch.append(af.py_func(note("true"), [x * 10.0], af.float32))
            return branch[0]

    def false_fn() -> af.Tensor:
        with af.device("/cpu:0"):
            return af.py_func(note("false"), [x - 10.0], af.float32)

    out = af.cond(p, true_fn, false_fn)
    with af.device("/cpu:1"):
        after = out + 1.0
    async with af.Session(graph=graph, config=TWO) as sess:
        assert await sess.run(after, {p: True, x: 2.0}) == 21.0
        assert await sess.run(after, {p: False, x: 2.0}) == -7.0
        assert calls == ["true", "false"]  # only the taken branch ran, on its device
        with pytest.raises(af.errors.InvalidArgumentError, match="dead"):
            # The untaken branch's value crossed devices dead and cannot be fetched.
            await sess.run(branch[0], {p: False, x: 1.0})


async def test_nested_loops_across_devices(graph: af.Graph) -> None:
    def outer(i: af.Tensor, acc: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        def inner(j: af.Tensor, a: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
            with af.device("/cpu:1"):
                a2 = a + af.cast(i * j, af.float32)
            return j + 1, a2

        with af.device("/cpu:0"):
            _, acc2 = af.while_loop(lambda j, a: j < 3, inner, [af.constant(0), acc])
        return i + 1, acc2

    with af.device("/cpu:0"):
        _, total = af.while_loop(lambda i, a: i < 4, outer, [af.constant(0), af.constant(0.0)])
    expected = float(sum(i * j for i in range(4) for j in range(3)))
    md = af.RunMetadata()
    async with af.Session(graph=graph, config=TWO) as sess:
        assert await sess.run(total, options=TRACE, run_metadata=md) == expected
    on_cpu1 = [
        ns
        for d in md.step_stats.dev_stats
        if d.device.endswith("CPU:1")
        for ns in d.node_stats
        if ns.op_type == "AddV2" or ns.op_type == "Add"
    ]
    assert len(on_cpu1) == 12  # 4 outer x 3 inner iterations


async def test_loop_failure_on_one_device_stops_the_other(graph: af.Graph) -> None:
    def boom(v: Any) -> Any:
        if v > 2:
            raise RuntimeError("boom on cpu:1")
        return v

    def body(i: af.Tensor) -> af.Tensor:
        with af.device("/cpu:1"):
            checked = af.reshape(af.py_func(boom, [i], af.int32, name="boom"), [])
        return checked + 1

    with af.device("/cpu:0"):
        out = af.while_loop(lambda i: i < 100, body, [af.constant(0)])
    async with af.Session(graph=graph, config=TWO) as sess:
        start = time.perf_counter()
        with pytest.raises(af.errors.UnknownError, match="boom on cpu:1") as info:
            await sess.run(out)
        assert info.value.node_name == "while/boom"
        assert time.perf_counter() - start < 5.0
        assert sess.statistics().in_flight == 0


# -- one session path -------------------------------------------------------------------------------


async def test_output_partition_graphs_for_run_and_callable(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.add(x, 1.0, name="y")
    _, looped = _counter_loop(3)
    opts = af.RunOptions(output_partition_graphs=True)
    async with af.Session(graph=graph) as sess:
        md = af.RunMetadata()
        assert await sess.run(y, {x: 1.0}, options=opts, run_metadata=md) == 2.0  # fast path
        assert len(md.partition_graphs) == 1
        fn = sess.make_callable(y, [x], accept_options=True)
        md2 = af.RunMetadata()
        assert await fn(2.0, options=opts, run_metadata=md2) == 3.0
        assert md2.partition_graphs == md.partition_graphs
        md3 = af.RunMetadata()
        loop_fn = sess.make_callable(looped, accept_options=True)
        assert await loop_fn(options=opts, run_metadata=md3) == 3.0
        ops = {n["op"] for n in md3.partition_graphs[0]["node"]}
        assert {"Enter", "Merge", "Switch", "Exit", "NextIteration"} <= ops
        # A looping partition graph imports again.
        g2 = af.Graph()
        af.import_graph_def(md3.partition_graphs[0], graph=g2)


# -- long inline steps ----------------------------------------------------------------------------


def _spin(v: Any) -> Any:
    end = time.perf_counter() + 20e-6
    while time.perf_counter() < end:
        pass
    return v


def _inline_chain(n: int) -> af.Tensor:
    x = af.constant(np.float32(0.0))
    for _ in range(n):
        x = af.py_func(_spin, [x], af.float32)
    return x


async def test_long_inline_step_honours_its_deadline(graph: af.Graph) -> None:
    out = _inline_chain(10_000)  # ~200 ms of inline kernels
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out) == 0.0  # without a deadline it runs to the end
        start = time.perf_counter()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(out, options=af.RunOptions(timeout_in_ms=5))
        elapsed = time.perf_counter() - start
        assert elapsed < 0.1, f"took {elapsed * 1000:.0f} ms"


async def test_long_inline_step_shares_the_loop_and_can_be_cancelled(graph: af.Graph) -> None:
    out = _inline_chain(10_000)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async with af.Session(graph=graph) as sess:
        background = asyncio.ensure_future(ticker())
        try:
            assert await sess.run(out) == 0.0
            assert ticks > 20  # the loop kept running other tasks during the step
            step = asyncio.ensure_future(sess.run(out))
            await wait_in_flight(sess, 1)
            start = time.perf_counter()
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
            assert time.perf_counter() - start < 0.05
        finally:
            background.cancel()
            with pytest.raises(asyncio.CancelledError):
                await background
        assert sess.statistics().in_flight == 0


@pytest.mark.parametrize("straight_line", [True, False])
async def test_loops_in_cond_branches_cross_the_root_frame_both_ways(
    graph: af.Graph, straight_line: bool
) -> None:
    # The general propagator's root frame is flat lists, its loop frames dicts: a
    # dead value entering a loop (the untaken branch), a loop's Exit readying a root
    # Merge, and root nodes running after an Exit, must all cross that boundary.
    p = af.placeholder(af.bool, (), name="p")
    x = af.placeholder(af.float32, (), name="x")

    def looped() -> af.Tensor:
        loop_vars: tuple[af.Tensor, af.Tensor] = af.while_loop(
            lambda i, s: i < 3, lambda i, s: (i + 1, s + x), (af.constant(0), x)
        )
        return loop_vars[1] * 2.0

    out = af.cond(p, looped, lambda: x - 1.0)
    after = out + af.while_loop(lambda i: i < 2.0, lambda i: i + 1.0, x)
    options = af.ExecutorOptions(straight_line=straight_line)
    async with af.Session(graph=graph, config=af.SessionConfig(executor_options=options)) as sess:
        assert await sess.run([out, after], {p: True, x: 1.0}) == [8.0, 10.0]
        assert await sess.run([out, after], {p: False, x: 1.0}) == [0.0, 2.0]
        assert await sess.run([out, after], {p: True, x: 5.0}) == [40.0, 45.0]
