"""Threads as TF has them: inter-op worker threads and intra-op BLAS threads.

A kernel on a worker thread reads what ``threadpoolctl`` says its BLAS library will
use; kernels that must overlap wait for each other on a ``threading.Barrier``.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import asyncflow as af
from asyncflow.runtime.devices import BlasGovernor, available_cores

pytestmark = pytest.mark.skipif(
    not any(lib["user_api"] == "blas" for lib in threadpool_info()),
    reason="numpy is linked to no BLAS library threadpoolctl can see")


def _blas_threads() -> int:
    return min(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")


def _seen(kernels: int, barrier: threading.Barrier | None = None) -> tuple[af.Graph, list[af.Tensor]]:
    """``kernels`` expensive kernels that each report the BLAS threads seen inside."""
    def kernel(x: np.ndarray) -> np.int32:
        if barrier is not None:
            barrier.wait(timeout=30)  # every kernel is running now
        seen = _blas_threads()
        if barrier is not None:
            barrier.wait(timeout=30)  # nobody left before everyone looked
        return np.int32(seen)

    g = af.Graph()
    with g.as_default():
        x = af.constant(np.ones((4, 4), np.float32))
        outs = [af.py_func(kernel, [x], af.int32, expensive=True, name=f"k{i}")
                for i in range(kernels)]
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


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores to run two kernels")
def test_concurrent_kernels_share_the_cores_by_default() -> None:
    cores = available_cores()
    g, outs = _seen(cores, threading.Barrier(cores))
    with af.Session(graph=g) as sess:
        seen = sess.run_sync(outs)
    # inter-op * intra-op threads in use never exceed the cores by default.
    assert list(seen) == [max(1, cores // cores)] * cores
    assert sum(seen) <= cores


def test_the_governor_shares_and_returns_threads() -> None:
    gov = BlasGovernor(4)
    gov.enter(8)
    assert gov.wanted() == 4          # alone: every core (capped by the cores)
    gov.enter(8)
    assert gov.wanted() == 2          # two kernels: half each
    gov.enter(1)
    assert gov.wanted() == 1          # a session capped at 1 thread caps them all
    gov.exit(1)
    gov.exit(8)
    assert gov.wanted() == 4          # the one left gets them back
    gov.exit(8)


def test_the_setting_is_not_rewritten_when_unchanged() -> None:
    calls: list[int] = []

    class Lib:
        def set_num_threads(self, n: int) -> None:
            calls.append(n)

    gov = BlasGovernor(2)
    gov._libs = [Lib()]
    for _ in range(3):
        gov.enter(2)
        gov.exit(2)
    assert calls == [2]
    gov.enter(2)
    gov.enter(2)
    gov.exit(2)
    gov.exit(2)
    assert calls == [2, 1, 2]


def test_no_environment_variable_is_set() -> None:
    code = ("import os; before = dict(os.environ)\n"
            "import numpy as np, asyncflow as af\n"
            "g = af.Graph()\n"
            "with g.as_default():\n"
            "    y = af.py_func(lambda x: x @ x, [af.constant(np.eye(8))], af.float64,"
            " expensive=True)\n"
            "with af.Session(graph=g) as sess:\n"
            "    sess.run_sync(y)\n"
            "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("field", ["intra_op_parallelism_threads",
                                   "inter_op_parallelism_threads"])
@pytest.mark.parametrize("value", [-1, 1.5, "2"])
def test_bad_thread_counts_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        af.SessionConfig(**{field: value})  # type: ignore[arg-type]
