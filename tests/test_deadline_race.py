"""A deadline that lands as a multi-device step finishes: the caller gets the results
or ``DeadlineExceededError``, never an internal error.

The race, forced with events (no sleep): every partition of a 4-device chain has run
its last node (a hand-off drained devices 1-3 on the stack of device 0's async kernel),
but their tasks have not resumed yet when the deadline cancels the step.  The step's
outcome is then its results, which the partitions had not yet copied out of their
propagators.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

import asyncflow as af
from asyncflow.session import core as session_module

if TYPE_CHECKING:
    import pytest

DEVICES = 4


def _chain(kernel: Any) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """x -> async kernel (cpu:0) -> +1 on cpu:1 -> +1 on cpu:2 -> +1 on cpu:3."""
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        with af.device("/cpu:0"):
            y = af.reshape(af.py_func(kernel, [x], af.float64, name="slow"), ())
        for d in range(1, DEVICES):
            with af.device(f"/cpu:{d}"):
                y = y + 1.0
    return graph, x, y


def _config() -> af.SessionConfig:
    return af.SessionConfig(device_count={"CPU": DEVICES})


async def test_deadline_landing_as_the_last_partition_finishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(v: Any) -> Any:
        started.set()
        await release.wait()
        return v

    # The step's deadline, caught as the session makes it, so the test can expire it
    # at the chosen moment.
    deadlines: list[Any] = []
    make_timeout = asyncio.timeout_at

    def caught(when: float | None) -> AbstractContextManager[Any]:
        t = make_timeout(when)
        deadlines.append(t)
        return t  # type: ignore[return-value]

    monkeypatch.setattr(session_module.asyncio, "timeout_at", caught)
    graph, x, y = _chain(slow)
    loop = asyncio.get_running_loop()
    with af.Session(graph=graph, config=_config()) as sess:
        run = asyncio.create_task(
            sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=60_000))
        )
        await started.wait()
        (deadline,) = deadlines
        # Both callbacks queued in one turn, in this order: the deadline's (due now, so
        # queued at once) cancels the caller, then the kernel resumes and finishes every
        # partition (devices 1-3 by hand-off, on its stack).  The caller's cancellation
        # then reaches the partitions' tasks before they resume to hand out their values.
        deadline.reschedule(loop.time())
        release.set()
        try:
            value = await run
        except af.errors.DeadlineExceededError:
            value = None
        # Every node ran before the deadline took effect: the results are the outcome.
        assert value == np.float64(4.0)
        # The session stays usable.
        release.set()
        assert await sess.run(y, {x: 2.0}) == np.float64(5.0)


async def test_random_deadlines_soak() -> None:
    """Bounded: 300 steps, each with a deadline drawn around the step's own duration."""
    rng = random.Random(21)
    gate: list[asyncio.Future[None]] = []

    async def slow(v: Any) -> Any:
        await asyncio.sleep(0)
        if gate:
            await gate[0]
        return v

    graph, x, y = _chain(slow)
    loop = asyncio.get_running_loop()
    outcomes = {"value": 0, "deadline": 0}
    with af.Session(graph=graph, config=_config()) as sess:
        await sess.run(y, {x: 0.0})  # compiled and warm
        for k in range(300):
            fut = loop.create_future()
            gate[:] = [fut]
            if rng.random() < 0.5:
                loop.call_soon(fut.set_result, None)
            else:
                loop.call_later(rng.random() * 1e-4, fut.set_result, None)
            ms = rng.choice([1, 1, 1, 2])
            try:
                # Deadline and release race in the loop's timer queue.
                value = await sess.run(y, {x: float(k)}, options=af.RunOptions(timeout_in_ms=ms))
            except af.errors.DeadlineExceededError:
                outcomes["deadline"] += 1
                if not fut.done():
                    fut.cancel()
                continue
            assert value == np.float64(k + 3.0)
            outcomes["value"] += 1
    assert outcomes["value"] > 0
