"""A straight-line program starts its async calls and joins each before its first reader.

A frame-free partition whose async kernels (no ``nowait`` twin, at least one output: a
database or HTTP call, an async ``py_func``) a fixed order can start as early as the
general engine would runs as one straight-line program: one level of calls (the
common step of a service: a few inline ops around a call or two), or stages of them
where each call still to start needs every call in flight (a chain; layers that each
read the whole layer before).  The program starts every call as soon as its inputs
are there (the step's dispatch: the first is awaited in the caller's frame, the
others run as tasks), runs what needs none of their values while they are in
flight, and joins each call right before the first node that reads it (a data or a
control edge).  A call that needs only some of the calls in flight keeps the general
engine, which starts it when its own inputs arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compiler.loop_schedule import MAX_STARTS, reachable, start_schedule
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.interpreter import ProgramPropagator
from asyncflow.runtime.propagators import PropagatorState
from asyncflow.runtime.step import Step
from tests.closing import assert_closed, closed_run

FROM_FIRST_RUN = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=0))
GENERAL = af.SessionConfig(executor_options=af.ExecutorOptions(straight_line=False))
BOUNDED = af.RunOptions(timeout_in_ms=5_000)  # a program that waited wrongly would hang


def engine_of(sess: af.Session, fetches: Any, feeds: Any) -> type:
    """The engine class a step of this call runs on."""
    bound = sess._prepare(fetches, feeds).bound[0]
    step = Step(bound, CallFrame(list(feeds.values())))
    try:
        return ProgramPropagator if isinstance(step, ProgramPropagator) else PropagatorState
    finally:
        step.release()


def handshake() -> tuple[Any, Any]:
    """Two async kernels that finish only when both have started: they never finish
    when run one after the other."""
    a_in, b_in = asyncio.Event(), asyncio.Event()

    async def a(v: Any) -> Any:
        a_in.set()
        await b_in.wait()
        return v + np.float32(1)

    async def b(v: Any) -> Any:
        b_in.set()
        await a_in.wait()
        return v * np.float32(10)

    return a, b


#: A program's steps with asyncio's own TaskGroup for their tasks, and with each
#: py_func's coroutine run as one (no kernel parts): the step's other ways to run them.
ASYNCIO_GROUP = af.SessionConfig(
    executor_options=af.ExecutorOptions(schedule_after=0, own_task_group=False, kernel_parts=False)
)


@pytest.mark.parametrize(
    "config",
    [FROM_FIRST_RUN, ASYNCIO_GROUP, GENERAL],
    ids=["program", "program-asyncio-group", "general"],
)
def test_two_calls_run_side_by_side(config: af.SessionConfig) -> None:
    async def main() -> list[float]:
        a_fn, b_fn = handshake()
        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            a = af.py_func(a_fn, [x], af.float32, name="a")
            b = af.py_func(b_fn, [x + 1.0], af.float32, name="b")
            y = af.multiply(a + b, 2.0, name="y")
        async with af.Session(graph=g, config=config) as sess:
            got = [float(await sess.run(y, {x: float(v)}, options=BOUNDED)) for v in range(3)]
            engine = engine_of(sess, y, {x: 0.0})
        assert engine is (PropagatorState if config is GENERAL else ProgramPropagator)
        return got

    assert asyncio.run(main()) == [(v + 1 + (v + 1) * 10) * 2 for v in range(3)]


def test_stages_of_calls_run_as_a_program() -> None:
    # A call, then two calls side by side that read it, then one that reads both: each
    # call still to start needs every call in flight, so a fixed order starts each as
    # early as the general engine would.  The middle two wait for each other.
    async def main() -> list[float]:
        a_fn, b_fn = handshake()

        async def first(v: Any) -> Any:
            await asyncio.sleep(0)
            return v + np.float32(1)

        async def last(v: Any) -> Any:
            await asyncio.sleep(0)
            return v * np.float32(2)

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            f = af.py_func(first, [x], af.float32, name="first")
            a = af.py_func(a_fn, [f], af.float32, name="a")
            b = af.py_func(b_fn, [f * 3.0], af.float32, name="b")
            y = af.py_func(last, [a - b], af.float32, name="last")
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            got = [float(await sess.run(y, {x: float(v)}, options=BOUNDED)) for v in range(3)]
            assert engine_of(sess, y, {x: 0.0}) is ProgramPropagator
        return got

    def expected(v: float) -> float:
        f = v + 1
        return ((f + 1) - (f * 3) * 10) * 2

    assert asyncio.run(main()) == [expected(v) for v in range(3)]


def test_a_call_that_needs_only_some_calls_in_flight_keeps_the_general_engine() -> None:
    # ``then`` reads ``quick`` only: the general engine starts it when ``quick`` ends,
    # while ``slow`` still runs; a fixed order that waited for both first would start
    # it late.  ``slow`` ends only once ``then`` started.
    async def main() -> float:
        then_started = asyncio.Event()

        async def quick(v: Any) -> Any:
            return v + np.float32(1)

        async def slow(v: Any) -> Any:
            await then_started.wait()
            return v

        async def then(v: Any) -> Any:
            then_started.set()
            return v * np.float32(2)

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            q = af.py_func(quick, [x], af.float32, name="quick")
            s = af.py_func(slow, [x], af.float32, name="slow")
            y = af.py_func(then, [q], af.float32, name="then") + s
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            got = float(await sess.run(y, {x: 3.0}, options=BOUNDED))
            assert not sess._prepare(y, {x: 3.0}).bound[0].schedulable
            assert engine_of(sess, y, {x: 3.0}) is PropagatorState
        return got

    assert asyncio.run(main()) == 11.0


def test_inline_work_that_reads_no_call_runs_while_the_calls_are_in_flight() -> None:
    # The call waits for an event only an inline node beside it sets: a program that
    # joined the call before running that node would wait until the deadline.
    async def main() -> tuple[float, float]:
        ready = asyncio.Event()

        async def call(v: Any) -> Any:
            await ready.wait()
            return v + np.float32(1)

        def beside(v: Any) -> Any:
            ready.set()
            return v * np.float32(3)

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            c = af.py_func(call, [x], af.float32, name="call")
            s = af.py_func(beside, [x], af.float32, name="beside")
            y = c + 1.0
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            got = await sess.run([y, s], {x: 2.0}, options=BOUNDED)
            assert engine_of(sess, [y, s], {x: 2.0}) is ProgramPropagator
        return float(got[0]), float(got[1])

    assert asyncio.run(main()) == (4.0, 6.0)


def test_a_control_edge_joins_the_call_before_its_reader() -> None:
    async def main() -> list[str]:
        events: list[str] = []

        async def write(v: Any) -> Any:
            await asyncio.sleep(0.01)
            events.append("written")
            return v

        def read(v: Any) -> Any:
            events.append("read")
            return v

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            w = af.py_func(write, [x], af.float32, name="write")
            with g.control_dependencies([w]):
                r = af.py_func(read, [x], af.float32, name="read")
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            assert float(await sess.run(r, {x: 1.0})) == 1.0
            assert engine_of(sess, r, {x: 1.0}) is ProgramPropagator
        return events

    assert asyncio.run(main()) == ["written", "read"]


def test_a_fetched_call_with_no_reader_and_several_outputs() -> None:
    async def pair(v: Any) -> Any:
        await asyncio.sleep(0)
        return v + np.float32(1), v - np.float32(1)

    async def one(v: Any) -> Any:
        await asyncio.sleep(0)
        return v * np.float32(2)

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (), name="x")
        hi, lo = af.py_func(pair, [x], [af.float32, af.float32], name="pair")
        unread, _ = af.py_func(pair, [x * 2.0], [af.float32, af.float32], name="half_read")
        alone = af.py_func(one, [x], af.float32, name="alone")  # fetched, read by nobody
        total = hi * lo + unread
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        for v in (1.0, 2.0):
            got = sess.run_sync([total, alone, lo], {x: v})
            assert [float(t) for t in got] == [(v + 1) * (v - 1) + 2 * v + 1, 2 * v, v - 1]
        assert engine_of(sess, [total, alone, lo], {x: 1.0}) is ProgramPropagator


@pytest.mark.parametrize("config", [FROM_FIRST_RUN, ASYNCIO_GROUP], ids=["own", "asyncio"])
@pytest.mark.parametrize("failing", ["first", "second"])
def test_a_failing_call_fails_the_step_and_stops_the_other(
    failing: str, config: af.SessionConfig
) -> None:
    async def main() -> None:
        stopped = asyncio.Event()

        async def fails(v: Any) -> Any:
            await asyncio.sleep(0)
            raise ValueError("no such row")

        async def waits(v: Any) -> Any:
            try:
                await asyncio.Event().wait()
            finally:
                stopped.set()
            return v

        first, second = (fails, waits) if failing == "first" else (waits, fails)
        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            a = af.py_func(first, [x], af.float32, name="first")
            b = af.py_func(second, [x], af.float32, name="second")
            y = a + b
        async with af.Session(graph=g, config=config) as sess:
            for _ in range(2):
                stopped.clear()
                with pytest.raises(af.errors.InvalidArgumentError, match="no such row") as info:
                    await sess.run(y, {x: 1.0}, options=BOUNDED)
                assert info.value.node_name == failing
                assert stopped.is_set()
            assert engine_of(sess, y, {x: 1.0}) is ProgramPropagator

    asyncio.run(main())


def test_a_deadline_names_the_call_still_running() -> None:
    async def main() -> None:
        async def quick(v: Any) -> Any:
            return v

        async def slow(v: Any) -> Any:
            await asyncio.Event().wait()
            return v

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            y = af.py_func(quick, [x], af.float32, name="quick") + af.py_func(
                slow, [x], af.float32, name="slow"
            )
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            with pytest.raises(af.errors.DeadlineExceededError, match="'slow'") as info:
                await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=50))
            assert "quick" not in str(info.value)
            assert engine_of(sess, y, {x: 1.0}) is ProgramPropagator
            assert sess.statistics().in_flight == 0

    asyncio.run(main())


def test_a_cancelled_caller_stops_every_call() -> None:
    async def main() -> None:
        started: list[int] = []
        stopped: list[int] = []
        both = asyncio.Event()

        async def waits(v: Any) -> Any:
            started.append(1)
            if len(started) == 2:
                both.set()
            try:
                await asyncio.Event().wait()
            finally:
                stopped.append(1)
            return v

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            y = af.py_func(waits, [x], af.float32) * af.py_func(waits, [x], af.float32)
        async with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
            run = asyncio.ensure_future(sess.run(y, {x: 1.0}))
            await asyncio.wait_for(both.wait(), 5)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            assert stopped == [1, 1]
            assert sess.statistics().in_flight == 0
            assert engine_of(sess, y, {x: 1.0}) is ProgramPropagator

    asyncio.run(main())


def test_a_traced_program_records_its_calls() -> None:
    async def call(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (), name="x")
        y = af.py_func(call, [x], af.float32, name="c1") + af.py_func(
            call, [x], af.float32, name="c2"
        )
    options = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        meta = af.RunMetadata()
        assert sess.run_sync(y, {x: 2.0}, options=options, run_metadata=meta) == 4.0
        names = {n.node_name for d in meta.step_stats.dev_stats for n in d.node_stats}
        assert {"c1", "c2"} <= names
        assert engine_of(sess, y, {x: 2.0}) is ProgramPropagator


def test_closing_the_session_aborts_a_program_waiting_at_a_join() -> None:
    async def main() -> None:
        started: list[int] = []
        both = asyncio.Event()

        async def waits(v: Any) -> Any:
            started.append(1)
            if len(started) == 2:
                both.set()
            await asyncio.Event().wait()
            return v

        g = af.Graph()
        with g.as_default():
            x = af.placeholder(af.float32, (), name="x")
            y = af.py_func(waits, [x], af.float32) - af.py_func(waits, [x], af.float32)
        sess = af.Session(graph=g, config=FROM_FIRST_RUN)
        assert engine_of(sess, y, {x: 1.0}) is ProgramPropagator
        caller = asyncio.ensure_future(closed_run(sess, y, {x: 1.0}))
        await asyncio.wait_for(both.wait(), 5)
        await sess.close()
        assert_closed(await asyncio.wait_for(caller, 5))
        assert sess.statistics().in_flight == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    ("layers", "width", "engine"),
    [(6, 5, ProgramPropagator), (1, MAX_STARTS + 1, PropagatorState)],
    ids=["stages", "too-many-calls"],
)
def test_layers_of_calls_each_reading_the_whole_layer_before(
    layers: int, width: int, engine: type
) -> None:
    # Each layer's calls read the sum of the layer before (a barrier per layer): a
    # program, up to MAX_STARTS calls (the rule's check walks what each call leads to).
    async def inc(v: Any) -> Any:
        await asyncio.sleep(0)
        return v + np.float32(1)

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (), name="x")
        b = x
        for _ in range(layers):
            b = af.add_n([af.py_func(inc, [b], af.float32) for _ in range(width)])
    expected = 0.0
    for _ in range(layers):
        expected = width * (expected + 1)
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        assert sess.run_sync(b, {x: 0.0}) == expected
        assert engine_of(sess, b, {x: 0.0}) is engine


@dataclasses.dataclass
class _Graph:
    """A DAG as ``start_schedule`` reads a plan."""

    consumers: list[list[int]]
    initial_pending: list[int]
    initial_ready: list[int]


@st.composite
def _dags(draw: st.DrawFn) -> tuple[_Graph, frozenset[int]]:
    """A random DAG (edges go from lower to higher nodes) and a random set of calls."""
    n = draw(st.integers(1, 14))
    consumers: list[list[int]] = [[] for _ in range(n)]
    pending = [0] * n
    for c in range(1, n):
        for p in draw(st.sets(st.integers(0, c - 1), max_size=3)):
            consumers[p].append(c)
            pending[c] += 1
    starts = frozenset(draw(st.sets(st.integers(0, n - 1), max_size=n)))
    ready = [i for i in range(n) if not pending[i]]
    return _Graph(consumers, pending, ready), starts


@settings(max_examples=300, deadline=None)
@given(_dags())
def test_the_schedule_is_a_topological_order_that_joins_before_every_reader(
    case: tuple[_Graph, frozenset[int]],
) -> None:
    graph, starts = case
    scheduled = start_schedule(graph, starts)
    n = len(graph.consumers)
    if scheduled is None:
        # Refused only when a call reads some call but not another one that may be in
        # flight when it is due: calls f, g and r, r reached from g and not from f.
        reach = {c: reachable((c,), graph.consumers) for c in starts}
        assert any(
            r in reach[g] and r not in reach[f] and f not in reach[r]
            for f in starts
            for g in starts
            for r in starts
            if len({f, g, r}) == 3
        ), (graph, starts)
        return
    order, joins = scheduled
    assert sorted(order) == list(range(n))
    position = {i: k for k, i in enumerate(order)}
    for p, cs in enumerate(graph.consumers):
        for c in cs:
            assert position[p] < position[c]  # producers first
    for s in starts:
        readers = graph.consumers[s]
        assert (s in joins) == bool(readers)
        if readers:  # joined after its start, at its first reader
            assert position[s] < joins[s] == min(position[c] for c in readers)


def test_a_call_reading_one_of_two_calls_in_flight_is_refused_and_a_chain_is_not() -> None:
    # 0 and 1 are calls from the feed; 2 is a call that reads 0 only; 3 reads 1 and 2.
    side = _Graph([[2], [3], [3], []], [0, 0, 1, 2], [0, 1])
    assert start_schedule(side, frozenset({0, 1, 2})) is None
    assert start_schedule(side, frozenset({0, 1})) is not None  # 2 inline: no call waits
    chain = _Graph([[1], [2], []], [0, 1, 1], [0])
    assert start_schedule(chain, frozenset({0, 1, 2})) == ((0, 1, 2), {0: 1, 1: 2})
