"""Local devices: a name, a type, and a bounded pool of worker threads.

Expensive kernels of a device run on that device's threads; at most
``max_threads`` of them at a time, across every step and every event loop that uses
the session (a ``ThreadPoolExecutor`` is thread-safe and bound to no loop, which is
what docs/architecture.md asks of long-lived session state).  Threads start lazily, on the
first expensive kernel, and stop when the session closes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["LocalDevice"]

T = TypeVar("T")


class LocalDevice:
    """One device of a session (``/job:localhost/replica:0/task:0/device:CPU:0``)."""

    __slots__ = ("_closed", "_lock", "_pool", "device_type", "index", "max_threads", "name")

    def __init__(self, name: str, device_type: str, index: int, max_threads: int) -> None:
        self.name = name
        self.device_type = device_type
        self.index = index
        self.max_threads = max_threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _get_pool(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"device {self.name!r} is closed")
                pool = self._pool
                if pool is None:
                    pool = self._pool = ThreadPoolExecutor(
                        self.max_threads, thread_name_prefix=f"asyncflow-CPU:{self.index}")
        return pool

    async def run_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on one of this device's threads and await its result.

        Cancellation does not abandon the thread: if ``fn`` already started, this
        waits for it to finish (discarding its result) before re-raising, so a
        cancelled or failed step never leaves work running behind it.
        """
        cf: Future[T] = self._get_pool().submit(fn, *args)
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            if not cf.cancel():
                await _wait_ignoring_cancel(cf)
            raise

    def close(self) -> None:
        """Stop the threads (waits for running kernels; idempotent)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"<LocalDevice {self.name} threads<={self.max_threads}>"


async def _wait_ignoring_cancel(cf: Future[Any]) -> None:
    waiter = asyncio.wrap_future(cf)
    while not waiter.done():
        try:
            await asyncio.shield(waiter)
        except asyncio.CancelledError:
            continue  # keep waiting: the thread cannot be interrupted
        except Exception:
            return  # its error is irrelevant now: the step already failed
    if not waiter.cancelled():
        waiter.exception()  # retrieved, so asyncio does not log it as unhandled
