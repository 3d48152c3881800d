"""A call keeps the steps of its program that completed, and runs its next steps on them.

A step the session's driver made (untraced, no deadline, no metadata) that completed
and that nothing else holds is kept by its compiled call (``Step.recycle``), holding
none of its run's values; the call's next step runs on it, its engine's state made
anew (``Step.again``).  A step that failed, was cancelled, or whose kernel took its
cancellation manager is released instead, and so is every step past the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import step as step_module

FROM_FIRST_RUN = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=0))


async def io(v: Any) -> Any:
    await asyncio.sleep(0)
    return v


def _service(graph: af.Graph) -> tuple[af.Tensor, af.Tensor]:
    """The service's step: two awaited calls, joined, then inline kernels."""
    with graph.as_default():
        x = af.placeholder(af.float32, shape=None, name="x")
        a = af.py_func(io, [x], af.float32, name="io_a")
        b = af.py_func(io, [af.add(x, np.float32(1.0))], af.float32, name="io_b")
        y = af.multiply(af.add(a, b), np.float32(2.0), name="y")
    return x, y


def _spare(sess: af.Session, y: af.Tensor, x: af.Tensor) -> list[Any]:
    spare: list[Any] = sess._prepare(y, {x: 0.0}).spare
    return spare


@contextlib.asynccontextmanager
async def _one_kept() -> AsyncIterator[tuple[af.Session, af.Tensor, af.Tensor, list[Any]]]:
    """A session of the service's step that ran it once: (session, x, y, the kept
    steps: the one it ran)."""
    x, y = _service(af.Graph())
    async with af.Session(graph=y.graph, config=FROM_FIRST_RUN) as sess:
        assert await sess.run(y, {x: 1.0}) == 6.0
        spare = _spare(sess, y, x)
        assert len(spare) == 1
        yield sess, x, y, spare


async def test_sequential_steps_run_on_one_kept_step_and_it_holds_no_values() -> None:
    x, y = _service(af.Graph())
    async with af.Session(graph=y.graph, config=FROM_FIRST_RUN) as sess:
        kept = []
        for v in range(8):
            fed = np.full((1000,), v, dtype=np.float32)
            got = await sess.run(y, {x: fed})
            np.testing.assert_array_equal(got, (2 * v + 1) * 2.0)
            spare = _spare(sess, y, x)
            assert len(spare) == 1
            kept.append(spare[0])
            # The kept step holds nothing of its run: the fed array, its results.
            gone = weakref.ref(fed)
            del fed, got
            assert gone() is None
        assert all(s is kept[0] for s in kept)  # one step, run again each time


async def test_concurrent_steps_are_kept_up_to_the_bound_and_stay_right() -> None:
    x, y = _service(af.Graph())
    async with af.Session(graph=y.graph, config=FROM_FIRST_RUN) as sess:
        n = step_module.SPARE_STEPS + 16
        for _ in range(3):
            got = await asyncio.gather(*(sess.run(y, {x: float(v)}) for v in range(n)))
            assert [float(g) for g in got] == [(2 * v + 1) * 2.0 for v in range(n)]
            spare = _spare(sess, y, x)
            assert len(spare) == step_module.SPARE_STEPS
            assert len({id(s) for s in spare}) == len(spare)


async def test_a_failed_or_cancelled_step_is_not_kept_and_the_next_runs_right() -> None:
    waiting, release = asyncio.Event(), asyncio.Event()

    async def check(v: Any) -> Any:
        if v < 0:
            raise ValueError("negative input")
        if v == 99:
            waiting.set()
            await release.wait()
        await asyncio.sleep(0)
        return v

    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        a = af.py_func(check, [x], af.float32, name="check")
        y = af.multiply(a, np.float32(2.0), name="y")
    async with af.Session(graph=graph, config=FROM_FIRST_RUN) as sess:
        assert await sess.run(y, {x: 1.0}) == 2.0
        spare = _spare(sess, y, x)
        (kept,) = spare
        with pytest.raises(af.errors.InvalidArgumentError, match="negative input") as info:
            await sess.run(y, {x: -1.0})
        assert info.value.node_name == "check"
        assert spare == []  # the failed run took the kept step, and did not give it back
        assert await sess.run(y, {x: 3.0}) == 6.0
        assert len(spare) == 1
        assert spare[0] is not kept  # a new one, kept in its turn
        kept = spare[0]
        task = asyncio.ensure_future(sess.run(y, {x: 99.0}))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert spare == []
        assert await sess.run(y, {x: 4.0}) == 8.0
        assert len(spare) == 1
        assert spare[0] is not kept


async def test_a_step_whose_kernel_took_its_cancellation_manager_is_not_kept() -> None:
    managers: list[Any] = []

    async def polite(v: Any) -> Any:
        managers.append(af.get_cancellation_manager())
        await asyncio.sleep(0)
        return v

    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(af.py_func(polite, [x], af.float32), np.float32(2.0))
    async with af.Session(graph=graph, config=FROM_FIRST_RUN) as sess:
        for v in range(3):
            assert await sess.run(y, {x: float(v)}) == 2.0 * v
            assert _spare(sess, y, x) == []
        assert len({id(m) for m in managers}) == 3  # one per step: none shared


async def test_traced_deadlined_and_metadata_runs_make_their_own_steps() -> None:
    async with _one_kept() as (sess, x, y, spare):
        (kept,) = spare
        trace = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        metadata = af.RunMetadata()
        assert await sess.run(y, {x: 2.0}, options=trace, run_metadata=metadata) == 10.0
        assert metadata.step_stats.dev_stats  # its own step's records
        assert await sess.run(y, {x: 2.0}, options=af.RunOptions(timeout_in_ms=5_000)) == 10.0
        assert await sess.run(y, {x: 3.0}, run_metadata=af.RunMetadata()) == 14.0
        assert spare == [kept]  # none of them took it or gave one back


def test_steps_on_several_threads_share_the_kept_steps() -> None:
    x, y = _service(af.Graph())
    failures: list[BaseException] = []
    with af.Session(graph=y.graph, config=FROM_FIRST_RUN) as sess:

        def worker(k: int) -> None:
            try:
                for v in range(40):
                    assert (
                        float(sess.run_sync(y, {x: float(k * 100 + v)}))
                        == (2 * (k * 100 + v) + 1) * 2.0
                    )
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        assert 1 <= len(_spare(sess, y, x)) <= 4


async def test_a_stream_and_a_progress_run_keep_their_steps_apart_from_the_call() -> None:
    # A stream's or a progress run's plans are the call's with observing kernels: a
    # step of theirs is never run again as the call's (it would report to a stream
    # that ended, or count for a progress callback that is gone), nor the reverse.
    async with _one_kept() as (sess, x, y, spare):
        (kept,) = spare
        bound = sess._prepare(y, {x: 1.0}).bound[0]
        a, b = (y.graph.get_tensor_by_name(f"{n}:0") for n in ("io_a", "io_b"))
        for v in range(3):
            got = [float(value) async for _, value in sess.run_stream([a, b, y], {x: float(v)})]
            assert sorted(got) == sorted([v, v + 1.0, (2 * v + 1) * 2.0])
        for v in range(3):
            events: list[af.ProgressEvent] = []
            progress = af.RunOptions(progress=events.append)
            assert await sess.run(y, {x: float(v)}, options=progress) == (2 * v + 1) * 2.0
            assert events[-1].finished
            assert events[-1].nodes_done == events[-1].nodes_total  # its kernels counted
        assert spare == [kept]
        assert all(s._bound is bound for s in spare)
        assert await sess.run(y, {x: 5.0}) == 22.0
        assert spare == [kept]
