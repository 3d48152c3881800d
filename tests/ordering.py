"""Ordering a test by state it can observe, never by a sleep: wait until a step is in
flight (``Session.statistics()``), a kernel started, a queue holds its waiter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import asyncflow as af

#: A condition the test waits for that never comes fails the test after this long.
LIMIT_SECONDS = 10.0


async def wait_until(holds: Callable[[], bool], what: str) -> None:
    """Until ``holds()`` is true, checked once per turn of the event loop (so every
    other ready task runs in between), bounded by :data:`LIMIT_SECONDS`."""
    try:
        async with asyncio.timeout(LIMIT_SECONDS):
            while True:
                if holds():
                    return
                await asyncio.sleep(0)
    except TimeoutError:
        raise AssertionError(f"still waiting after {LIMIT_SECONDS} s for {what}") from None


async def wait_in_flight(sess: af.Session, steps: int) -> None:
    """Until ``steps`` steps of ``sess`` are parked on the loop (waiting on a queue, a
    kernel, a receive): each one got as far as it can before the test goes on."""
    await wait_until(
        lambda: sess.statistics().in_flight == steps, f"{steps} step(s) in flight on {sess!r}"
    )


def block_until(holds: Callable[[], bool], what: str) -> None:
    """:func:`wait_until` for a thread without an event loop of its own (a test that
    drives steps on another thread's loop): polls ``holds()``, bounded."""
    deadline = time.monotonic() + LIMIT_SECONDS
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {LIMIT_SECONDS} s for {what}")
        time.sleep(0.0005)


async def check_long_step_yields(sess: af.Session, fetch: Any, feed: Mapping[Any, Any]) -> None:
    """A step that would run for hours (``sess.run(fetch, feed)``) shares the event
    loop: its 100 ms deadline lands (well within 30 s), the loop turns again and again
    while it runs (20 turns, waited for by count, not by the clock: a loaded machine
    gives the process few slices in 100 ms), and cancelling it ends it."""
    turns = 0

    async def turning() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as tg:
        turner = tg.create_task(turning())
        start = time.perf_counter()
        try:
            await sess.run(fetch, feed, options=af.RunOptions(timeout_in_ms=100))
        except af.errors.DeadlineExceededError:
            pass
        else:
            raise AssertionError("the 100 ms deadline did not land")
        assert time.perf_counter() - start < 30
        assert turns > 1  # the loop turned while the step ran
        run = tg.create_task(sess.run(fetch, feed))
        turns = 0
        await wait_until(lambda: turns > 20, "20 turns of the loop during the step")
        assert not run.done()
        run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a cancelled step finished")
        turner.cancel()
