"""Shared fixtures: a fresh default graph per test, a check that nothing leaks,
kernels that hang until released or cancelled (one definition for every test that
needs a step held open), and Dask TLS security with a certificate made for the test."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncflow as af
from asyncflow.runtime.devices import SIZING_THREAD

pytest_plugins = ["pytester"]  # tests/test_pytest_plugin.py runs pytest on sample suites

#: No hanging kernel outlives this: a test that forgets to release or cancel one fails
#: with a TimeoutError naming it instead of hanging the suite.
HANG_LIMIT_SECONDS = 60.0


@pytest.fixture(autouse=True)
def _fresh_default_graph() -> Iterator[None]:
    af.reset_default_graph()
    yield
    af.reset_default_graph()


@pytest.fixture
def graph() -> Iterator[af.Graph]:
    g = af.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fails the test if it leaves asyncflow worker threads running."""
    yield
    alive = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("asyncflow-") and t.name != SIZING_THREAD
    ]
    assert not alive, f"leaked worker threads: {alive}"


class AsyncHang:
    """An async kernel (for ``af.py_func``) that waits until :meth:`release` d or
    cancelled.  ``started`` is set each time a call begins; ``ended`` gets
    ``"cancelled"`` per cancelled call; with ``swallow`` a cancelled call returns its
    input instead of re-raising (a kernel that ignores cancellation)."""

    def __init__(self, swallow: bool = False) -> None:
        self.started = asyncio.Event()
        self.ended: list[str] = []
        self.swallow = swallow
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def __call__(self, v: Any) -> Any:
        self.started.set()
        try:
            async with asyncio.timeout(HANG_LIMIT_SECONDS):
                await self._released.wait()
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            if not self.swallow:
                raise
        return v


class ThreadHang:
    """A synchronous kernel (run on a worker thread with ``expensive=True``) that blocks
    its thread until :meth:`release` d; the fixture releases it when the test ends, so
    no thread outlives the test.  ``finished`` counts the calls that returned."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finished = 0
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def __call__(self, v: Any) -> Any:
        self.started.set()
        if not self._released.wait(HANG_LIMIT_SECONDS):
            raise TimeoutError(f"{self!r} was never released")
        self.finished += 1
        return v

    async def wait_started(self) -> None:
        """Until a call has begun on its worker thread (bounded)."""
        if not await asyncio.to_thread(self.started.wait, HANG_LIMIT_SECONDS):
            raise TimeoutError(f"{self!r} never started")


class Hangs:
    """Makes hanging kernels for one test and releases the thread ones when it ends."""

    def __init__(self) -> None:
        self._threads: list[ThreadHang] = []

    def async_kernel(self, swallow: bool = False) -> AsyncHang:
        return AsyncHang(swallow)

    def thread_kernel(self) -> ThreadHang:
        kernel = ThreadHang()
        self._threads.append(kernel)
        return kernel

    def release_all(self) -> None:
        for kernel in self._threads:
            kernel.release()


@pytest.fixture(params=["driver", "Step.run"])
def awaited_both_ways(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Run the test twice: its steps awaited by the session driver's own loop (the
    default: no deadline), and by ``Step.run`` (every session made with a deadline far
    away, ``operation_timeout_in_ms``, so the driver awaits ``Step.run`` under it).
    The second checks that ``Step.run`` did run."""
    if request.param == "driver":
        yield request.param
        return
    from asyncflow.runtime.step import Step

    runs: list[int] = []
    run = Step.run
    init = af.Session.__init__

    def counted(step: Step) -> Any:
        runs.append(1)
        return run(step)

    def with_deadline(
        sess: af.Session,
        target: Any = "",
        graph: af.Graph | None = None,
        config: af.SessionConfig | None = None,
    ) -> None:
        base = config if config is not None else af.SessionConfig()
        init(sess, target, graph, dataclasses.replace(base, operation_timeout_in_ms=600_000))

    monkeypatch.setattr(Step, "run", counted)
    monkeypatch.setattr(af.Session, "__init__", with_deadline)
    yield request.param
    assert runs, "no step was awaited through Step.run"


@pytest.fixture
def hanging_kernel() -> Iterator[Hangs]:
    """``hanging_kernel.async_kernel()`` / ``.thread_kernel()``: a kernel that holds a step
    open until released or cancelled.  Async ones end with their task (cancelled) or
    their loop; thread ones are released here so no worker thread is left blocked."""
    hangs = Hangs()
    yield hangs
    hangs.release_all()


@pytest.fixture
def tls_security(tmp_path: Path) -> Any:
    """Dask ``Security`` with a self-signed certificate made here (openssl), for every
    role (what ``Security.temporary()`` does with the ``cryptography`` package), TLS
    required."""
    from distributed.security import Security

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=asyncflow-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    files = {
        f"tls_{role}_{kind}": str(path)
        for role in ("client", "scheduler", "worker")
        for kind, path in (("cert", cert), ("key", key))
    }
    return Security(tls_ca_file=str(cert), require_encryption=True, **files)  # type: ignore[no-untyped-call]
