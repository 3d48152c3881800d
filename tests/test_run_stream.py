"""Session.run_stream: fetches in readiness order."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from tests.ordering import wait_until


def _gated(name: str, x: af.Tensor, gates: dict[str, asyncio.Event], log: list[str]) -> af.Tensor:
    async def kernel(v: Any) -> Any:
        log.append(f"{name} started")
        try:
            await gates.setdefault(name, asyncio.Event()).wait()
        except asyncio.CancelledError:
            log.append(f"{name} cancelled")
            raise
        return v + np.float32(1)

    return af.py_func(kernel, [x], af.float32, name=name)


async def test_fetches_come_in_readiness_order(graph: af.Graph) -> None:
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    a = _gated("a", x, gates, log)
    b = _gated("b", x, gates, log)
    c = af.identity(x * 2.0, name="c")
    seen = []
    async with af.Session(graph=graph) as sess:
        async for fetch, value in sess.run_stream([a, b, c, {"ab": (a, b)}], {x: 1.0}):
            seen.append((fetch.name if isinstance(fetch, af.Tensor) else "ab", value))
            if fetch is c:
                gates.setdefault("b", asyncio.Event()).set()  # b may finish now, a not yet
            elif fetch is b:
                gates.setdefault("a", asyncio.Event()).set()
        assert sess.statistics().completed == 1
    assert seen == [("c:0", 2.0), ("b:0", 2.0), ("a:0", 2.0), ("ab", {"ab": (2.0, 2.0)})]


async def _collect(stream: Any, into: list[Any]) -> None:
    async for item in stream:
        into.append(item)


async def test_the_error_surfaces_after_what_was_ready(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    ready = af.identity(x, name="ready")

    async def fails(v: Any) -> Any:
        await asyncio.sleep(0)
        raise ValueError("bad input")

    bad = af.py_func(fails, [x], af.float32, name="bad")
    seen: list[Any] = []
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="bad"):
            await _collect(sess.run_stream([bad, ready], {x: 3.0}), seen)
        assert seen == [(ready, 3.0)]
        assert sess.statistics().failed == 1
        assert await sess.run(ready, {x: 1.0}) == 1.0  # the session stays usable


async def test_leaving_early_cancels_the_rest_of_the_step(graph: af.Graph) -> None:
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    slow = _gated("slow", x, gates, log)
    fast = af.identity(x, name="fast")
    async with af.Session(graph=graph) as sess:
        async with contextlib.aclosing(sess.run_stream([slow, fast], {x: 1.0})) as stream:
            async for fetch, _ in stream:
                assert fetch is fast
                await asyncio.sleep(0)  # the slow kernel has started
                break
        # aclose() returned: the step was cancelled and has stopped.
        assert log == ["slow started", "slow cancelled"]
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert sess.statistics().in_flight == 0


async def test_a_bare_break_cancels_the_step_soon_after(graph: af.Graph) -> None:
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    slow = _gated("slow", x, gates, log)
    async with af.Session(graph=graph) as sess:
        async for _ in sess.run_stream([x * 1.0, slow], {x: 1.0}):
            await asyncio.sleep(0)
            break
        await wait_until(lambda: "slow cancelled" in log, "the unfinished kernel cancelled")
        assert log == ["slow started", "slow cancelled"]


async def test_devices_threads_targets_feeds_and_control_flow(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    with af.device("/cpu:1"):
        remote = af.identity(x + 1.0, name="remote")

    def square(v: Any) -> Any:
        return np.float32(v * v)

    threaded = af.py_func(square, [remote], af.float32, expensive=True, name="threaded")
    branch = af.cond(x > 0.0, lambda: x * 10.0, lambda: x * -10.0)
    target = af.no_op(name="target")
    fetches = [remote, threaded, branch, target, x, [remote, x]]
    config = af.SessionConfig(device_count={"CPU": 2})
    async with af.Session(graph=graph, config=config) as sess:
        got = [(f, v) async for f, v in sess.run_stream(fetches, {x: 2.0})]
        expected = await sess.run(fetches, {x: 2.0})
    assert sorted(map(id, (f for f, _ in got))) == sorted(map(id, fetches))
    by_fetch = {id(f): v for f, v in got}
    assert [by_fetch[id(f)] for f in fetches] == expected == [3.0, 9.0, 20.0, None, 2.0, [3.0, 2.0]]
    # The fed x is there before anything ran; the target when the step is done.
    order = [id(f) for f, _ in got]
    assert order.index(id(x)) < order.index(id(remote))
    assert order.index(id(target)) > order.index(id(threaded))


async def test_a_single_fetch_and_the_deadline(graph: af.Graph) -> None:
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    slow = _gated("slow", x, gates, log)
    async with af.Session(graph=graph) as sess:
        assert [v async for _, v in sess.run_stream(x + 1.0, {x: 1.0})] == [2.0]
        with pytest.raises(af.errors.DeadlineExceededError):
            async for _ in sess.run_stream(
                [slow], {x: 1.0}, options=af.RunOptions(timeout_in_ms=20)
            ):
                pass
        assert log == ["slow started", "slow cancelled"]


async def test_a_closed_session_refuses(graph: af.Graph) -> None:
    x = af.constant(1.0)
    sess = af.Session(graph=graph)
    await sess.close()
    with pytest.raises(RuntimeError, match="closed"):
        async for _ in sess.run_stream([x]):
            pass


async def test_cond_outputs_stream_when_the_taken_branch_computed_them(graph: af.Graph) -> None:
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    p = af.placeholder(af.bool, shape=(), name="p")
    slow = _gated("slow", x, gates, log)

    async def fetched(v: Any) -> Any:
        await asyncio.sleep(0)
        return v * np.float32(100)

    def taken() -> af.Tensor:
        return af.py_func(fetched, [x], af.float32, name="fetched")

    inner = af.cond(p, lambda: af.cond(x > 0.0, lambda: x * 2.0, lambda: x * 3.0), lambda: x - 1.0)
    outer = af.cond(p, taken, lambda: x * -1.0)
    passthrough = af.cond(p, lambda: x, lambda: x * 0.0)  # the taken branch returns x itself
    fetches = [slow, outer, inner, passthrough]
    config = af.SessionConfig(device_count={"CPU": 2})
    with af.device("/cpu:1"):
        remote = af.cond(p, lambda: x + 0.5, lambda: x - 0.5)
    async with af.Session(graph=graph, config=config) as sess:
        seen = []
        async with asyncio.timeout(5):  # without streamed conds: slow is never released
            async for fetch, value in sess.run_stream([*fetches, remote], {x: 2.0, p: True}):
                seen.append((fetch, value))
                if len(seen) == 3:  # the conds computed in their branches: slow may end now
                    gates.setdefault("slow", asyncio.Event()).set()
        for pred in (False, True):  # either branch: the values of run, once each
            feed = {x: 2.0, p: pred}
            got = [(f.name, v) async for f, v in sess.run_stream([*fetches, remote], feed)]
            assert sorted(got) == sorted(
                (f.name, v)
                for f, v in zip([*fetches, remote], await sess.run([*fetches, remote], feed))
            )
    names = [f.name for f, _ in seen]
    assert set(names[:3]) == {outer.name, inner.name, remote.name}
    assert names[3:] == [slow.name, passthrough.name]  # x unchanged: known at the end
    assert {f.name: v for f, v in seen} == {
        outer.name: 200.0,
        inner.name: 4.0,
        remote.name: 2.5,
        slow.name: 3.0,
        passthrough.name: 2.0,
    }


@pytest.mark.parametrize("straight_line", [True, False])
async def test_a_while_loop_output_streams_when_its_loop_exits(
    graph: af.Graph, straight_line: bool
) -> None:
    # An Exit runs no kernel: the propagator must tell the stream when it delivers the
    # loop's value, or the value would wait for the slow kernel (whose gate the
    # consumer opens only after it saw the loop's value).
    gates: dict[str, asyncio.Event] = {}
    log: list[str] = []
    x = af.placeholder(af.float32, shape=(), name="x")
    slow = _gated("slow", x, gates, log)
    looped = af.while_loop(
        lambda i, s: i < 5, lambda i, s: (i + 1, s + x), (af.constant(0), af.constant(0.0))
    )
    options = af.ExecutorOptions(straight_line=straight_line)
    async with af.Session(graph=graph, config=af.SessionConfig(executor_options=options)) as sess:
        seen = []
        async with asyncio.timeout(5):  # without the Exit hook: slow is never released
            async for fetch, value in sess.run_stream([slow, looped[1], looped[0]], {x: 2.0}):
                seen.append((fetch.name, value))
                if len(seen) == 2:
                    gates.setdefault("slow", asyncio.Event()).set()
    assert sorted(seen[:2]) == sorted([(looped[1].name, 10.0), (looped[0].name, 5)])
    assert seen[2:] == [(slow.name, 3.0)]
