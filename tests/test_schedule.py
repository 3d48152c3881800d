"""The static schedule (an all-inline plan without control flow replayed as a straight
line) against the general plain propagator on the same graphs.

Every test runs both paths: ``ExecutorOptions.schedule_after`` set to 0 (the schedule from the first
run) and to a huge number (never a schedule), and checks that results, errors,
deadlines, yielding and freeing of values agree.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import asyncflow as af
from tests.test_property import _assert_same, random_graphs

PATHS = ("schedule", "general")


def path(name: str) -> af.SessionConfig:
    """Force the schedule (built before the first run) or the general path."""
    return af.SessionConfig(
        executor_options=af.ExecutorOptions(schedule_after=0 if name == "schedule" else 10**9)
    )


def scheduled(sess: af.Session) -> list[bool]:
    """For each cached plan of ``sess``: whether its steps replay a static schedule."""
    out = []
    for call in sess._cache.values():
        for bound in call.bound:
            out.append(bound.derived.get("program") is not None)
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(random_graphs(inline_only=True))
def test_schedule_matches_general_path_and_reference(
    case: tuple[af.Graph, list[Any], dict[Any, Any]],
) -> None:
    graph, fetches, feeds = case
    expected = af.testing.reference_run(fetches, feeds, graph=graph)
    for name in PATHS:
        with af.Session(graph=graph, config=path(name)) as sess:
            _assert_same(sess.run_sync(fetches, feeds), expected)
            _assert_same(sess.run_sync(fetches, feeds), expected)
            assert all(scheduled(sess)) if name == "schedule" else not any(scheduled(sess))


def test_first_run_is_general_then_scheduled() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = (x + 1.0) * 2.0
    with af.Session(graph=g) as sess:
        assert sess.run_sync(y, {x: 1.0}) == 4.0
        assert scheduled(sess) == [False]  # the first run pays no scheduling
        assert sess.run_sync(y, {x: 2.0}) == 6.0
        assert scheduled(sess) == [True]
        assert sess.run_sync(y, {x: 3.0}) == 8.0


def test_not_scheduled_with_a_call_waiting_on_some_calls_or_control_flow() -> None:
    # (Calls a fixed order starts as early are scheduled: tests/test_program_starts.py;
    # not one that reads only one of two calls in flight.)
    async def slow(v: Any) -> Any:
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        first = af.py_func(slow, [x + 1.0], af.float32)
        a = af.py_func(slow, [first], af.float32) + af.py_func(slow, [x], af.float32)
        c = af.cond(x > 0.0, lambda: x * 2.0, lambda: x - 1.0)
    with af.Session(graph=g, config=path("schedule")) as sess:
        for fetch in (a, c):
            for _ in range(2):
                sess.run_sync(fetch, {x: 1.0})
        assert not any(scheduled(sess))


def test_traced_schedule_records_what_the_general_path_records() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = x
        for _ in range(20):
            y = y * 1.5 + 1.0
        z = af.add_n([y, x, y * 2.0])
    opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    seen = {}
    for name in PATHS:
        with af.Session(graph=g, config=path(name)) as sess:
            for _ in range(2):
                md = af.RunMetadata()
                value = sess.run_sync(z, {x: 2.0}, options=opts, run_metadata=md)
            assert scheduled(sess) == [name == "schedule"]
            stats = [s for d in md.step_stats.dev_stats for s in d.node_stats]
            seen[name] = (
                value,
                sorted((s.node_name, s.timeline_label) for s in stats),
                sorted(
                    s.node_name for s in stats if s.all_start_micros and s.all_end_rel_micros >= 0
                ),
            )
    assert seen["schedule"] == seen["general"]
    assert (
        len(seen["schedule"][1]) == 20 * 2 + 2
    )  # every node ran and was recorded (with AddN, y * 2)


@pytest.mark.parametrize("name", PATHS)
def test_failing_kernel_names_the_node_on_both_paths(name: str) -> None:
    def boom(v: Any) -> Any:
        if v > 5:
            raise ValueError("too big")
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = x
        for _ in range(10):
            y = y + 1.0
        bad = af.py_func(boom, [y], af.float32, name="checker")
        z = bad * 2.0
    with af.Session(graph=g, config=path(name)) as sess:
        assert sess.run_sync(z, {x: -10.0}) == 2 * 0.0
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            sess.run_sync(z, {x: 0.0})
        assert "checker" in str(info.value)
        assert "test_schedule.py" in str(info.value)  # the line that created it
        assert sess.run_sync(z, {x: -9.0}) == 2 * 1.0  # the session stays usable


@pytest.mark.parametrize("name", PATHS)
async def test_long_schedule_yields_and_meets_deadlines(name: str) -> None:
    def sleepy(v: Any) -> Any:
        time.sleep(0.0001)
        return v + np.float32(1)

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=())
        y = x
        for _ in range(2500):  # >= 250 ms of inline work in 10 blocks of 256 nodes
            y = af.py_func(sleepy, [y], af.float32)
    with af.Session(graph=g, config=path(name)) as sess:
        assert await sess.run(y, {x: 0.0}) == 2500.0
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        async with asyncio.TaskGroup() as tg:
            t = tg.create_task(ticker())
            assert await sess.run(y, {x: 1.0}) == 2501.0
            t.cancel()
        assert ticks >= 4  # the step yielded to the loop between blocks
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x: 0.0}, options=af.RunOptions(timeout_in_ms=50))
        assert await sess.run(x + 1.0, {x: 1.0}) == 2.0
        assert scheduled(sess)[0] is (name == "schedule")


@pytest.mark.parametrize("name", PATHS)
def test_values_are_freed_after_their_last_reader(name: str) -> None:
    alive: list[weakref.ref[Any]] = []
    most = [0]

    def grow(v: Any) -> Any:
        most[0] = max(most[0], sum(r() is not None for r in alive))
        out = v + 1.0
        alive.append(weakref.ref(out))
        return out

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(1000,))
        y = x
        for _ in range(50):
            y = af.py_func(grow, [y], af.float64)
        fanned = af.add_n([y, y * 2.0, y * 3.0])  # a slot with several readers
    with af.Session(graph=g, config=path(name)) as sess:
        for _ in range(2):
            alive.clear()
            most[0] = 0
            out = sess.run_sync(fanned, {x: np.zeros(1000)})
            np.testing.assert_array_equal(out, np.full(1000, 300.0))
            assert most[0] <= 2  # the chain holds one or two arrays, not fifty
        assert scheduled(sess) == [name == "schedule"]
