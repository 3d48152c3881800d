"""Backpressure: at most N steps of a session in flight, later ones wait in FIFO order.

The session is loop-agnostic (steps come from any loop and from ``run_sync`` on any
thread), so this is not an ``asyncio.Semaphore``: the long-lived state is a thread
lock, a count and a FIFO of waiters, each waiter a future of *its own* loop, woken
with ``call_soon_threadsafe``.  A released slot is handed straight to the oldest
waiter (the count does not drop in between), so a newcomer can never overtake the
queue.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from asyncflow import errors

__all__ = ["Admission"]


class _Waiter:
    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
        self.loop = loop
        self.future = future
        #: Set (under the admission's lock) when a slot was handed to this waiter: from
        #: then on the slot is its own and must be released even if it was cancelled.
        self.granted = False


class Admission:
    """A FIFO counting gate of ``limit`` slots, usable from any loop and thread."""

    __slots__ = ("_lock", "_running", "_waiters", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._lock = threading.Lock()
        #: Slots held.  Invariant: ``_waiters`` is empty unless ``_running == limit``.
        self._running = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def running(self) -> int:
        """Slots held now."""
        return self._running

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot."""
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits; never blocks."""
        with self._lock:
            if self._running < self.limit and not self._waiters:
                self._running += 1
                return True
        return False

    async def acquire(self) -> None:
        """Wait for a slot, in arrival order.  Cancellation leaves no slot taken."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._running < self.limit and not self._waiters:
                self._running += 1
                return
            waiter = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:  # handed a slot just as it was cancelled: pass it on
                self.release()
            raise

    async def acquire_within(self, timeout_ms: int) -> int:
        """:meth:`acquire` within a deadline (``timeout_ms``; 0: none); returns the
        milliseconds of it left (at least 1; 0 without a deadline).

        Past the deadline: ``DeadlineExceededError``, no slot taken.
        """
        if timeout_ms <= 0:
            await self.acquire()
            return 0
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_ms / 1000) as deadline:
                await self.acquire()
        except TimeoutError:
            if not deadline.expired():
                raise
            raise errors.DeadlineExceededError(
                None,
                None,
                f"Timed out waiting for a step slot: {self.limit} steps in "
                f"flight (max_concurrent_steps), timeout_in_ms={timeout_ms}",
            ) from None
        return max(1, timeout_ms - int((time.monotonic() - start) * 1000))

    def release(self) -> None:
        """Give a slot back: to the oldest waiter, or to the pool."""
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                waiter.granted = True
                try:
                    waiter.loop.call_soon_threadsafe(_wake, waiter.future)
                except RuntimeError:  # its loop is closed: that caller is gone
                    continue
                return
            self._running -= 1


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
