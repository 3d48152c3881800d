"""run_sync keeps one event loop per session and calling thread."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import numpy as np
import pytest

import asyncflow as af


def _loop_recorder(graph: af.Graph) -> tuple[af.Tensor, list[asyncio.AbstractEventLoop]]:
    loops: list[asyncio.AbstractEventLoop] = []

    async def where(v: Any) -> Any:
        loops.append(asyncio.get_running_loop())
        return v

    return af.py_func(where, [af.constant(1.0)], af.float32), loops


def test_run_sync_keeps_its_loop_across_calls_and_closes_it(graph: af.Graph) -> None:
    y, loops = _loop_recorder(graph)
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(y) == 1.0
        assert sess.run_sync(y) == 1.0
        assert len(loops) == 2
        assert loops[0] is loops[1]
        assert not loops[0].is_closed()
    assert loops[0].is_closed()  # closed with the session


def test_loop_bound_objects_work_across_calls(graph: af.Graph) -> None:
    """An asyncio.Lock contended in one call is bound to that call's loop; a fresh loop
    per call (asyncio.run) would fail the second call with 'bound to a different loop'."""
    lock = asyncio.Lock()
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def hold(v: Any) -> Any:
        async with lock:
            await asyncio.sleep(0.001)
        return v

    async def get(v: Any) -> Any:
        return np.float32(v + await queue.get())

    async def put(v: Any) -> Any:
        await asyncio.sleep(0.001)  # get() waits first: the queue binds to the loop
        queue.put_nowait(1)
        return v

    x = af.constant(1.0)
    a, b = (af.py_func(hold, [x], af.float32) for _ in range(2))
    c = af.py_func(get, [x], af.float32)
    d = af.py_func(put, [x], af.float32)
    with af.Session(graph=graph) as sess:
        for _ in range(3):
            assert sess.run_sync([a, b, c, d]) == [1.0, 1.0, 2.0, 1.0]


def test_callable_run_sync_shares_the_loop(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    loops: list[asyncio.AbstractEventLoop] = []

    async def plus_one(v: Any) -> Any:
        loops.append(asyncio.get_running_loop())
        return v + np.float32(1)

    y = af.py_func(plus_one, [x], af.float32)
    with af.Session(graph=graph) as sess:
        fn = sess.make_callable(y, feed_list=[x])
        assert isinstance(fn, af.SessionCallable)
        assert repr(fn) == "<SessionCallable [PyFunc:0] <- [x:0]>"
        assert fn.run_sync(1.0) == 2.0
        assert fn.run_sync(2.0) == 3.0
        assert sess.run_sync(y, {x: 0.0}) == 1.0
        with pytest.raises(TypeError, match="expected 1 feed values"):
            fn.run_sync()
        with pytest.raises(TypeError, match="accept_options=True"):
            fn.run_sync(1.0, options=af.RunOptions())
        assert len(set(map(id, loops))) == 1
    assert loops[0].is_closed()
    with pytest.raises(RuntimeError, match="closed"):
        fn.run_sync(1.0)


def test_inline_plans_stay_loop_free(graph: af.Graph) -> None:
    running: list[bool] = []

    def probe(v: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            running.append(False)
        else:
            running.append(True)
        return v

    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.py_func(probe, [x + 1.0], af.float32)
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(y, {x: 1.0}) == 2.0
        assert sess.make_callable(y, [x]).run_sync(2.0) == 3.0
    assert running == [False, False]


async def test_run_sync_inside_a_running_loop_raises(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = x * 2.0
    async with af.Session(graph=graph) as sess:
        with pytest.raises(RuntimeError, match=r"await sess\.run"):
            sess.run_sync(y, {x: 1.0})
        fn = sess.make_callable(y, [x])
        with pytest.raises(RuntimeError, match=r"await fn\(\.\.\.\)"):
            fn.run_sync(1.0)
        assert await fn(2.0) == 4.0


def test_each_thread_has_its_own_loop_closed_with_the_session(graph: af.Graph) -> None:
    y, loops = _loop_recorder(graph)
    sess = af.Session(graph=graph)
    per_thread: dict[str, list[asyncio.AbstractEventLoop]] = {}

    def work(name: str) -> None:
        before = len(loops)
        sess.run_sync(y)
        sess.run_sync(y)
        per_thread[name] = loops[before:]

    sess.run_sync(y)  # the main thread's own runner, made first
    main = loops[-1]
    for name in ("a", "b"):  # one after the other: the loops list is not shared racily
        t = threading.Thread(target=work, args=(name,))
        t.start()
        t.join()
    a, b = per_thread["a"], per_thread["b"]
    assert a[0] is a[1]
    assert b[0] is b[1]
    assert len({id(a[0]), id(b[0]), id(main)}) == 3
    # Thread "a" had exited when "b" made its runner: "a"'s loop was closed then.
    assert a[0].is_closed()
    # "b" has exited too; no thread made a runner since: its loop closes with the session.
    assert not b[0].is_closed()
    assert not main.is_closed()
    sess.run_sync(y)  # the main thread still has its loop
    assert loops[-1] is main
    sess.close_sync()
    assert b[0].is_closed()
    assert main.is_closed()


def test_concurrent_threads(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")

    async def slow_double(v: Any) -> Any:
        await asyncio.sleep(0.001)
        return v * np.float32(2)

    y = af.py_func(slow_double, [x], af.float32)
    results: dict[int, list[float]] = {}
    with af.Session(graph=graph) as sess:

        def work(k: int) -> None:
            results[k] = [float(sess.run_sync(y, {x: float(k + i)})) for i in range(20)]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {k: [2.0 * (k + i) for i in range(20)] for k in range(4)}


async def test_async_close_closes_the_runners(graph: af.Graph) -> None:
    y, loops = _loop_recorder(graph)
    sess = af.Session(graph=graph)
    await asyncio.to_thread(sess.run_sync, y)
    assert len(loops) == 1
    assert not loops[0].is_closed()
    await sess.close()
    assert loops[0].is_closed()


def test_a_session_nobody_closed_closes_its_loops_when_collected(graph: af.Graph) -> None:
    y, loops = _loop_recorder(graph)
    sess = af.Session(graph=graph)
    assert sess.run_sync(y) == 1.0
    del sess
    gc.collect()
    assert loops[0].is_closed()
