"""Step control: deadlines, cancellation, make_callable, partial_run, tracing."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.cli import main as cli_main

# -- deadlines and cancellation contexts -------------------------------------------------


async def test_thread_kernel_polls_cancellation_and_run_waits_for_it(graph: af.Graph) -> None:
    stopped = threading.Event()
    saw_cancel: list[bool] = []

    def long_work(v: Any) -> Any:
        cm = af.get_cancellation_manager()
        assert cm is not None
        deadline = time.monotonic() + 10
        while not cm.is_cancelled and time.monotonic() < deadline:
            time.sleep(0.001)
        saw_cancel.append(cm.is_cancelled)
        stopped.set()
        return v

    y = af.py_func(long_work, [af.constant(1.0)], af.float32, expensive=True)
    async with af.Session(graph=graph) as sess:
        start = time.monotonic()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, options=af.RunOptions(timeout_in_ms=50))
        # run() returned only after the thread kernel noticed and stopped.
        assert stopped.is_set()
        assert saw_cancel == [True]
        assert time.monotonic() - start < 5


async def test_kernels_see_their_own_steps_manager(graph: af.Graph) -> None:
    """The manager a kernel gets is its step's (read off the step in the context): the
    same in an async and a thread kernel of one step, a new one per step, None outside."""
    seen: list[tuple[str, Any]] = []

    async def in_task(v: Any) -> Any:
        seen.append(("async", af.get_cancellation_manager()))
        return v

    def in_thread(v: Any) -> Any:
        seen.append(("thread", af.get_cancellation_manager()))
        return v

    x = af.constant(1.0)
    y = af.add(
        af.py_func(in_task, [x], af.float32), af.py_func(in_thread, [x], af.float32, expensive=True)
    )
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y) == 2.0
        assert await sess.run(y) == 2.0
    assert sorted(kind for kind, _ in seen) == ["async", "async", "thread", "thread"]
    managers = [cm for _, cm in seen]
    assert all(isinstance(cm, af.CancellationManager) for cm in managers)
    assert managers[0] is managers[1]  # one step
    assert managers[2] is managers[3]  # the next
    assert managers[0] is not managers[2]
    assert af.get_cancellation_manager() is None


async def test_per_run_timeout_wins_over_session_default(graph: af.Graph) -> None:
    async def slow(v: Any) -> Any:
        await asyncio.sleep(0.2)
        return v

    y = af.py_func(slow, [af.constant(1.0)], af.float32)
    config = af.SessionConfig(operation_timeout_in_ms=10)
    async with af.Session(graph=graph, config=config) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y)
        assert await sess.run(y, options=af.RunOptions(timeout_in_ms=5000)) == 1.0


async def test_cancellation_callbacks_run_on_failure(graph: af.Graph) -> None:
    called = asyncio.Event()
    registered = asyncio.Event()

    async def waits(v: Any) -> Any:
        cm = af.get_cancellation_manager()
        assert cm is not None
        cm.register_callback(called.set)
        registered.set()
        await asyncio.sleep(30)
        return v

    async def fails(v: Any) -> Any:
        await registered.wait()
        raise ValueError("boom")

    x = af.constant(1.0)
    out = af.add(af.py_func(waits, [x], af.float32), af.py_func(fails, [x], af.float32))
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="boom"):
            await sess.run(out)
    assert called.is_set()


def test_cancellation_manager_contract() -> None:
    cm = af.CancellationManager()
    calls: list[str] = []
    token = cm.register_callback(lambda: calls.append("a"))
    other = cm.register_callback(lambda: calls.append("b"))
    assert cm.deregister_callback(other)
    assert not cm.is_cancelled
    cm.cancel()
    cm.cancel()
    assert cm.is_cancelled
    assert calls == ["a"]
    assert not cm.deregister_callback(token)
    assert cm.register_callback(lambda: calls.append("late")) is None
    assert af.get_cancellation_manager() is None


@pytest.mark.parametrize("how", ["cancel", "timeout", "failure", "close"])
async def test_nothing_is_left_running(graph: af.Graph, how: str) -> None:
    thread_started = threading.Event()
    thread_done = threading.Event()
    task_started = asyncio.Event()

    def thread_kernel(v: Any) -> Any:
        thread_started.set()
        cm = af.get_cancellation_manager()
        while cm is not None and not cm.is_cancelled:
            time.sleep(0.001)
        thread_done.set()
        return v

    async def async_kernel(v: Any) -> Any:
        # A threading.Event set by the worker thread: poll it (no asyncio.Event can be
        # set from that thread without a loop handle).  Both kernels run from here on.
        while not thread_started.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        task_started.set()
        if how == "failure":
            raise RuntimeError("fail")
        await asyncio.sleep(30)
        return v

    x = af.constant(1.0)
    out = af.add(
        af.py_func(thread_kernel, [x], af.float32, expensive=True),
        af.py_func(async_kernel, [x], af.float32),
    )
    before = set(asyncio.all_tasks())
    sess = af.Session(graph=graph)
    opts = af.RunOptions(timeout_in_ms=50) if how == "timeout" else None
    task = asyncio.create_task(sess.run(out, options=opts))
    await task_started.wait()
    if how == "cancel":
        task.cancel()
    elif how == "close":
        await sess.close()
    with pytest.raises((asyncio.CancelledError, af.errors.OpError)):
        await task
    assert thread_done.is_set()  # the thread kernel stopped before run() returned
    assert set(asyncio.all_tasks()) - before == set()
    await sess.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("asyncflow-")]


# -- make_callable ----------------------------------------------------------------------------


async def test_make_callable_validates_when_made(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.add(x, 1.0)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(ValueError, match="duplicate"):
            sess.make_callable(y, feed_list=[x, x])
        with pytest.raises(ValueError, match="nope"):
            sess.make_callable(y, feed_list=["nope:0"])
        with pytest.raises(ValueError, match="missing"):
            sess.make_callable("missing:0", feed_list=[x])
        fn = sess.make_callable({"y": y}, feed_list=["x:0"])
        assert await fn(2.0) == {"y": 3.0}
        compiles = sess.statistics().compiles
        for i in range(10):
            assert (await fn(float(i)))["y"] == i + 1
        assert sess.statistics().compiles == compiles
        with pytest.raises(TypeError, match="accept_options"):
            await fn(1.0, options=af.RunOptions())
        traced = sess.make_callable(y, feed_list=[x], accept_options=True)
        md = af.RunMetadata()
        assert (
            await traced(
                1.0, options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE), run_metadata=md
            )
            == 2.0
        )
        assert md.step_stats.dev_stats[0].node_stats


# -- partial_run -------------------------------------------------------------------------------


async def test_partial_run(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, (), name="a")
    b = af.placeholder(af.float32, (), name="b")
    c = af.placeholder(af.float32, (), name="c")
    r1 = af.add(a, b, name="r1")
    r2 = af.multiply(r1, c, name="r2")
    async with af.Session(graph=graph) as sess:
        h = await sess.partial_run_setup([r1, r2], [a, b, c])
        assert await sess.partial_run(h, r1, {a: 1, b: 2}) == 3.0
        assert await sess.partial_run(h, r2, {c: 3}) == 9.0
        # Finished: the handle is released.
        with pytest.raises(af.errors.InvalidArgumentError, match="invalid"):
            await sess.partial_run(h, r2)


async def test_partial_run_errors(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, (), name="a")
    b = af.placeholder(af.float32, (), name="b")
    r1 = af.add(a, b, name="r1")
    r2 = af.multiply(r1, 2.0, name="r2")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="invalid"):
            await sess.partial_run("never-set-up", r1)
        h = await sess.partial_run_setup([r1, r2], [a, b])
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match="The feed r2:0 was not specified in partial_run_setup",
        ):
            await sess.partial_run(h, r1, {r2: 1.0})
        assert await sess.partial_run(h, r1, {a: 1.0, b: 1.0}) == 2.0
        with pytest.raises(
            af.errors.InvalidArgumentError, match="The feed a:0 has already been fed"
        ):
            await sess.partial_run(h, r2, {a: 5.0})
        with pytest.raises(
            af.errors.InvalidArgumentError, match="The fetch r1:0 has already been fetched"
        ):
            await sess.partial_run(h, r1)
        other = af.add(a, 10.0, name="other")
        with pytest.raises(
            af.errors.InvalidArgumentError, match="The fetch other:0 was not specified"
        ):
            await sess.partial_run(h, other)
        assert await sess.partial_run(h, r2) == 4.0


async def test_several_partial_runs_and_close_releases_abandoned_ones(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, (), name="a")
    y = af.multiply(a, 3.0)
    sess = af.Session(graph=graph)
    h1 = await sess.partial_run_setup(y, [a])
    h2 = await sess.partial_run_setup(y, [a])
    assert h1 != h2
    assert await sess.partial_run(h2, y, {a: 2.0}) == 6.0
    h3 = await sess.partial_run_setup(y, [a])  # abandoned, like h1
    await asyncio.sleep(0)
    assert sess.statistics().in_flight == 2
    await sess.close()
    assert sess.statistics().in_flight == 0
    for h in (h1, h3):
        with pytest.raises(af.errors.InvalidArgumentError):
            await sess.partial_run(h, y, {a: 1.0})


async def test_partial_run_failure_reports_the_root_error(graph: af.Graph) -> None:
    def explode(v: Any) -> Any:
        raise ValueError("bad input")

    a = af.placeholder(af.float32, (), name="a")
    y = af.py_func(explode, [a], af.float32, name="exploder")
    async with af.Session(graph=graph) as sess:
        h = await sess.partial_run_setup(y, [a])
        with pytest.raises(af.errors.InvalidArgumentError, match="exploder"):
            await sess.partial_run(h, y, {a: 1.0})


# -- tracing ------------------------------------------------------------------------------------


async def test_step_stats_fields(graph: af.Graph) -> None:
    async def io(v: Any) -> Any:
        await asyncio.sleep(0.002)
        return v

    x = af.constant(np.ones((2, 3), np.float32))
    a = af.py_func(io, [x], af.float32, name="io")
    b = af.reduce_sum(af.reshape(a, (2, 3)), name="total")
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        await sess.run(
            b, options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE), run_metadata=md
        )
    stats = {n.node_name: n for n in md.step_stats.dev_stats[0].node_stats}
    io_stats = stats["io"]
    assert io_stats.kind == "async"
    assert io_stats.op_end_rel_micros >= 1500
    assert io_stats.scheduled_micros <= io_stats.all_start_micros
    assert io_stats.thread_id == threading.get_ident()
    assert io_stats.output[0].shape == (2, 3)
    assert io_stats.output[0].requested_bytes == 24
    assert stats["total"].all_start_micros >= io_stats.all_start_micros


async def test_chrome_trace_structure(graph: af.Graph, tmp_path: Path) -> None:
    async def io(v: Any) -> Any:
        await asyncio.sleep(0.002)
        return v

    with af.device("/cpu:0"):
        x = af.constant(1.0)
        parallel = [af.py_func(io, [x], af.float32, name=f"io{k}") for k in range(3)]
        s = af.add_n(parallel)
    with af.device("/cpu:1"):
        out = af.multiply(s, 2.0, name="double")
    md = af.RunMetadata()
    config = af.SessionConfig(device_count={"CPU": 2})
    async with af.Session(graph=graph, config=config) as sess:
        await sess.run(
            out, options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE), run_metadata=md
        )
    path = tmp_path / "trace.json"
    path.write_text(af.tracing.Timeline(md.step_stats).generate_chrome_trace_format())
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == [
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    ]
    threads = [e for e in events if e["name"] == "thread_name"]
    assert threads
    ops = [e for e in events if e["ph"] == "X"]
    assert {e["args"]["name"] for e in ops} >= {"io0", "io1", "io2", "double"}
    # The three overlapping async kernels sit on three different lanes.
    io_lanes = {e["tid"] for e in ops if e["args"]["name"].startswith("io")}
    assert len(io_lanes) == 3
    for lane in {(e["pid"], e["tid"]) for e in ops}:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops if (e["pid"], e["tid"]) == lane)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    # s travels from /cpu:0 to /cpu:1, the fetched double back to the client's /cpu:0.
    assert len(starts) == len(finishes) == 2
    ends = {e["id"]: e["pid"] for e in finishes}
    assert all(ends[e["id"]] != e["pid"] for e in starts)
    assert trace["displayTimeUnit"] == "ms"


def test_timeline_rejects_other_input() -> None:
    with pytest.raises(TypeError, match="step_stats"):
        af.tracing.Timeline({"not": "stats"})  # type: ignore[arg-type]


def test_cli_trace_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo_trace = tmp_path / "demo.json"
    assert cli_main(["demo", "--trace", str(demo_trace)]) == 0
    events = json.loads(demo_trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["args"]["kind"] == "async" for e in events)

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        af.multiply(x, 2.0, name="y")
    graph_file = tmp_path / "g.json"
    graph_file.write_text(json.dumps(g.as_graph_def()))
    run_trace = tmp_path / "run.json"
    assert (
        cli_main(
            ["run", str(graph_file), "--feed", "x=3", "--fetch", "y", "--trace", str(run_trace)]
        )
        == 0
    )
    assert "6" in capsys.readouterr().out
    names = {
        e["args"]["name"]
        for e in json.loads(run_trace.read_text())["traceEvents"]
        if e["ph"] == "X"
    }
    assert "y" in names
