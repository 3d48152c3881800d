"""The pytest plugin (entry point ``pytest11``): af_graph, af_session, af_session_factory.

Each test runs pytest on a small suite with ``pytester``, in pytest-asyncio's auto
and strict modes.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _plugin_args() -> list[str]:
    # Installed (pip install -e ., as CI does): pytest loads the plugin through its
    # entry point.  Run from a checkout whose install is elsewhere: load it by name.
    if entry_points(group="pytest11", name="asyncflow"):
        return ["-p", "no:cacheprovider"]
    return ["-p", "asyncflow.pytest_plugin", "-p", "no:cacheprovider"]


@pytest.fixture
def suite(request: pytest.FixtureRequest, pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(f"""
        [pytest]
        asyncio_mode = {request.param}
        asyncio_default_fixture_loop_scope = function
        filterwarnings = error
    """)
    return pytester


def _run(suite: pytest.Pytester, code: str, mode: str) -> pytest.RunResult:
    marker = "" if mode == "auto" else "@pytest.mark.asyncio\n"
    suite.makepyfile(test_user=code.replace("@ASYNC\n", marker))
    return suite.runpytest(*_plugin_args(), "-q")


def test_entry_point_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"asyncflow": "asyncflow.pytest_plugin"}


USER_SUITE = """
import asyncio
import numpy as np
import pytest
import asyncflow as af

@ASYNC
async def test_async(af_graph, af_session):
    assert af.get_default_graph() is af_graph
    x = af.placeholder(af.float32, shape=(2,), name="x")
    y = af.reduce_sum(x * 2.0)
    assert y.graph is af_graph
    assert await af_session.run(y, {x: np.ones(2)}) == 4.0

def test_sync(af_graph, af_session):
    y = af.constant(3) + 4
    assert af_session.run_sync(y) == 7

@ASYNC
async def test_factory(af_graph, af_session_factory):
    y = af.constant(1.0) + 1.0
    sess = af_session_factory(config=af.SessionConfig(device_count={"CPU": 2}))
    other = af.Graph()
    with other.as_default():
        z = af.constant(5)
    sess2 = af_session_factory(graph=other)
    assert sess is not sess2
    assert (await sess.run(y), await sess2.run(z)) == (2.0, 5)

@ASYNC
async def test_graph_is_fresh_each_test(af_graph):
    assert af_graph.get_operations() == []
    af.constant(1, name="c")
    assert af_graph.get_operations()[0].name == "c"

SESSIONS = []

@ASYNC
async def test_session_closed_after(af_session):
    SESSIONS.append(af_session)

def test_previous_session_was_closed():
    (sess,) = SESSIONS
    with pytest.raises(RuntimeError, match="closed"):
        sess.run_sync(af.constant(1))
"""


@pytest.mark.parametrize("suite", ["auto", "strict"], indirect=True)
def test_fixtures_work(suite: pytest.Pytester, request: pytest.FixtureRequest) -> None:
    mode = request.node.callspec.params["suite"]
    result = _run(suite, USER_SUITE, mode)
    result.assert_outcomes(passed=6)


LEAKY_SUITE = """
import asyncio
import threading
import pytest
import asyncflow as af

STOP = []

@ASYNC
async def test_leaks_a_task(af_session):
    async def forever():
        await asyncio.Event().wait()
    asyncio.get_running_loop().create_task(forever(), name="forgotten")

@ASYNC
async def test_leaks_a_worker_thread(af_session):
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="asyncflow-fake-worker", daemon=True)
    t.start()
    STOP.append(stop)

def test_clean(af_session):
    STOP.pop().set()
    assert af_session.run_sync(af.constant(2)) == 2
"""


WIDER_SCOPE_SUITE = """
import asyncio
import pytest
import pytest_asyncio
import asyncflow as af

@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server():
    task = asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="server")
    yield task
    task.cancel()

@pytest.mark.asyncio(loop_scope="module")
async def test_one(server, af_session):
    assert await af_session.run(af.constant(1) + 1) == 2

@pytest.mark.asyncio(loop_scope="module")
async def test_two(server, af_session):
    assert not server.done()
"""


@pytest.mark.parametrize("mode", ["auto", "strict"])
def test_tasks_of_wider_fixtures_are_not_leaks(pytester: pytest.Pytester, mode: str) -> None:
    # All fixtures on the module's loop: af_session sees the server task, which it
    # did not start and must not call a leak.
    pytester.makeini(f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = module
        asyncio_default_test_loop_scope = module
        filterwarnings = error
    """)
    pytester.makepyfile(test_user=WIDER_SCOPE_SUITE)
    result = pytester.runpytest(*_plugin_args(), "-q")
    result.assert_outcomes(passed=2)


BOOSTING_SUITE = """
import pytest
import asyncflow as af
from asyncflow.runtime.devices import blas_governor

@pytest.fixture(scope="module")
def outer():
    with af.Session(graph=af.Graph()) as sess:  # a device open around the test
        yield sess

def _boosted(x):
    with blas_governor().boost() as ready:  # as a large convolution's GEMM
        ready()
        return x

def test_boosts(outer, af_graph, af_session):
    y = af.py_func(_boosted, [af.constant(1.0)], af.float32, expensive=True)
    assert af_session.run_sync(y) == 1.0
"""


@pytest.mark.parametrize("suite", ["strict"], indirect=True)
def test_the_blas_sizing_thread_is_not_a_leak(suite: pytest.Pytester) -> None:
    # The governor's sizing thread is the process's (like BLAS's own threads): it lives
    # while any device is open (here the module's session) or a boost came in the last
    # second, not with the test's session.
    _run(suite, BOOSTING_SUITE, "strict").assert_outcomes(passed=1)


@pytest.mark.parametrize("suite", ["auto", "strict"], indirect=True)
def test_leaks_fail_the_test(suite: pytest.Pytester, request: pytest.FixtureRequest) -> None:
    mode = request.node.callspec.params["suite"]
    result = _run(suite, LEAKY_SUITE, mode)
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_task*",
            "1 task(s) still pending after the test: 'forgotten' (await or cancel every task*",
            "*ERROR at teardown of test_leaks_a_worker_thread*",
            "asyncflow worker thread(s) still running after the sessions closed: "
            "asyncflow-fake-worker",
        ]
    )
