"""Local devices: a name, a type, a bounded pool of worker threads, and BLAS threads.

Expensive kernels of a device run on that device's threads; at most
``max_threads`` of them at a time (TF's ``inter_op_parallelism_threads``), across
every step and every event loop that uses the session (a ``ThreadPoolExecutor`` is
thread-safe and bound to no loop, as long-lived session state must be).  Threads
start lazily, on the first expensive kernel, and stop when the session closes.

Inside such a kernel numpy calls a BLAS library (OpenBLAS in numpy's wheels) that
starts threads of its own, one per core by default: two kernels on two worker threads
ran four BLAS threads on two cores, and under load a small multi-threaded GEMM waited
for its helper threads to be scheduled (a 1 ms step took 10-40 ms).  The BLAS thread
pool is one per process, so one :class:`BlasGovernor` per process sets its size: one
thread at rest (from the first session on), and every core (at most TF's
``intra_op_parallelism_threads``) for a large GEMM of a kernel running alone
(:meth:`BlasGovernor.boost`, called by the convolution kernels).  The size is set
through ``threadpoolctl``'s library controllers, found once, and only when it
changes: a ``threadpool_limits`` block costs ~200 us per call (it looks the libraries
up again), a controller's ``set_num_threads`` ~0.6 us.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
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
    """Sizes the process's BLAS thread pool from the kernels running now.

    Kernels on worker threads are bracketed by ``enter`` / ``exit``; a kernel about to
    make a BLAS call worth several threads (a large GEMM) wraps it in :meth:`boost`.
    Outside a boost BLAS runs *one* thread (``resting``): on a loaded machine a small
    multi-threaded GEMM waits for its helper threads to get a core, and a 1 ms step
    took 10-40 ms.  A boost by a kernel running alone gets ``min(intra_op_threads,
    cores)`` threads; with other kernels running every kernel keeps one thread, so
    kernels * BLAS threads never exceeds the cores (concurrent steps share the cores
    as one thread each).  Shares are not re-balanced while a boost runs: OpenBLAS
    (0.3.31) ignores a smaller size set from another thread right after a thread
    raised it, so only the boosting thread lowers it again, when its GEMM is done.

    Invariant (under ``_lock``): ``_running`` kernels are on worker threads,
    ``_boosted`` says a boost holds more than the resting size, and the BLAS libraries
    were last set to ``_current`` threads (None: never set by us).
    """

    __slots__ = ("_boosted", "_cores", "_current", "_libs", "_lock", "_running")

    #: The BLAS threads outside boosts.
    resting = 1

    def __init__(self, cores: int) -> None:
        self._cores = cores
        self._running = 0
        self._boosted = False
        self._current: int | None = None
        self._libs: list[Any] | None = None  # threadpoolctl's BLAS controllers, found once
        self._lock = threading.Lock()

    def rest(self) -> None:
        """Put BLAS at its resting size, once per process (when a session starts).

        Done on a thread of its own: OpenBLAS ignores sizes set from other threads once
        the main thread has set one (measured with OpenBLAS 0.3.31), so the governor
        never sets the size from the main thread.
        """
        if self._current is not None:
            return
        setter = threading.Thread(target=self._rest, name="asyncflow-blas-rest")
        setter.start()
        setter.join()

    def _rest(self) -> None:
        with self._lock:
            if not self._boosted:
                self._set_locked(self.resting)

    def enter(self, cap: int) -> None:
        """A kernel allowed ``cap`` BLAS threads starts on a worker thread."""
        _local.cap = cap
        with self._lock:
            self._running += 1

    def exit(self) -> None:
        """That kernel ended."""
        with self._lock:
            self._running -= 1

    def grant(self, cap: int) -> int:
        """The BLAS threads a boost of a kernel allowed ``cap`` threads gets now."""
        if self._running > 1 or self._boosted:
            return self.resting
        return max(1, min(cap, self._cores))

    @contextlib.contextmanager
    def boost(self) -> Iterator[None]:
        """Give the BLAS call inside the block every core when its kernel runs alone.

        Only on worker threads (see :meth:`rest`); on the main thread it changes nothing.
        """
        if threading.current_thread() is threading.main_thread():
            yield
            return
        with self._lock:
            threads = self.grant(getattr(_local, "cap", self._cores))
            boosted = threads > self.resting
            if boosted:
                self._boosted = True
                self._set_locked(threads)
        try:
            yield
        finally:
            if boosted:
                with self._lock:
                    self._boosted = False
                    self._set_locked(self.resting)

    def _set_locked(self, threads: int) -> None:
        if threads == self._current:
            return
        libs = self._libs
        if libs is None:
            libs = self._libs = _blas_controllers()
        for lib in libs:
            lib.set_num_threads(threads)
        self._current = threads

    def __repr__(self) -> str:
        return (
            f"<BlasGovernor cores={self._cores} running={self._running} "
            f"boosted={self._boosted} threads={self._current}>"
        )


def _blas_controllers() -> list[Any]:
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


_local = threading.local()  # .cap: the BLAS threads this worker's kernel may use
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

    __slots__ = (
        "_closed",
        "_lock",
        "_pool",
        "blas_threads",
        "device_type",
        "index",
        "max_threads",
        "name",
    )

    def __init__(
        self, name: str, device_type: str, index: int, max_threads: int, intra_op_threads: int = 0
    ) -> None:
        self.name = name
        self.device_type = device_type
        self.index = index
        self.max_threads = max_threads
        self.blas_threads = intra_op_threads or available_cores()
        _GOVERNOR.rest()
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
                        self.max_threads, thread_name_prefix=f"asyncflow-CPU:{self.index}"
                    )
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
        return (
            f"<LocalDevice {self.name} threads<={self.max_threads} "
            f"blas_threads<={self.blas_threads}>"
        )


def _governed(cap: int, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """``fn(*args)`` on a worker thread, counted by the governor (see ``boost``)."""
    governor = _GOVERNOR
    governor.enter(cap)
    try:
        return fn(*args)
    finally:
        governor.exit()


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
