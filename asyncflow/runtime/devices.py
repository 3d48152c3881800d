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

OpenBLAS (0.3.31, numpy's wheels) takes a size only from the first live thread that
set one: once a thread has set it, sizes set from any other thread are ignored until
that thread exits (measured: a boost on a device's second worker thread, or in a
second session, ran on one thread).  So while a boost may come, one thread of the
governor's own (``asyncflow-blas``) makes every change: it starts with the first boost
and stops when the last open device closes, or after a second without a boost.  A
program that sizes BLAS from its own long-lived thread (``threadpoolctl`` on the main
thread) keeps that size: OpenBLAS ignores the governor then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = [
    "SIZING_THREAD",
    "BlasGovernor",
    "LocalDevice",
    "available_cores",
    "blas_governor",
    "ready_now",
]

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
    as one thread each).  Shares are not re-balanced while a boost runs.

    Every size is set by one thread (see the module's docstring): the ``asyncflow-blas``
    thread while open devices (``add_user`` / ``remove_user``) boost, else a thread
    made for the one change, so that no thread of ours holds OpenBLAS's size when no
    device is open or none boosted for ``idle_s`` seconds.  A boost waits for its size
    to be set (~30 us, overlapped with the kernel's own work up to its BLAS call), and
    for the rest after it (so that outside a boost BLAS is at rest, always).

    Invariant (under ``_lock``): ``_running`` kernels are on worker threads,
    ``_boosted`` says a boost holds more than the resting size, the BLAS libraries
    were last set (or are about to be set, in order) to ``_current`` threads (None:
    never set by us), ``_users`` devices are open, and ``_setter`` is the sizing
    thread (None: not running).
    """

    __slots__ = (
        "_boosted",
        "_cores",
        "_current",
        "_idle_s",
        "_libs",
        "_lock",
        "_requests",
        "_retired",
        "_running",
        "_setter",
        "_users",
    )

    #: The BLAS threads outside boosts.
    resting = 1

    def __init__(self, cores: int, idle_s: float = 1.0) -> None:
        self._cores = cores
        self._idle_s = idle_s  # without a request, the sizing thread exits
        self._running = 0
        self._users = 0
        self._boosted = False
        self._current: int | None = None
        self._libs: list[Any] | None = None  # threadpoolctl's BLAS controllers, found once
        self._lock = threading.Lock()
        self._setter: threading.Thread | None = None
        # The last sizing thread, which may still be exiting: OpenBLAS ignores the
        # next one's sizes until it is gone, so the next one joins it first.
        self._retired: threading.Thread | None = None
        # (threads, done) for the sizing thread; None stops it.
        self._requests: queue.SimpleQueue[tuple[int, threading.Lock] | None] = queue.SimpleQueue()

    @property
    def users(self) -> int:
        """The open devices."""
        return self._users

    def add_user(self) -> None:
        """A device opened: BLAS goes to its resting size (once per process, before the
        device counts: by a thread made for it, not the sizing thread)."""
        done = None
        with self._lock:
            if self._current is None and not self._boosted:
                done = self._set_locked(self.resting)
            self._users += 1
        if done is not None:
            done.acquire()

    def remove_user(self) -> None:
        """A device closed: the last one stops the sizing thread (after the requests
        before it)."""
        with self._lock:
            self._users -= 1
            setter = self._setter if self._users <= 0 else None
            if setter is not None:
                self._setter = None
                self._retired = setter
                self._requests.put(None)
        if setter is not None and setter is not threading.current_thread():
            setter.join()

    def enter(self, cap: int) -> None:
        """A kernel allowed ``cap`` BLAS threads starts on a worker thread."""
        _local.cap = cap
        with self._lock:
            self._running += 1

    def exit(self) -> None:
        """That kernel ended (its thread may run inline code next: not a worker's)."""
        _local.cap = None
        with self._lock:
            self._running -= 1

    def grant(self, cap: int) -> int:
        """The BLAS threads a boost of a kernel allowed ``cap`` threads gets now."""
        if self._running > 1 or self._boosted:
            return self.resting
        return max(1, min(cap, self._cores))

    @contextlib.contextmanager
    def boost(self) -> Iterator[Callable[[], object]]:
        """Give the BLAS call inside the block every core (as many as its device
        allows) when its kernel runs alone on a worker thread.

        The size is set meanwhile, on the sizing thread: the block calls the function
        it is given right before its BLAS call, which waits until the size is set (a
        convolution builds its window matrix meanwhile).

        A kernel running inline (on the event loop's or the caller's thread) is not
        boosted.  Measured on the batch-8 ResNet block, whose GEMMs of 9-19M
        multiply-adds run inline: on an idle machine its step went from 2.26 to 1.94
        ms median with them boosted, but with one busy process beside it to 3.9 ms
        (2.4 at rest), in the benchmark with TF's threads beside it no faster, and at
        other times on the same idle machine no faster either (a boosted GEMM between
        other kernels ran at ~60 GMAC/s where one thread gives ~55): a gain that the
        machine decides, and a loss when it is busy.
        """
        cap = getattr(_local, "cap", None)
        if cap is None:
            yield ready_now
            return
        done: threading.Lock | None = None
        with self._lock:
            threads = self.grant(cap)
            boosted = threads > self.resting
            if boosted:
                self._boosted = True
                done = self._set_locked(threads)
        try:
            yield ready_now if done is None else done.acquire
        finally:
            if boosted:
                with self._lock:
                    self._boosted = False
                    done = self._set_locked(self.resting)
                if done is not None:
                    done.acquire()

    def _set_locked(self, threads: int) -> threading.Lock | None:
        """Size BLAS to ``threads`` from the one sizing thread: a lock released once it
        is set (None: set already), to wait for *after* ``_lock`` is released (the
        sizing thread takes ``_lock`` as it goes idle); the requests are taken in
        order."""
        if threads == self._current:
            return None
        if self._libs is None:
            self._libs = _blas_controllers()
        self._current = threads
        retired, self._retired = self._retired, None
        if self._setter is None and self._users <= 0:
            setter = threading.Thread(target=self._set, args=(threads, retired), name=SIZING_THREAD)
            setter.start()
            setter.join()
            return None
        if self._setter is None:
            self._setter = threading.Thread(
                target=self._serve, args=(retired,), name=SIZING_THREAD, daemon=True
            )
            self._setter.start()
        done = threading.Lock()
        done.acquire()
        self._requests.put((threads, done))
        return done

    def _after_fork(self) -> None:
        """In a forked child: no sizing thread (it was not copied), no devices of the
        parent's, and a fresh lock and queue (a thread of the parent may have held the
        lock as it forked)."""
        self._lock = threading.Lock()
        self._requests = queue.SimpleQueue()
        self._setter = None
        self._retired = None
        self._users = 0
        self._running = 0
        self._boosted = False

    def _set(self, threads: int, retired: threading.Thread | None = None) -> None:
        if retired is not None:
            retired.join()  # (exiting: OpenBLAS obeys this thread once it is gone)
        for lib in self._libs or ():
            lib.set_num_threads(threads)

    def _serve(self, retired: threading.Thread | None) -> None:
        """The sizing thread: each request in order, until told to stop or idle for
        ``idle_s`` (a session never closed does not keep it: the next boost starts
        another, which OpenBLAS obeys once this one has exited)."""
        if retired is not None:
            retired.join()
        while True:
            try:
                request = self._requests.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:  # (requests are put under the lock: none is lost)
                    if not self._requests.empty():
                        continue
                    if self._setter is threading.current_thread():
                        self._setter = None
                        self._retired = threading.current_thread()
                    return
            if request is None:
                return
            threads, done = request
            try:
                self._set(threads)
            finally:
                done.release()

    def __repr__(self) -> str:
        return (
            f"<BlasGovernor cores={self._cores} running={self._running} "
            f"boosted={self._boosted} threads={self._current} users={self.users}>"
        )


def _blas_controllers() -> list[Any]:
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


def ready_now() -> None:
    """What a boost that changed no size gives its block: nothing to wait for."""


#: The name of the governor's sizing thread: the process's, like BLAS's own threads
#: (it lives while a device is open or a boost came in the last second), so not a
#: session's worker thread to count as leaked when a session closes.
SIZING_THREAD = "asyncflow-blas"

_local = threading.local()  # .cap: the BLAS threads this worker's kernel may use
_GOVERNOR = BlasGovernor(available_cores())
os.register_at_fork(after_in_child=_GOVERNOR._after_fork)


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
        _GOVERNOR.add_user()  # (until its close)
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
            closing, self._closed = not self._closed, True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if closing:
            _GOVERNOR.remove_user()

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
