"""Control flow: cond / case / while_loop on Switch/Merge/Enter/Exit/NextIteration,
with TensorFlow's own test numbers."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from tests.ordering import wait_in_flight


def run(fetches: Any, feeds: Any = None, graph: af.Graph | None = None, **config: Any) -> Any:
    cfg = af.SessionConfig(**config) if config else None
    with af.Session(graph=graph or af.get_default_graph(), config=cfg) as sess:
        return sess.run_sync(fetches, feeds)


# -- while_loop ---------------------------------------------------------------------------


def test_while_counts_to_10000_with_parallel_iterations(graph: af.Graph) -> None:
    r = af.while_loop(
        lambda x: af.less(x, 10000),
        lambda x: af.add(x, 1),
        [af.constant(0)],
        parallel_iterations=20,
    )
    assert run(r) == 10000


def test_while_sum_of_i_below_10(graph: af.Graph) -> None:
    i, s = af.while_loop(
        lambda i, s: i < 10, lambda i, s: (i + 1, s + i), (af.constant(0), af.constant(0))
    )
    assert run([i, s]) == [10, 45]


def test_nested_while(graph: af.Graph) -> None:
    def inner(v: af.Tensor) -> af.Tensor:
        result: af.Tensor = af.while_loop(
            lambda s: s < 20.0, lambda s: s + s, v, parallel_iterations=1
        )
        return result

    def outer_body(x: af.Tensor) -> af.Tensor:
        x = inner(x)
        return x * x

    r = af.while_loop(lambda x: x < 3000.0, outer_body, af.constant(2.0))
    assert run(r) == 1048576.0


def test_while_single_tensor_and_nested_structures(graph: af.Graph) -> None:
    Pair = collections.namedtuple("Pair", ["a", "b"])
    out = af.while_loop(
        lambda p, d: p.a < 5,
        lambda p, d: (Pair(p.a + 1, p.b * 2), {"k": d["k"] + 1.0}),
        (Pair(af.constant(0), af.constant(1)), {"k": af.constant(0.0)}),
    )
    p, d = run(list(out))
    assert isinstance(p, Pair)
    assert (p.a, p.b, d["k"]) == (5, 32, 5.0)


def test_while_uses_outside_values_as_loop_constants(graph: af.Graph) -> None:
    step = af.placeholder(af.int32, shape=(), name="step")
    limit = af.constant(100)
    r = af.while_loop(lambda x: x < limit, lambda x: x + step, af.constant(0))
    assert run(r, {step: 7}) == 105


def test_maximum_iterations_caps(graph: af.Graph) -> None:
    r = af.while_loop(lambda x: x < 1000, lambda x: x + 1, af.constant(0), maximum_iterations=7)
    assert run(r) == 7
    r2 = af.while_loop(lambda x: x < 3, lambda x: x + 1, af.constant(0), maximum_iterations=7)
    assert run(r2) == 3


def test_while_zero_iterations(graph: af.Graph) -> None:
    r = af.while_loop(lambda x: x < 0, lambda x: x + 1, af.constant(5))
    assert run(r) == 5


def test_shape_invariants(graph: af.Graph) -> None:
    def body(i: af.Tensor, v: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        return i + 1, af.concat([v, af.reshape(af.cast(i, af.float32), (1,))], 0)

    start = (af.constant(0), af.constant(np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match="shape_invariants"):
        af.while_loop(lambda i, v: i < 3, body, start)
    i, v = af.while_loop(
        lambda i, v: i < 3,
        body,
        start,
        shape_invariants=(af.TensorShape([]), af.TensorShape([None])),
    )
    assert tuple(v.shape) == (None,)
    out_i, out_v = run([i, v])
    assert out_i == 3
    np.testing.assert_array_equal(out_v, [0.0, 0.0, 1.0, 2.0])


def test_while_build_errors(graph: af.Graph) -> None:
    with pytest.raises(ValueError, match="same structure"):
        af.while_loop(lambda a, b: a < 3, lambda a, b: (a + 1,), (af.constant(0), af.constant(1)))
    with pytest.raises(TypeError, match="dtype"):
        af.while_loop(lambda a: a < 3, lambda a: af.cast(a, af.float32), af.constant(0))
    with pytest.raises(ValueError, match="parallel_iterations"):
        af.while_loop(lambda a: a < 3, lambda a: a + 1, af.constant(0), parallel_iterations=0)


def test_parallel_iterations_bounds_iterations_in_flight(graph: af.Graph) -> None:
    in_flight = [0]
    peak = [0]

    async def slow(v: Any) -> Any:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.001)
        in_flight[0] -= 1
        return v

    def body(i: af.Tensor, acc: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        # acc's update does not depend on the previous iteration's slow call, so
        # iterations can overlap up to parallel_iterations.
        return i + 1, acc + af.reshape(af.py_func(slow, [i], af.int32), ())

    i, acc = af.while_loop(
        lambda i, acc: i < 30, body, (af.constant(0), af.constant(0)), parallel_iterations=3
    )
    assert run([i, acc]) == [30, sum(range(30))]
    assert 1 < peak[0] <= 3


# -- cond / case -----------------------------------------------------------------------------


def test_cond_values_from_tf(graph: af.Graph) -> None:
    x = af.constant(10.0)
    a = af.cond(af.less(1, 2), lambda: af.add(x, 1.0), lambda: af.subtract(x, 1.0))
    b = af.cond(af.less(1, 0), lambda: af.add(x, 1.0), lambda: af.subtract(x, 1.0))
    p = af.less(1, 2)
    c = af.cond(
        p, lambda: af.add(af.cond(p, lambda: x + 1.0, lambda: x - 1.0), 1.0), lambda: x - 1.0
    )
    assert run([a, b, c]) == [11.0, 9.0, 12.0]


def test_cond_with_fed_predicate_and_structures(graph: af.Graph) -> None:
    p = af.placeholder(af.bool, shape=(), name="p")
    x = af.constant(3)
    out = af.cond(p, lambda: {"v": x * 2, "w": [x, 1]}, lambda: {"v": x * 3, "w": [x, 2]})
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(out, {p: True}) == {"v": 6, "w": [3, 1]}
        assert sess.run_sync(out, {p: False}) == {"v": 9, "w": [3, 2]}


def test_only_the_taken_branch_runs(graph: af.Graph) -> None:
    calls: list[str] = []

    def effect(tag: str) -> Any:
        def f(v: Any) -> Any:
            calls.append(tag)
            return v

        return f

    p = af.placeholder(af.bool, shape=())
    x = af.constant(1.0)
    out = af.cond(
        p,
        lambda: af.py_func(effect("true"), [x], af.float32),
        lambda: af.py_func(effect("false"), [x], af.float32),
    )
    with af.Session(graph=graph) as sess:
        sess.run_sync(out, {p: True})
        assert calls == ["true"]
        sess.run_sync(out, {p: False})
        assert calls == ["true", "false"]


def test_untaken_branch_side_effect_without_inputs_never_runs(graph: af.Graph) -> None:
    calls: list[int] = []

    def assign_like() -> Any:
        calls.append(1)
        return np.float32(1)

    def true_fn() -> af.Tensor:
        # No data inputs at all: the pivot's control edge keeps it in the branch.
        return af.py_func(assign_like, [], af.float32)

    out = af.cond(af.less(1, 0), true_fn, lambda: af.constant(0.0))
    assert run(out) == 0.0
    assert calls == []


def test_cond_build_errors(graph: af.Graph) -> None:
    with pytest.raises(TypeError, match="Python bool"):
        af.cond(True, lambda: af.constant(1), lambda: af.constant(2))
    with pytest.raises(ValueError, match="same structure"):
        af.cond(af.less(1, 2), lambda: [af.constant(1)], lambda: (af.constant(1), af.constant(2)))
    with pytest.raises(TypeError, match="dtypes"):
        af.cond(af.less(1, 2), lambda: af.constant(1), lambda: af.constant(1.0))
    with pytest.raises(TypeError, match="bool"):
        af.cond(af.constant(1), lambda: af.constant(1), lambda: af.constant(2))


def test_case(graph: af.Graph) -> None:
    x = af.placeholder(af.int32, shape=())
    out = af.case(
        [(af.less(x, 0), lambda: af.constant(-1)), (af.equal(x, 0), lambda: af.constant(0))],
        default=lambda: af.constant(1),
    )
    with af.Session(graph=graph) as sess:
        assert [sess.run_sync(out, {x: v}) for v in (-5, 0, 5)] == [-1, 0, 1]


def test_case_exclusive(graph: af.Graph) -> None:
    x = af.placeholder(af.int32, shape=())
    out = af.case(
        [(af.less(x, 10), lambda: af.constant(1)), (af.less(x, 20), lambda: af.constant(2))],
        default=lambda: af.constant(3),
        exclusive=True,
    )
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(out, {x: 15}) == 2
        with pytest.raises(af.errors.InvalidArgumentError, match="more than one"):
            sess.run_sync(out, {x: 5})


# -- nesting ------------------------------------------------------------------------------------


def test_cond_inside_while(graph: af.Graph) -> None:
    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        return i + 1, af.cond(af.equal(i % 2, 0), lambda: s + 1, lambda: s)

    i, s = af.while_loop(lambda i, s: i < 20, body, (af.constant(0), af.constant(0)))
    assert run([i, s]) == [20, 10]


def test_while_inside_cond(graph: af.Graph) -> None:
    def true_fn() -> af.Tensor:
        result: af.Tensor = af.while_loop(lambda v: v < 10, lambda v: v + 1, af.constant(0))
        return result

    p = af.placeholder(af.bool, shape=())
    out = af.cond(p, true_fn, lambda: af.constant(-1))
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(out, {p: True}) == 10
        # The untaken branch's loop runs dead and ends at once.
        assert sess.run_sync(out, {p: False}) == -1


def test_cond_inside_while_inside_cond(graph: af.Graph) -> None:
    p = af.placeholder(af.bool, shape=())

    def loop() -> af.Tensor:
        result: af.Tensor = af.while_loop(
            lambda v: v < 10,
            lambda v: af.cond(af.less(v, 5), lambda: v + 2, lambda: v + 1),
            af.constant(0),
        )
        return result

    out = af.cond(p, loop, lambda: af.constant(7))
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(out, {p: True}) == 10
        assert sess.run_sync(out, {p: False}) == 7


# -- across devices, deadlines, close ----------------------------------------------------------


def test_while_across_two_devices(graph: af.Graph) -> None:
    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        with af.device("/cpu:0"):
            i2 = i + 1
        with af.device("/cpu:1"):
            s2 = s + i * 2
        return i2, s2

    i, s = af.while_loop(lambda i, s: i < 10, body, (af.constant(0), af.constant(0)))
    assert run([i, s], device_count={"CPU": 2}) == [10, 90]


def test_expensive_kernels_in_a_loop_run_on_their_devices(graph: af.Graph) -> None:
    names: set[str] = set()

    def work(v: Any) -> Any:
        names.add(threading.current_thread().name)
        return v + 1

    def body(i: af.Tensor) -> af.Tensor:
        with af.device("/cpu:1"):
            return af.reshape(af.py_func(work, [i], af.int32, expensive=True), ())

    r = af.while_loop(lambda i: i < 5, body, af.constant(0))
    assert run(r, device_count={"CPU": 2}) == 5
    assert names
    assert all("CPU:1" in n for n in names)


async def test_endless_loop_hits_deadline(graph: af.Graph) -> None:
    r = af.while_loop(lambda x: x > -1, lambda x: x + 1, af.constant(0))
    async with af.Session(graph=graph) as sess:
        start = time.monotonic()
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(r, options=af.RunOptions(timeout_in_ms=100))
        assert time.monotonic() - start < 5


async def test_close_stops_a_running_loop(graph: af.Graph) -> None:
    r = af.while_loop(lambda x: x > -1, lambda x: x + 1, af.constant(0))
    sess = af.Session(graph=graph)
    task = asyncio.create_task(sess.run(r))
    await wait_in_flight(sess, 1)  # the loop runs
    await sess.close()
    with pytest.raises(af.errors.CancelledError):
        await task


# -- errors ----------------------------------------------------------------------------------------


def test_fetching_a_dead_tensor_names_it_and_the_switch(graph: af.Graph) -> None:
    x = af.constant(1.0)
    out_false, out_true = af.raw_ops.switch(x, af.less(1, 2), name="my_switch")
    dead = af.identity(out_false, name="dead_one")
    with pytest.raises(af.errors.InvalidArgumentError) as info:
        run(dead)
    assert "dead_one:0" in str(info.value)
    assert "my_switch" in str(info.value)
    assert run(out_true) == 1.0


def test_feeding_or_fetching_inside_a_loop_is_an_error(graph: af.Graph) -> None:
    seen: list[af.Tensor] = []

    def body(x: af.Tensor) -> af.Tensor:
        y = x + 1
        seen.append(y)
        return y

    r = af.while_loop(lambda x: x < 3, body, af.constant(0))
    with pytest.raises(af.errors.InvalidArgumentError, match="inside a while loop"):
        run(seen[0])
    with pytest.raises(af.errors.InvalidArgumentError, match="inside a while loop"):
        run(r, {seen[0]: 5})


def test_error_inside_a_loop_names_the_node(graph: af.Graph) -> None:
    def fail_at_3(v: Any) -> Any:
        if v == 3:
            raise ValueError("three")
        return v

    r = af.while_loop(
        lambda x: x < 10,
        lambda x: af.reshape(af.py_func(fail_at_3, [x], af.int32, name="checker"), ()) + 1,
        af.constant(0),
    )
    with pytest.raises(af.errors.InvalidArgumentError, match="checker") as info:
        run(r)
    assert "three" in str(info.value)


# -- primitives ------------------------------------------------------------------------------------


def test_raw_switch_merge(graph: af.Graph) -> None:
    p = af.placeholder(af.bool, shape=())
    x = af.constant(5)
    f, t = af.raw_ops.switch(x, p)
    out, index = af.raw_ops.merge([f * 10, t * 100])
    with af.Session(graph=graph) as sess:
        assert sess.run_sync([out, index], {p: True}) == [500, 1]
        assert sess.run_sync([out, index], {p: False}) == [50, 0]


def test_raw_loop(graph: af.Graph) -> None:
    init = af.constant(0)
    e = af.raw_ops.enter(init, "frame")
    limit = af.raw_ops.enter(af.constant(4), "frame", is_constant=True)
    m, _ = af.raw_ops.merge([e, e])
    cond = af.raw_ops.loop_cond(af.less(m, limit))
    f, t = af.raw_ops.switch(m, cond)
    out = af.raw_ops.exit(f)
    nxt = af.raw_ops.next_iteration(t + 1)
    graph._update_input(m.op, 1, nxt)
    assert run(out) == 4


# -- property test ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(-20, 20),
    limit=st.integers(-20, 40),
    step=st.integers(1, 5),
    parallel=st.integers(1, 12),
    cap=st.none() | st.integers(0, 30),
)
def test_counter_loops_match_python(
    start: int, limit: int, step: int, parallel: int, cap: int | None
) -> None:
    g = af.Graph()
    with g.as_default():
        i, total = af.while_loop(
            lambda i, t: i < limit,
            lambda i, t: (i + step, af.cond(af.equal(i % 2, 0), lambda: t + i, lambda: t - 1)),
            (af.constant(start), af.constant(0)),
            parallel_iterations=parallel,
            maximum_iterations=cap,
        )
    want_i, want_t, n = start, 0, 0
    while want_i < limit and (cap is None or n < cap):
        want_t = want_t + want_i if want_i % 2 == 0 else want_t - 1
        want_i += step
        n += 1
    with af.Session(graph=g) as sess:
        assert sess.run_sync([i, total]) == [want_i, want_t]
