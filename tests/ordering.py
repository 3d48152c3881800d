"""Ordering a test by state it can observe, never by a sleep: wait until a step is in
flight (``Session.statistics()``), a kernel started, a queue holds its waiter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

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
