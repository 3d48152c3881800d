"""The shared hanging-kernel fixture holds a step open until released or cancelled,
and never lets a blocked worker thread outlive its test."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import asyncflow as af

if TYPE_CHECKING:
    from tests.conftest import Hangs

CONFTEST = Path(__file__).with_name("conftest.py")


async def test_async_kernel_holds_the_step_until_released(
    graph: af.Graph, hanging_kernel: Hangs
) -> None:
    hang = hanging_kernel.async_kernel()
    y = af.py_func(hang, [af.constant(1.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        run = asyncio.ensure_future(sess.run(y))
        await hang.started.wait()
        assert not run.done()
        hang.release()
        assert await run == 1.0
    assert hang.ended == []


async def test_async_kernel_notes_its_cancellation(graph: af.Graph, hanging_kernel: Hangs) -> None:
    hang = hanging_kernel.async_kernel()
    y = af.py_func(hang, [af.constant(1.0)], af.float32)
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, options=af.RunOptions(timeout_in_ms=10))
    assert hang.ended == ["cancelled"]


async def test_thread_kernel_blocks_its_thread_until_released(
    graph: af.Graph, hanging_kernel: Hangs, no_leaked_threads: None
) -> None:
    hang = hanging_kernel.thread_kernel()
    y = af.py_func(hang, [af.constant(2.0)], af.float32, expensive=True)
    async with af.Session(graph=graph) as sess:
        run = asyncio.ensure_future(sess.run(y))
        await hang.wait_started()
        assert not run.done()
        assert hang.finished == 0
        hang.release()
        assert await run == 2.0
    assert hang.finished == 1


def test_a_thread_kernel_left_blocked_is_released_when_its_test_ends(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        test_left_blocked="""
        import threading

        def test_forgets_to_release(hanging_kernel):
            hang = hanging_kernel.thread_kernel()
            threading.Thread(target=hang, args=(1.0,), name="left-blocked").start()
            assert hang.started.wait(10)
        """
    )
    pytester.runpytest_inprocess().assert_outcomes(passed=1)
    blocked = [t for t in threading.enumerate() if t.name == "left-blocked"]
    for t in blocked:
        t.join(10)
    assert not any(t.is_alive() for t in blocked)
