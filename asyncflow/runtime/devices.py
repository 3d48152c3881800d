"""Local devices: a name, a type, a bounded pool of worker threads, and BLAS threads.

Expensive kernels of a device run on that device's threads; at most
``max_threads`` of them at a time (TF's ``inter_op_parallelism_threads``), across
every step and every event loop that uses the session (a ``ThreadPoolExecutor`` is
thread-safe and bound to no loop, as long-lived session state must be).  Threads
start lazily, on the first expensive kernel, and stop when the session closes.

Inside such a kernel numpy calls a BLAS library (OpenBLAS in numpy's wheels) that
starts threads of its own, one per core by default: two kernels on two worker threads
would run four BLAS threads on two cores and swing in time.  The BLAS thread pool is
one per process, so one :class:`BlasGovernor` per process sets its size from the
expensive kernels running at that moment: a kernel running alone gets
``min(intra_op_threads, cores)`` threads (TF's ``intra_op_parallelism_threads``), ``k``
concurrent kernels get ``cores // k`` each (at least one), so kernels * BLAS threads
never exceeds the cores while at most ``cores`` kernels run.  The size is set through
``threadpoolctl``'s library controllers, found once, and only when it changes: a
``threadpool_limits`` block costs ~200 µs per call (it looks the libraries up again),
a controller's ``set_num_threads`` ~0.6 µs.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["BlasGovernor", "LocalDevice", "available_cores", "blas_governor"]

T = TypeVar("T")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not on Linux
        return max(os.cpu_count() or 1, 1)


class BlasGovernor:
    """Sizes the process's BLAS thread pool from the expensive kernels running now.

    ``enter(cap)`` / ``exit(cap)`` bracket a kernel whose session allows ``cap`` BLAS
    threads per kernel.  Invariant (under ``_lock``): ``_active`` kernels are running,
    ``_caps`` counts their caps, and the BLAS libraries were last set to ``_current``
    threads (None: never set).  The size is left alone when the last kernel ends:
    the next one usually wants the same, and then no call is made.
    """

    __slots__ = ("_active", "_caps", "_cores", "_current", "_libs", "_lock")

    def __init__(self, cores: int) -> None:
        self._cores = cores
        self._active = 0
        self._caps: Counter[int] = Counter()
        self._current: int | None = None
        self._libs: list[Any] | None = None  # threadpoolctl's BLAS controllers, found once
        self._lock = threading.Lock()

    def enter(self, cap: int) -> None:
        """A kernel allowed ``cap`` BLAS threads starts."""
        with self._lock:
            self._active += 1
            self._caps[cap] += 1
            self._apply_locked()

    def exit(self, cap: int) -> None:
        """That kernel ended: the ones still running get its threads back."""
        with self._lock:
            self._active -= 1
            self._caps[cap] -= 1
            if not self._caps[cap]:
                del self._caps[cap]
            if self._active:
                self._apply_locked()

    def wanted(self) -> int:
        """The BLAS threads each running kernel gets now."""
        active = max(self._active, 1)
        cap = min(self._caps) if self._caps else self._cores
        return max(1, min(cap, self._cores // active))

    def _apply_locked(self) -> None:
        want = self.wanted()
        if want == self._current:
            return
        libs = self._libs
        if libs is None:
            libs = self._libs = _blas_controllers()
        for lib in libs:
            lib.set_num_threads(want)
        self._current = want

    def __repr__(self) -> str:
        return (f"<BlasGovernor cores={self._cores} active={self._active} "
                f"threads={self._current}>")


def _blas_controllers() -> list[Any]:
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


_GOVERNOR = BlasGovernor(available_cores())


def blas_governor() -> BlasGovernor:
    """The process's governor (BLAS thread pools are process-wide)."""
    return _GOVERNOR


class LocalDevice:
    """One device of a session (``/job:localhost/replica:0/task:0/device:CPU:0``).

    ``max_threads`` expensive kernels run at once; each may use up to
    ``intra_op_threads`` BLAS threads (0: one per core), shared as
    :class:`BlasGovernor` says.
    """

    __slots__ = ("_closed", "_lock", "_pool", "blas_threads", "device_type", "index",
                 "max_threads", "name")

    def __init__(self, name: str, device_type: str, index: int, max_threads: int,
                 intra_op_threads: int = 0) -> None:
        self.name = name
        self.device_type = device_type
        self.index = index
        self.max_threads = max_threads
        self.blas_threads = intra_op_threads or available_cores()
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
        cf: Future[T] = self._get_pool().submit(_governed, self.blas_threads, fn, args)
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
        return (f"<LocalDevice {self.name} threads<={self.max_threads} "
                f"blas_threads<={self.blas_threads}>")


def _governed(cap: int, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """``fn(*args)`` on a worker thread, with the BLAS threads the governor grants."""
    governor = _GOVERNOR
    governor.enter(cap)
    try:
        return fn(*args)
    finally:
        governor.exit(cap)


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
