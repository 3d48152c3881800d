"""The frame propagator's loop fast path against its general form.

Every graph here runs twice, on fresh sessions: with the fast path
(``ExecutorOptions.straight_line``, the default) and with the general propagator (PropagatorState)
only; results, errors (type, node, message) and fetched dead tensors must agree.
Each test also checks which path ran, so a fast path that silently stopped
applying cannot pass as agreement.
"""

from __future__ import annotations

import asyncio
import pickle
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.runtime import loop_fastpath
from tests.ordering import check_long_step_yields

Build = Callable[[], tuple[Any, dict[Any, Any]]]


@pytest.fixture
def fast_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per frame instance that started on the fast path."""
    runs: list[int] = []
    begin = loop_fastpath.LoopRun.begin

    def counted(self: loop_fastpath.LoopRun) -> bool:
        started = begin(self)
        if started:
            runs.append(1)
        return started

    monkeypatch.setattr(loop_fastpath.LoopRun, "begin", counted)
    return runs


def straight(enabled: bool) -> af.SessionConfig:
    """A session whose loops run on the fast path (the default) or in general form."""
    return af.SessionConfig(executor_options=af.ExecutorOptions(straight_line=enabled))


def run_both(
    build: Build,
    monkeypatch: pytest.MonkeyPatch,
    fast_runs: list[int],
    *,
    fast: bool = True,
    options: af.RunOptions | None = None,
) -> tuple[Any, Any]:
    """(fast-path outcome, general outcome): a value, or ``('error', type, node, message)``.
    ``fast``: whether the fast path must have run for this graph."""

    def once(enabled: bool) -> Any:
        graph = af.Graph()
        with graph.as_default():
            fetches, feeds = build()
        with af.Session(graph=graph, config=straight(enabled)) as sess:
            try:
                return sess.run_sync(fetches, feed_dict=feeds, options=options)
            except af.errors.OpError as exc:
                return ("error", type(exc), exc.node_name, exc.message)

    fast_runs.clear()
    with_fast = once(True)
    assert bool(fast_runs) == fast, fast_runs
    fast_runs.clear()
    general = once(False)
    assert not fast_runs
    return with_fast, general


def same(a: Any, b: Any) -> None:
    """Equal results, element by element, dtypes included."""
    if isinstance(a, tuple) and a and a[0] == "error":
        assert a == b
        return
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
        return
    assert type(a) is type(b), (a, b)
    np.testing.assert_array_equal(a, b)
    assert np.asarray(a).dtype == np.asarray(b).dtype


def counter_loop(n: Any, body: Callable[..., Any], init: Any) -> Any:
    return af.while_loop(lambda i, *v: i < n, body, (af.constant(0), *init))


# -- results ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_plain_loop(n: int, monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        out = counter_loop(
            af.constant(n), lambda i, s: (i + 1, s + 1.0), [af.constant(np.float32(0.0))]
        )
        return out, {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast == (n, float(n))


def test_single_loop_variable(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        return af.while_loop(lambda x: x < 1000, lambda x: x * 3, [af.constant(1)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast == [2187]


@pytest.mark.parametrize("n", [0, 5, 64])
def test_exit_fetched_with_and_without_feeds(
    n: int, monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def fed() -> tuple[Any, dict[Any, Any]]:
        limit = af.placeholder(af.int32, shape=(), name="limit")
        x = af.placeholder(af.float32, shape=(3,), name="x")
        i, s = counter_loop(limit, lambda i, s: (i + 1, s * 1.5 + x), [x])
        return {"i": i, "s": s}, {limit: n, x: np.arange(3, dtype=np.float32)}

    def unfed() -> tuple[Any, dict[Any, Any]]:
        i, s = counter_loop(
            af.constant(n), lambda i, s: (i + 1, s * 1.5), [af.constant(np.ones(3, np.float32))]
        )
        return [s, i, s], {}

    for build in (fed, unfed):
        fast, general = run_both(build, monkeypatch, fast_runs)
        same(
            list(fast.values()) if isinstance(fast, dict) else fast,
            list(general.values()) if isinstance(general, dict) else general,
        )


def test_cond_in_body(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            even = af.equal(i % 2, 0)
            return i + 1, af.cond(even, lambda: s + 1.0, lambda: s - 3.0)

        return counter_loop(af.constant(41), body, [af.constant(np.float32(0.5))]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast[1] == np.float32(0.5 + 21 - 3 * 20)


def test_nested_cond_and_constant_branches(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any, t: Any) -> Any:
            def outer_true() -> Any:
                return af.cond(af.equal(i % 3, 0), lambda: s * 2.0, lambda: s + 1.0)

            picked = af.cond(i < 10, outer_true, lambda: s - 1.0)
            # branches that are constants only: their deadness comes from control edges
            step = af.cond(af.equal(i % 2, 0), lambda: af.constant(2), lambda: af.constant(-1))
            return i + 1, picked, t + step

        return counter_loop(
            af.constant(25), body, [af.constant(np.float32(1.0)), af.constant(0)]
        ), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)


def test_many_loop_variables_swap_and_constants(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        scale = af.constant(np.float64(0.5), name="scale")  # entered as a loop constant
        offset = af.placeholder(af.float64, shape=(), name="offset")

        def body(i: Any, a: Any, b: Any, c: Any, d: Any) -> Any:
            # a, b swap through each other (the carries are read before any is written)
            return i + 1, b, a + b, c * scale + offset, d

        init = [
            af.constant(np.float64(0.0)),
            af.constant(np.float64(1.0)),
            af.constant(np.float64(8.0)),
            af.constant(np.int64(7)),
        ]
        return counter_loop(af.constant(30), body, init), {offset: 1.0}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast[1] == 832040.0  # fib(30)
    assert fast[4] == 7


def test_kernels_of_other_shapes_in_body(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    # three inputs (where), several outputs (unstack), an output nobody reads (split)
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, v: Any) -> Any:
            a, b = af.unstack(v)
            af.split(v, 2)
            picked = af.where(a > b, v * 2.0, v + 1.0)
            return i + 1, picked

        return counter_loop(
            af.constant(9), body, [af.constant(np.array([3.0, 1.0], np.float32))]
        ), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)


def test_maximum_iterations_and_dict_loop_vars(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        out = af.while_loop(
            lambda v: v["x"] < 1000.0,
            lambda v: {"x": v["x"] * 3.0},
            {"x": af.constant(np.float32(1.0))},
            maximum_iterations=4,
        )
        return out["x"], {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast == np.float32(81.0)


def test_nested_loops(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    # The inner frame runs on the fast path once per outer iteration; the outer one
    # holds a nested frame and keeps the general form.
    def build() -> tuple[Any, dict[Any, Any]]:
        def outer(i: Any, s: Any) -> Any:
            _, inner = counter_loop(i, lambda j, t: (j + 1, t + 2), [s])
            return i + 1, inner

        return counter_loop(af.constant(12), outer, [af.constant(0)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast[1] == sum(2 * k for k in range(12))
    graph = af.Graph()
    with graph.as_default():
        fetch = build()[0]
    with af.Session(graph=graph) as sess:
        fast_runs.clear()
        sess.run_sync(fetch)
    assert len(fast_runs) == 12  # one inner loop per outer iteration


def test_loop_in_untaken_branch_and_dead_exit(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    # The loop's Enters receive dead values: the general form runs that frame.
    def build(fetch_exit: bool) -> Build:
        def b() -> tuple[Any, dict[Any, Any]]:
            p = af.placeholder(af.bool, shape=(), name="p")
            x = af.constant(np.float32(2.0))
            taken_x, untaken_x = af.raw_ops.switch(x, p)[1], af.raw_ops.switch(x, p)[0]
            _, loop_out = counter_loop(af.constant(5), lambda i, s: (i + 1, s * s), [untaken_x])
            merged = af.raw_ops.merge([loop_out, taken_x])[0]
            return (loop_out if fetch_exit else merged), {p: True}

        return b

    fast, general = run_both(build(False), monkeypatch, fast_runs, fast=False)
    same(fast, general)
    assert fast == np.float32(2.0)
    fast, general = run_both(build(True), monkeypatch, fast_runs, fast=False)
    assert fast[0] == "error"
    assert fast[1] is af.errors.InvalidArgumentError
    same(fast, general)


@pytest.mark.parametrize("fetch", ["i", "s"])
def test_dead_next_iteration_hands_back_to_the_general_form(
    fetch: str, monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    # From iteration 3 on, s's NextIteration is dead while i's is live: the general form
    # goes on with the loop Merges that got a value (s's never fires again).
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            return i + 1, af.raw_ops.switch(s + 1.0, i < 3)[1]

        i, s = counter_loop(af.constant(8), body, [af.constant(np.float32(0))])
        return {"i": i, "s": s}[fetch], {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    if fetch == "i":
        assert fast == 8
    else:
        assert fast[0] == "error"
        assert fast[1] is af.errors.InvalidArgumentError


def test_body_with_an_async_kernel_keeps_the_general_path(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        async def later(s: np.ndarray) -> np.float32:
            await asyncio.sleep(0)
            return np.float32(s + 1.0)

        def body(i: Any, s: Any) -> Any:
            t = af.py_func(later, [s], af.float32)
            t.set_shape(())
            return i + 1, t

        return counter_loop(af.constant(5), body, [af.constant(np.float32(0))]), {}

    fast, general = run_both(build, monkeypatch, fast_runs, fast=False)
    same(fast, general)
    assert fast == (5, 5.0)


def test_stateful_body(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        seen: list[int] = []

        def record(i: np.ndarray) -> np.int32:
            seen.append(int(i))
            return np.int32(len(seen))

        def body(i: Any, c: Any) -> Any:
            count = af.py_func(record, [i], af.int32, stateful=True)
            count.set_shape(())
            return i + 1, count

        return counter_loop(af.constant(20), body, [af.constant(0)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast == (20, 20)


def test_variable_updated_in_body(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    results = []
    for enabled in (True, False):
        fast_runs.clear()
        graph = af.Graph()
        with graph.as_default():
            v = af.Variable(np.float32(1.0), name="v")

            def body(i: Any, s: Any, v: af.Variable = v) -> Any:
                with af.control_dependencies([v.assign_add(s)]):
                    return i + 1, s * 2.0

            out = counter_loop(af.constant(6), body, [af.constant(np.float32(1.0))])
        with af.Session(graph=graph, config=straight(enabled)) as sess:
            sess.run_sync(v.initializer)
            results.append((sess.run_sync(out), sess.run_sync(v)))
        assert bool(fast_runs) == enabled
    same(results[0], results[1])
    assert results[0][1] == np.float32(64.0)  # 1 + (1 + 2 + ... + 32)


# -- errors, deadlines, memory, tracing ---------------------------------------------------


def test_error_in_body_names_the_node(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def check(i: np.ndarray) -> np.int32:
            if i == 17:
                raise ValueError(f"no iteration {int(i)}")
            return np.int32(i)

        def body(i: Any, s: Any) -> Any:
            v = af.py_func(check, [i], af.int32, name="checker")
            v.set_shape(())
            return i + 1, s + v

        return counter_loop(af.constant(100), body, [af.constant(0)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    _, error_type, node, message = fast
    assert error_type is af.errors.InvalidArgumentError  # a ValueError's code
    assert node == "while/checker"
    assert "no iteration 17" in message
    assert "[[node while/checker" in message
    assert "defined at" in message


def test_error_in_the_predicate_names_the_node(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def below(i: np.ndarray) -> np.bool_:
            if i == 3:
                raise OverflowError("three")
            return np.bool_(i < 10)

        def cond(i: Any) -> Any:
            p = af.py_func(below, [i], af.bool, name="below")
            p.set_shape(())
            return p

        return af.while_loop(cond, lambda i: i + 1, [af.constant(0)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast[0] == "error"
    assert fast[2] == "while/below"


def test_error_inside_cond_in_body(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            bad = af.cond(
                i < 9,
                lambda: s + 1,
                lambda: af.gather(af.constant([1, 2]), af.constant(5), name="oob"),
            )
            return i + 1, bad

        return counter_loop(af.constant(20), body, [af.constant(0)]), {}

    fast, general = run_both(build, monkeypatch, fast_runs)
    same(fast, general)
    assert fast[0] == "error"
    assert fast[2].endswith("oob")


@pytest.mark.parametrize("enabled", [True, False])
async def test_deadline_and_cancellation_mid_loop(enabled: bool) -> None:
    graph = af.Graph()
    with graph.as_default():
        n = af.placeholder(af.int32, shape=(), name="n")
        out = counter_loop(n, lambda i, s: (i + 1, s + 1.0), [af.constant(np.float32(0))])
    async with af.Session(graph=graph, config=straight(enabled)) as sess:
        await check_long_step_yields(sess, out, {n: 10**9})  # a billion iterations
        assert await sess.run(out, {n: 3}) == (3, 3.0)  # still usable


def test_memory_of_a_long_loop_stays_flat(fast_runs: list[int]) -> None:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float64, shape=(131072,), name="x")  # 1 MiB
        out = counter_loop(af.constant(200), lambda i, v: (i + 1, (v + 1.0) * 0.5), [x])
    with af.Session(graph=graph) as sess:
        data = np.zeros(131072)
        sess.run_sync(out, {x: data})  # compile outside the measurement
        tracemalloc.start()
        try:
            sess.run_sync(out, {x: data})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert fast_runs
    assert peak < 8 * 2**20, peak  # a few live arrays, not one per iteration


def test_full_trace_records_every_node(fast_runs: list[int]) -> None:
    graph = af.Graph()
    with graph.as_default():
        out = counter_loop(af.constant(4), lambda i, s: (i + 1, s * 2), [af.constant(1)])
    with af.Session(graph=graph) as sess:
        meta = af.RunMetadata()
        fast_runs.clear()
        result = sess.run_sync(
            out, options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE), run_metadata=meta
        )
        assert fast_runs  # traced: the same path as untraced
        assert sess.run_sync(out) == result == (4, 16)
    stats = [n for d in meta.step_stats.dev_stats for n in d.node_stats]
    adds = [n for n in stats if n.node_name == "while/mul"]
    assert sorted(n.iter_id for n in adds) == [0, 1, 2, 3]


# -- the compile pass ---------------------------------------------------------------------


def _plan(graph: af.Graph, fetches: list[af.Tensor]) -> Any:
    from asyncflow.compiler.ir import graph_ir, ref_of
    from asyncflow.compiler.pipeline import compile_signature

    compiled = compile_signature(
        graph_ir(graph),
        feeds=[],
        fetches=[ref_of(t) for t in fetches],
        targets=[],
        devices=["/job:localhost/replica:0/task:0/device:CPU:0"],
        incarnation=1,
    )
    (plan,) = compiled.plans
    return plan


def test_schedule_of_a_plain_loop_is_its_kernels_only() -> None:
    from asyncflow.compiler.loop_schedule import I_KERNEL

    graph = af.Graph()
    with graph.as_default():
        out = counter_loop(
            af.constant(5), lambda i, s: (i + 1, s + 1.0), [af.constant(np.float32(0.0))]
        )
    plan = _plan(graph, list(out))
    root, schedule = plan.loop_schedules
    assert root is None
    names = {
        p: [plan.nodes[x.node].op for x in getattr(schedule, p)] for p in ("head", "true", "final")
    }
    # Identity / LoopCond are aliases, the pivot-gated Const is preloaded, the loop
    # Switches pass through: an iteration that goes on runs the three kernels only.
    assert names == {
        "head": ["Less"],
        "true": ["Add", "Add"],
        "final": ["Switch", "Switch", "Exit", "Exit"],
    }
    assert all(x.kind == I_KERNEL and not x.checks for x in (*schedule.head, *schedule.true))
    assert len(schedule.carries) == 2
    assert pickle.loads(pickle.dumps(plan)).loop_schedules == plan.loop_schedules


def test_a_frame_with_a_nested_loop_gets_no_schedule() -> None:
    graph = af.Graph()
    with graph.as_default():
        out = counter_loop(
            af.constant(3),
            lambda i, s: (i + 1, counter_loop(i, lambda j, t: (j + 1, t + 1), [s])[1]),
            [af.constant(0)],
        )
    plan = _plan(graph, list(out))
    schedules = plan.loop_schedules
    assert len(schedules) == 3
    assert schedules[0] is None  # the root
    assert sum(s is None for s in schedules[1:]) == 1  # the outer frame: general form
    inner = next(s for s in schedules[1:] if s is not None)
    assert [plan.nodes[x.node].op for x in inner.true] == ["Add", "Add"]


# -- random loop bodies -------------------------------------------------------------------

_STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(-3, 3)),
    st.tuples(st.just("scale"), st.sampled_from([0.5, 2.0, -1.0])),
    st.tuples(st.just("cond"), st.integers(2, 4), st.integers(-2, 2)),
    st.tuples(st.just("nested"), st.integers(2, 3), st.integers(2, 3)),
    st.tuples(st.just("const"), st.integers(2, 3)),
    st.tuples(st.just("swap"), st.just(0)),
)


def _apply(step: tuple[Any, ...], i: Any, s: Any, t: Any, m: Any) -> tuple[Any, Any]:
    """One step of a random body on (s, t), written once for the graph (``m``: af) and
    for the Python reference (``m``: None)."""
    kind = step[0]
    if kind == "add":
        return s + float(step[1]), t
    if kind == "scale":
        return s * step[1], t
    if kind == "swap":
        return t, s
    if m is None:
        even = i % step[1] == 0
        if kind == "cond":
            return (s + step[2], t) if even else (s - 1.0, t)
        if kind == "nested":
            return ((s * 2.0 if i % step[2] == 0 else s + 1.0) if even else s, t)
        return s + (2.0 if even else -1.0), t
    even = m.equal(i % step[1], 0)
    if kind == "cond":
        return m.cond(even, lambda: s + float(step[2]), lambda: s - 1.0), t
    if kind == "nested":
        inner = m.equal(i % step[2], 0)
        return m.cond(
            even, lambda: m.cond(inner, lambda: s * 2.0, lambda: s + 1.0), lambda: m.identity(s)
        ), t
    return s + m.cond(
        even, lambda: m.constant(2.0, dtype=m.float64), lambda: m.constant(-1.0, dtype=m.float64)
    ), t


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=5), n=st.integers(0, 12))
def test_random_bodies_agree_on_both_paths(steps: list[tuple[Any, ...]], n: int) -> None:
    def body(i: Any, s: Any, t: Any) -> Any:
        for step in steps:
            s, t = _apply(step, i, s, t, af)
        return i + 1, s, t

    s, t = 1.0, 3.0
    for i in range(n):
        for step in steps:
            s, t = _apply(step, i, s, t, None)
    results = []
    begin = loop_fastpath.LoopRun.begin
    for enabled in (True, False):
        started: list[bool] = []

        def counted(run: loop_fastpath.LoopRun, started: list[bool] = started) -> bool:
            started.append(begin(run))
            return started[-1]

        loop_fastpath.LoopRun.begin = counted  # type: ignore[method-assign,assignment]
        try:
            graph = af.Graph()
            with graph.as_default():
                out = counter_loop(
                    af.constant(n),
                    body,
                    [af.constant(np.float64(1.0)), af.constant(np.float64(3.0))],
                )
            with af.Session(graph=graph, config=straight(enabled)) as sess:
                results.append(sess.run_sync(out))
        finally:
            loop_fastpath.LoopRun.begin = begin  # type: ignore[method-assign]
        assert started == ([True] if enabled else [])
    same(results[0], results[1])
    assert results[0] == (n, s, t)


# -- kernel shapes the straight-line programs must run (never crash) ---------------------

StatefulBuild = Callable[[], tuple[Any, list[Any]]]


def run_stateful(
    build: StatefulBuild, monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> tuple[Any, Any]:
    """Per way of running (fast path, general path, FULL_TRACE): the fetched values and
    then the variables' values, on a fresh session with the variables initialized."""
    outcomes: list[tuple[Any, Any]] = []
    trace = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    for enabled, options in ((True, None), (False, None), (True, trace), (False, trace)):
        fast_runs.clear()
        graph = af.Graph()
        with graph.as_default():
            fetches, variables = build()
            init = af.global_variables_initializer()
        with af.Session(graph=graph, config=straight(enabled)) as sess:
            sess.run_sync(init)
            outcomes.append(
                (
                    sess.run_sync(fetches, options=options, run_metadata=af.RunMetadata()),
                    sess.run_sync(variables),
                )
            )
        assert bool(fast_runs) == enabled, (enabled, options)  # traced: the same path
    for other in outcomes[1:]:
        same(outcomes[0], other)
    return outcomes[0]


def test_variable_read_in_body(monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]) -> None:
    # ``v.read_value()`` is a kernel with no input (a control edge from the frame only)
    def build() -> tuple[Any, list[Any]]:
        v = af.Variable(np.float64(1.5), name="v")
        out = counter_loop(
            af.constant(5),
            lambda i, acc: (i + 1, acc + v.read_value()),
            [af.constant(np.float64(0.0))],
        )
        return out, [v]

    assert run_stateful(build, monkeypatch, fast_runs) == ((5, 7.5), [1.5])


def test_ordered_assigns_under_control_dependencies(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, list[Any]]:
        v = af.Variable(np.float64(0.0), name="v")
        w = af.Variable(np.float64(0.0), name="w")

        def body(i: Any) -> Any:
            first = v.assign_add(np.float64(1.0))
            with af.control_dependencies([first]):
                second = v.assign(v.read_value() * 2.0)
            with af.control_dependencies([second]):
                third = w.assign(v.read_value())
            with af.control_dependencies([third]):
                return i + 1

        return counter_loop(af.constant(3), lambda i: body(i), []), [v, w]

    # v: 0 -> 1 -> 2 -> 3 -> 6 -> 7 -> 14; w follows v after each iteration
    assert run_stateful(build, monkeypatch, fast_runs) == ((3,), [14.0, 14.0])


def test_multi_output_and_zero_input_kernels_in_cond_in_body(
    monkeypatch: pytest.MonkeyPatch, fast_runs: list[int]
) -> None:
    def build() -> tuple[Any, list[Any]]:
        v = af.Variable(np.array([2.0, 5.0]), name="v")

        def body(i: Any, acc: Any) -> Any:
            def taken() -> Any:
                a, b = af.unstack(v.read_value())  # no input, then two outputs
                with af.control_dependencies([v.assign_add(np.array([1.0, 1.0]))]):
                    return acc + a * b

            return i + 1, af.cond(af.equal(i % 2, 0), taken, lambda: acc - 1.0)

        return counter_loop(af.constant(4), body, [af.constant(np.float64(0.0))]), [v]

    # iterations 0, 2 take the branch: 2*5 = 10, then (3*6) = 18; 1 and 3 subtract 1
    (i, acc), (v,) = run_stateful(build, monkeypatch, fast_runs)
    assert (i, acc) == (4, 10.0 - 1.0 + 18.0 - 1.0)
    np.testing.assert_array_equal(v, [4.0, 7.0])
