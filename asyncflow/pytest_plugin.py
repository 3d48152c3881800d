"""pytest plugin: fixtures for testing code built on asyncflow.

Registered through the ``pytest11`` entry point ``asyncflow``, so installing
asyncflow makes these fixtures available to every test suite (no conftest needed):

``af_graph``
    A fresh :class:`af.Graph`, the default graph for the duration of the test.
``af_session``
    An ``af.Session`` on ``af_graph``, closed after the test.  The test then fails
    (an error at teardown) when tasks started during it are still pending on its
    event loop, or asyncflow worker threads it started are still running.
``af_session_factory``
    ``af_session_factory(config=None, graph=None)`` makes more sessions (default
    graph: ``af_graph``), each closed and checked the same way.

The session fixtures are async fixtures of pytest-asyncio (1.x), declared with
``pytest_asyncio.fixture`` so they work in both ``asyncio_mode = "auto"`` and
``"strict"``.  Sync tests may use them too (``af_session.run_sync(...)``).  Without
pytest-asyncio installed, requesting them is an error that says so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from asyncflow.config import SessionConfig
from asyncflow.framework.graph import Graph
from asyncflow.runtime.devices import SIZING_THREAD
from asyncflow.session import Session

__all__ = ["af_graph", "af_session", "af_session_factory"]

#: Makes a session: ``factory(config=None, graph=None)``.
SessionFactory = Callable[..., Session]


@pytest.fixture
def af_graph() -> Iterator[Graph]:
    """A fresh graph, the default graph while the test runs."""
    graph = Graph()
    with graph.as_default():
        yield graph


class _Snapshot:
    """The tasks and asyncflow worker threads alive when a fixture started.

    Only what appeared after it counts as leaked, so tasks of wider-scoped fixtures
    (a server on a module-scoped loop) are left alone.
    """

    def __init__(self) -> None:
        self.tasks = asyncio.all_tasks()
        self.threads = _worker_threads()


def _worker_threads() -> set[threading.Thread]:
    """The sessions' worker threads (not the process's BLAS sizing thread)."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("asyncflow-") and t.name != SIZING_THREAD
    }


async def _close_and_check(sessions: list[Session], before: _Snapshot) -> None:
    """Close ``sessions``; ``pytest.fail`` naming leaked tasks or worker threads."""
    for sess in sessions:
        await sess.close()
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() - before.tasks if t is not current and not t.done()]
    threads = [t for t in _worker_threads() - before.threads if t.is_alive()]
    for task in tasks:  # do not let them run into the next test
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    problems = []
    if tasks:
        problems.append(
            f"{len(tasks)} task(s) still pending after the test: "
            f"{', '.join(sorted(repr(t.get_name()) for t in tasks))} "
            f"(await or cancel every task you start)"
        )
    if threads:
        problems.append(
            f"asyncflow worker thread(s) still running after the sessions "
            f"closed: {', '.join(sorted(t.name for t in threads))}"
        )
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


async def _af_session(af_graph: Graph) -> AsyncIterator[Session]:
    """A session on ``af_graph``; closed after the test, which fails if anything leaked."""
    before = _Snapshot()
    sess = Session(graph=af_graph)
    try:
        yield sess
    finally:
        await _close_and_check([sess], before)


async def _af_session_factory(af_graph: Graph) -> AsyncIterator[SessionFactory]:
    """``make(config=None, graph=None)`` → a new session, closed and checked after the test."""
    before = _Snapshot()
    sessions: list[Session] = []

    def make(config: SessionConfig | None = None, graph: Graph | None = None) -> Session:
        sess = Session(graph=af_graph if graph is None else graph, config=config)
        sessions.append(sess)
        return sess

    try:
        yield make
    finally:
        await _close_and_check(sessions, before)


def _needs_pytest_asyncio(name: str) -> Any:
    def fixture() -> Any:
        raise pytest.UsageError(
            f"the {name} fixture needs pytest-asyncio: pip install pytest-asyncio"
        )

    fixture.__doc__ = f"``{name}`` (unavailable: pytest-asyncio is not installed)."
    return pytest.fixture(fixture, name=name)


af_session: Any
af_session_factory: Any
try:
    import pytest_asyncio
except ImportError:  # the plugin must never break a suite that does not use it
    af_session = _needs_pytest_asyncio("af_session")
    af_session_factory = _needs_pytest_asyncio("af_session_factory")
else:
    af_session = pytest_asyncio.fixture(_af_session, name="af_session")
    af_session_factory = pytest_asyncio.fixture(_af_session_factory, name="af_session_factory")
