"""Loop and cond semantics that must match TensorFlow 1.x.

Every expected value below is TensorFlow's own answer, obtained by running the same
program with ``tf.compat.v1`` (tensorflow-cpu 2.21, ``disable_eager_execution()``
and ``disable_control_flow_v2()``, i.e. v1 Switch / Merge / Enter loops) and
hard-coded here; the tests do not import TensorFlow.  Each test would fail (or
hang until its deadline) without the construction rules of
``asyncflow/ops/control_flow_ops.py`` it guards.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncflow as af

# Generous: a loop that never ends fails the test here instead of hanging it.
_DEADLINE = af.RunOptions(timeout_in_ms=20_000)


def run_then_read(fetch: Any, variable: af.Variable, feeds: Any = None) -> tuple[Any, Any]:
    """Run ``fetch`` after initializing ``variable``; then read the variable in a
    second step (a read in the same step is not ordered against the loop)."""
    with af.Session(graph=af.get_default_graph()) as sess:
        sess.run_sync(variable.initializer)
        result = sess.run_sync(fetch, feeds, options=_DEADLINE)
        return result, sess.run_sync(variable)


def run_each(fetch: Any, feeds_list: list[dict[Any, Any]]) -> list[Any]:
    with af.Session(graph=af.get_default_graph()) as sess:
        return [sess.run_sync(fetch, feeds, options=_DEADLINE) for feeds in feeds_list]


# -- an op fed only from outside the loop runs once per iteration ---------------------


def test_op_fed_only_by_loop_constants_runs_once_per_iteration(graph: af.Graph) -> None:
    # TF: r == 5.0, v == 5.0 (the assign hangs off the loop's pivot; it used to run
    # trips + 1 == 6 times, once more in the iteration whose predicate is false).
    v = af.Variable(0.0)
    c = af.constant(1.0)

    def body(i: af.Tensor) -> af.Tensor:
        return i + v.assign_add(c) * 0.0 + 1.0

    r = af.while_loop(lambda i: i < 5.0, body, [af.constant(0.0)])
    assert run_then_read(r, v) == (5.0, 5.0)


def test_py_func_fed_only_from_outside_runs_once_per_iteration(graph: af.Graph) -> None:
    # TF: r == 5 and the py_func ran 5 times.
    calls: list[float] = []

    def tick(x: np.ndarray) -> np.float32:
        calls.append(float(x))
        return np.float32(x)

    c = af.constant(3.0)

    def body(i: af.Tensor) -> af.Tensor:
        t = af.reshape(af.py_func(tick, [c], af.float32), [])
        return i + af.cast(t > 0.0, af.int32)

    r = af.while_loop(lambda i: i < 5, body, [af.constant(0)])
    assert run_each(r, [{}]) == [[5]]
    assert calls == [3.0] * 5


def test_loop_whose_result_is_only_an_op_of_loop_constants_ends(graph: af.Graph) -> None:
    # TF: r == 5.0, v == 5.0.  Without the pivot edge the assign fired in every
    # iteration the frame opened, its NextIteration was never dead and the loop
    # never ended.
    v = af.Variable(0.0)
    c = af.constant(1.0)
    r = af.while_loop(lambda i: i < 5.0, lambda i: v.assign_add(c), [af.constant(0.0)])
    assert run_then_read(r, v) == (5.0, 5.0)


def test_inner_loop_op_of_outer_constants_runs_once_per_inner_iteration(graph: af.Graph) -> None:
    # TF: r == 2.0, v == 6.0 (2 outer iterations x 3 inner ones).
    v = af.Variable(0.0)
    c = af.constant(1.0)

    def outer(i: af.Tensor) -> af.Tensor:
        j = af.while_loop(
            lambda j: j < 3.0, lambda j: j + v.assign_add(c) * 0.0 + 1.0, [af.constant(0.0)]
        )
        result: af.Tensor = i + 1.0 + j * 0.0
        return result

    r = af.while_loop(lambda i: i < 2.0, outer, [af.constant(0.0)])
    assert run_then_read(r, v) == (2.0, 6.0)


# -- a control dependency from outside into a loop body runs --------------------------


def test_control_dependency_from_outside_into_body_runs_once(graph: af.Graph) -> None:
    # TF: r == 3, v == 1.0: the assign is outside the loop, so it runs once; the
    # body waits for its value entered into the frame.  It used to be dropped.
    v = af.Variable(0.0)
    a = v.assign_add(1.0)

    def body(i: af.Tensor) -> af.Tensor:
        with af.control_dependencies([a]):
            return i + 1

    r = af.while_loop(lambda i: i < 3, body, [af.constant(0)])
    assert run_then_read(r, v) == (3, 1.0)


def test_control_dependency_from_outside_on_an_input_less_body_op(graph: af.Graph) -> None:
    # TF: r == 3, v == 1.0.
    v = af.Variable(0.0)
    a = v.assign_add(1.0)

    def body(i: af.Tensor) -> af.Tensor:
        with af.control_dependencies([a]):
            k = af.constant(1)
        return i + k

    r = af.while_loop(lambda i: i < 3, body, [af.constant(0)])
    assert run_then_read(r, v) == (3, 1.0)


def test_control_dependency_from_outside_into_an_inner_loop(graph: af.Graph) -> None:
    # TF: r == 6, v == 1.0 (the assign is outside both loops).
    v = af.Variable(0.0)
    a = v.assign_add(1.0)

    def inner_body(j: af.Tensor) -> af.Tensor:
        with af.control_dependencies([a]):
            return j + 1

    def body(i: af.Tensor) -> af.Tensor:
        j = af.while_loop(lambda j: j < 2, inner_body, [af.constant(0)])
        result: af.Tensor = i + j
        return result

    r = af.while_loop(lambda i: i < 6, body, [af.constant(0)])
    assert run_then_read(r, v) == (6, 1.0)


@pytest.mark.parametrize(("take", "expected"), [(True, (4, 2.0)), (False, (4, 4.0))])
def test_control_dependency_on_a_body_op_inside_a_cond_of_the_body(
    graph: af.Graph, take: bool, expected: tuple[int, float]
) -> None:
    # TF: (4, 2.0) when the branch is taken (i: 0 -> 2 -> 4), (4, 4.0) when not.
    v = af.Variable(0.0)
    p = af.placeholder(af.bool, ())

    def body(i: af.Tensor) -> af.Tensor:
        a = v.assign_add(1.0)

        def taken() -> af.Tensor:
            with af.control_dependencies([a]):
                return i + 2

        result: af.Tensor = af.cond(p, taken, lambda: i + 1)
        return result

    r = af.while_loop(lambda i: i < 4, body, [af.constant(0)])
    assert run_then_read(r, v, {p: take}) == expected


# Deliberate differences from TensorFlow: in the two programs below TF 1.x silently
# drops the control dependency (the assign never runs, v == 0.0): its
# WhileContext._AddOpInternal skips control inputs without outputs ("TODO(apassos):
# fix that"), and CondContext._AddOpInternal discards control inputs from outside
# the enclosing loop.  asyncflow runs the dependency once, as it does for every
# other control input from outside a loop.


def test_output_less_control_dependency_from_outside_runs_once(graph: af.Graph) -> None:
    v = af.Variable(0.0)
    a = af.group(v.assign_add(1.0))

    def body(i: af.Tensor) -> af.Tensor:
        with af.control_dependencies([a]):
            return i + 1

    r = af.while_loop(lambda i: i < 3, body, [af.constant(0)])
    assert run_then_read(r, v) == (3, 1.0)


def test_output_less_control_dependency_beside_a_body_op(graph: af.Graph) -> None:
    # The group's stand-in value is built outside the loop, clear of the body's
    # control scope (which names the in-loop assign on w).
    u = af.Variable(0.0)
    w = af.Variable(0.0)
    bump_u = af.group(u.assign_add(1.0))

    def body(i: af.Tensor) -> af.Tensor:
        with af.control_dependencies([bump_u, w.assign_add(2.0)]):
            return i + 1

    r = af.while_loop(lambda i: i < 4, body, [af.constant(0)])
    with af.Session(graph=graph) as sess:
        sess.run_sync([u.initializer, w.initializer])
        assert sess.run_sync(r, options=_DEADLINE) == 4
        assert sess.run_sync([u, w]) == [1.0, 8.0]


@pytest.mark.parametrize("take", [True, False])
def test_control_dependency_from_outside_into_a_cond_in_the_body_runs_once(
    graph: af.Graph, take: bool
) -> None:
    v = af.Variable(0.0)
    a = v.assign_add(1.0)
    p = af.placeholder(af.bool, ())

    def body(i: af.Tensor) -> af.Tensor:
        def taken() -> af.Tensor:
            with af.control_dependencies([a]):
                return i + 2

        result: af.Tensor = af.cond(p, taken, lambda: i + 1)
        return result

    r = af.while_loop(lambda i: i < 4, body, [af.constant(0)])
    assert run_then_read(r, v, {p: take}) == (4, 1.0)


# -- while_loop under control_dependencies([computed tensor]) ---------------------------


def test_while_loop_built_under_a_computed_control_dependency(graph: af.Graph) -> None:
    # TF: r == 3.  Used to fail with "Exit node ... is not inside a loop frame".
    x = af.constant(2.0) * 3.0
    with af.control_dependencies([x]):
        r = af.while_loop(lambda i: i < 3, lambda i: i + 1, [af.constant(0)])
    assert run_each(r, [{}]) == [[3]]


def test_while_loop_under_a_control_dependency_still_waits_for_it(graph: af.Graph) -> None:
    # TF: r == 3, v == 5.0: the loop's Enters carry the dependency.
    v = af.Variable(0.0)
    with af.control_dependencies([v.assign(5.0)]):
        r = af.while_loop(lambda i: i < 3, lambda i: i + 1, [af.constant(0)])
    assert run_then_read(r, v) == (3, 5.0)


def test_counted_while_loop_under_a_computed_control_dependency(graph: af.Graph) -> None:
    # TF: r == 7 (maximum_iterations wins over i < 100).
    x = af.constant(2.0) * 3.0
    with af.control_dependencies([x]):
        r = af.while_loop(
            lambda i: i < 100, lambda i: i + 1, [af.constant(0)], maximum_iterations=7
        )
    assert run_each(r, [{}]) == [[7]]


def test_exclusive_case_with_a_loop_in_its_default(graph: af.Graph) -> None:
    # TF: 3 (default), 10, 20; two true predicates: InvalidArgumentError.
    p = af.placeholder(af.bool, ())
    q = af.placeholder(af.bool, ())

    def default() -> af.Tensor:
        result: af.Tensor = af.while_loop(lambda i: i < 3, lambda i: i + 1, af.constant(0))
        return result

    r = af.case(
        [(p, lambda: af.constant(10)), (q, lambda: af.constant(20))],
        default=default,
        exclusive=True,
    )
    assert run_each(r, [{p: False, q: False}, {p: True, q: False}, {p: False, q: True}]) == [
        3,
        10,
        20,
    ]
    with pytest.raises(af.errors.InvalidArgumentError, match="more than one predicate"):
        run_each(r, [{p: True, q: True}])


# -- values entering a branch carry no control input -------------------------------------


def test_live_cond_output_with_a_control_dependency_on_a_branch_constant(graph: af.Graph) -> None:
    # TF: 3.0, 3.0, 7.0, 7.0.  The Switch admitting x into the outer branch used to
    # inherit the control dependency on k (a constant of the inner true branch), so
    # the inner false branch, which shares that Switch, was dead with k.
    p = af.placeholder(af.bool, ())
    q = af.placeholder(af.bool, ())
    x = af.constant(3.0)

    def inner_true() -> af.Tensor:
        k = af.constant(1.0)
        with af.control_dependencies([k]):
            return af.identity(x)

    r = af.cond(p, lambda: af.cond(q, inner_true, lambda: x), lambda: af.constant(7.0))
    feeds = [{p: a, q: b} for a in (True, False) for b in (True, False)]
    assert run_each(r, feeds) == [3.0, 3.0, 7.0, 7.0]


@pytest.mark.parametrize("take", [True, False])
def test_cond_in_a_loop_with_a_control_dependency_on_a_branch_constant(
    graph: af.Graph, take: bool
) -> None:
    # TF: 3.0 either way.  The loop constant Enter of x used to inherit the control
    # dependency on k, a node inside the frame ("inputs from different loop frames").
    p = af.placeholder(af.bool, ())
    x = af.constant(3.0)

    def taken() -> af.Tensor:
        k = af.constant(1.0)
        with af.control_dependencies([k]):
            return af.identity(x)

    r = af.while_loop(
        lambda i: i < 3.0, lambda i: i + af.cond(p, taken, lambda: x), [af.constant(0.0)]
    )
    assert run_each(r, [{p: take}]) == [[3.0]]


@pytest.mark.parametrize(
    ("take_outer", "take_inner", "expected_v"),
    [(True, True, 1.0), (True, False, 0.0), (False, True, 0.0), (False, False, 0.0)],
)
def test_assign_in_a_nested_conds_untaken_branch_leaves_the_merge_live(
    graph: af.Graph, take_outer: bool, take_inner: bool, expected_v: float
) -> None:
    # TF: the result is 3.0 in every case; v == 1.0 only when both branches holding
    # the assign are taken.  The fetched Merge used to be dead for (True, False).
    p = af.placeholder(af.bool, ())
    q = af.placeholder(af.bool, ())
    v = af.Variable(0.0)
    x = af.constant(3.0)

    def inner_true() -> af.Tensor:
        with af.control_dependencies([v.assign_add(1.0)]):
            return af.identity(x)

    r = af.cond(p, lambda: af.cond(q, inner_true, lambda: x), lambda: x)
    assert run_then_read(r, v, {p: take_outer, q: take_inner}) == (3.0, expected_v)
