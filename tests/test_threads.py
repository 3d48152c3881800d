"""Threads as TF has them: inter-op worker threads and intra-op BLAS threads.

A kernel on a worker thread reads what ``threadpoolctl`` says its BLAS library will
use, inside a ``boost`` (as the convolution kernels wrap a large GEMM) or not; kernels
that must overlap wait for each other on a ``threading.Barrier``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

import asyncflow as af
from asyncflow.runtime.devices import (
    SIZING_THREAD,
    BlasGovernor,
    available_cores,
    blas_governor,
)
from tests.ordering import block_until

pytestmark = pytest.mark.skipif(
    not any(lib["user_api"] == "blas" for lib in threadpool_info()),
    reason="numpy is linked to no BLAS library threadpoolctl can see",
)


def _blas_threads() -> int:
    return min(int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas")


def _seen(
    kernels: int,
    barrier: threading.Barrier | None = None,
    boost: bool = True,
    expensive: bool = True,
) -> tuple[af.Graph, list[af.Tensor]]:
    """``kernels`` expensive kernels (or inline ones) that each report the BLAS threads
    seen inside a boost (or outside one); with a barrier, every kernel runs before any
    boosts and none leaves before every one looked."""

    def look() -> int:
        seen = _blas_threads()
        if barrier is not None:
            barrier.wait(timeout=30)
        return seen

    def kernel(x: np.ndarray) -> np.int32:
        if barrier is not None:
            barrier.wait(timeout=30)
        if not boost:
            return np.int32(look())
        with blas_governor().boost() as ready:
            ready()  # (as a convolution calls it before its GEMM)
            return np.int32(look())

    g = af.Graph()
    with g.as_default():
        x = af.constant(np.ones((4, 4), np.float32))
        outs = [
            af.py_func(kernel, [x], af.int32, expensive=expensive, name=f"k{i}")
            for i in range(kernels)
        ]
    return g, outs


def test_a_kernel_alone_gets_every_core() -> None:
    g, (out,) = _seen(1)
    with af.Session(graph=g) as sess:
        assert sess.run_sync(out) == available_cores()


@pytest.mark.parametrize("intra", [1, 2])
def test_intra_op_threads_cap_a_kernel(intra: int) -> None:
    g, (out,) = _seen(1)
    config = af.SessionConfig(intra_op_parallelism_threads=intra)
    with af.Session(graph=g, config=config) as sess:
        assert sess.run_sync(out) == min(intra, available_cores())


def test_an_inline_kernel_is_not_boosted() -> None:
    # (On the event loop's or the caller's thread: a boost's gain there was the
    # machine's to decide, and a loss when it was busy; see BlasGovernor.boost.)
    g, (out,) = _seen(1, expensive=False)
    with af.Session(graph=g) as sess:
        assert sess.run_sync(out) == 1


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores to run two kernels")
def test_concurrent_kernels_share_the_cores_by_default() -> None:
    cores = available_cores()
    g, outs = _seen(cores, threading.Barrier(cores))
    with af.Session(graph=g) as sess:
        seen = sess.run_sync(outs)
    # inter-op * intra-op threads in use never exceed the cores by default.
    assert list(seen) == [1] * cores


def test_outside_a_boost_blas_rests_at_one_thread() -> None:
    g, (out,) = _seen(1, boost=False)
    with af.Session(graph=g) as sess:
        assert sess.run_sync(out) == 1
        assert _blas_threads() == 1  # on the caller's thread too, while sessions exist


def test_the_governor_grants_every_core_to_a_kernel_alone() -> None:
    gov = BlasGovernor(4)
    assert gov.grant(8) == 4  # no kernel counted yet: a caller alone
    gov.enter(8)
    assert gov.grant(8) == 4  # alone: every core (capped by the cores)
    assert gov.grant(2) == 2  # capped by its session's intra-op threads
    gov.enter(8)
    assert gov.grant(8) == 1  # two kernels: one thread each
    gov.exit()
    assert gov.grant(8) == 4  # the one left may have them all again
    gov.exit()


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores to boost")
def test_a_kernel_alone_gets_every_core_in_each_of_two_open_sessions() -> None:
    # OpenBLAS takes a size only from the first live thread that set one: a boost set
    # by the second session's worker thread, while the first session's worker (which
    # boosted first) was alive, used to run on one thread.
    (g1, (out1,)), (g2, (out2,)) = _seen(1), _seen(1)
    with af.Session(graph=g1) as first, af.Session(graph=g2) as second:
        assert first.run_sync(out1) == available_cores()
        assert second.run_sync(out2) == available_cores()
        assert first.run_sync(out1) == available_cores()
        assert _blas_threads() == 1  # back at rest between the boosts


class _Recorded:
    """A BLAS library controller that records the sizes set, and by which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def set_num_threads(self, n: int) -> None:
        self.calls.append((n, threading.current_thread().name))


@contextlib.contextmanager
def _worker_boost(gov: BlasGovernor) -> Iterator[None]:
    """A boost made as a kernel on a device's worker thread makes it (counted by the
    governor), its size waited for."""
    gov.enter(2)
    try:
        with gov.boost() as ready:
            ready()
            yield
    finally:
        gov.exit()


def _sizing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == SIZING_THREAD]


def test_the_sizing_thread_stops_with_the_last_device() -> None:
    gov, lib = BlasGovernor(2), _Recorded()
    gov._libs = [lib]
    before = _sizing_threads()
    gov.add_user()
    gov.add_user()
    with _worker_boost(gov):
        pass
    assert len(_sizing_threads()) == len(before) + 1
    gov.remove_user()
    assert len(_sizing_threads()) == len(before) + 1  # a device is still open
    gov.remove_user()
    assert _sizing_threads() == before
    assert [n for n, _ in lib.calls] == [1, 2, 1]


def test_the_sizing_thread_stops_when_idle_and_the_next_boost_starts_one() -> None:
    gov, lib = BlasGovernor(2, idle_s=0.05), _Recorded()
    gov._libs = [lib]
    before = _sizing_threads()
    gov.add_user()  # a device never closed
    for _ in range(2):
        with _worker_boost(gov):
            pass
        block_until(lambda: _sizing_threads() == before, "the idle sizing thread to exit")
    assert [n for n, _ in lib.calls] == [1, 2, 1, 2, 1]
    assert {name for _, name in lib.calls} == {"asyncflow-blas"}


class _TimesOutAsARequestComes:
    """The sizing thread's request queue, whose second wait times out just as a request
    is put (the thread then goes idle while a boost waits for its answer)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waits = 0
        self._put = threading.Event()

    def put(self, item: Any) -> None:
        self._queue.put(item)
        self._put.set()

    def get(self, timeout: float | None = None) -> Any:
        self._waits += 1
        if self._waits == 2:
            self._put.clear()
            self._put.wait(timeout=30)
            raise queue.Empty
        return self._queue.get(timeout=timeout)

    def empty(self) -> bool:
        return self._queue.empty()


def test_a_boost_answered_as_the_sizing_thread_goes_idle_returns() -> None:
    # The return to rest used to wait for the sizing thread while holding the
    # governor's lock, which the sizing thread takes as it goes idle: a deadlock.
    gov, lib = BlasGovernor(2), _Recorded()
    gov._libs = [lib]
    gov._requests = _TimesOutAsARequestComes()  # type: ignore[assignment]
    gov.add_user()

    def boost() -> None:
        with _worker_boost(gov):
            pass

    booster = threading.Thread(target=boost, daemon=True)
    booster.start()
    booster.join(timeout=10)
    assert not booster.is_alive(), "the boost never returned"
    gov.remove_user()
    assert [n for n, _ in lib.calls] == [1, 2, 1]


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores to boost")
def test_a_boost_after_the_sizing_thread_went_idle_gets_every_core() -> None:
    g, (out,) = _seen(1)
    with af.Session(graph=g) as sess:
        assert sess.run_sync(out) == available_cores()
        block_until(lambda: not _sizing_threads(), "the idle sizing thread to exit (1 s)")
        assert sess.run_sync(out) == available_cores()  # a new sizing thread: obeyed
        assert _blas_threads() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_boosts_without_the_parent_sizing_thread() -> None:
    # A forked child has no copy of the parent's sizing thread: before the governor
    # was reset at fork, a boost there waited forever for it.
    gov = blas_governor()
    gov.add_user()  # (as an open session's device)
    try:
        with _worker_boost(gov):
            pass
        assert _sizing_threads()  # running in the parent as it forks
        pid = os.fork()
        if pid == 0:  # the child: only this thread was copied
            code = 3  # (also after 20 s: bounded)
            try:
                threading.Timer(20, os._exit, (3,)).start()
                gov.add_user()
                with _worker_boost(gov):
                    pass
                gov.remove_user()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        gov.remove_user()


def test_the_setting_is_not_rewritten_when_unchanged() -> None:
    lib = _Recorded()
    calls = lib.calls

    gov = BlasGovernor(2)
    gov._libs = [lib]
    gov.add_user()
    gov.add_user()
    assert [n for n, _ in calls] == [1]

    def kernels() -> None:
        for _ in range(3):
            gov.enter(2)
            gov.exit()
        assert [n for n, _ in calls] == [1]  # small kernels: no call at all
        gov.enter(2)
        with gov.boost() as ready:
            ready()
            assert [n for n, _ in calls] == [1, 2]  # set once ready() returns
        gov.exit()

    for _ in range(2):  # on two threads: both boosts are made by the one sizing thread
        worker = threading.Thread(target=kernels)
        worker.start()
        worker.join()
        assert [n for n, _ in calls] == [1, 2, 1]  # at rest once the boost's block ended
        del calls[1:]
    gov.remove_user()
    gov.remove_user()  # the last device: the sizing thread stops
    assert calls == [(1, "asyncflow-blas")]
    with _worker_boost(gov):  # no device open: a thread made for each change
        assert [n for n, _ in calls] == [1, 2]
    assert [n for n, _ in calls] == [1, 2, 1]
    assert {name for _, name in calls} == {"asyncflow-blas"}
    with gov.boost() as ready:  # not a worker thread's kernel: no boost
        ready()
    assert len(calls) == 3


def test_no_environment_variable_is_set() -> None:
    code = (
        "import os; before = dict(os.environ)\n"
        "import numpy as np, asyncflow as af\n"
        "g = af.Graph()\n"
        "with g.as_default():\n"
        "    y = af.py_func(lambda x: x @ x, [af.constant(np.eye(8))], af.float64,"
        " expensive=True)\n"
        "with af.Session(graph=g) as sess:\n"
        "    sess.run_sync(y)\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("field", ["intra_op_parallelism_threads", "inter_op_parallelism_threads"])
@pytest.mark.parametrize("value", [-1, 1.5, "2"])
def test_bad_thread_counts_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        af.SessionConfig(**{field: value})  # type: ignore[arg-type]
