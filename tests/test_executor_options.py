"""``ExecutorOptions``: how a session's steps run, chosen when its plans are bound."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncflow as af


def _probe(order: list[int], k: int) -> Any:
    """A kernel passing its input through that records ``k`` in ``order`` when it runs."""

    def run(v: Any) -> Any:
        order.append(k)
        return v

    return run


def _unordered(n: int, order: list[int]) -> tuple[af.Graph, af.Tensor]:
    """``n`` stateful nodes no edge orders, each recording when it ran, summed."""
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        parts = []
        for k in range(n):
            y = af.py_func(_probe(order, k), [x], af.float64, stateful=True, name=f"p{k}")
            y.set_shape(())
            parts.append(y)
        total = af.add_n(parts)
    return graph, total


def _orders(options: af.ExecutorOptions, runs: int = 1) -> list[list[int]]:
    order: list[int] = []
    graph, total = _unordered(12, order)
    out = []
    with af.Session(graph=graph, config=af.SessionConfig(executor_options=options)) as sess:
        for _ in range(runs):
            order.clear()
            assert sess.run_sync(total, {graph.get_tensor_by_name("x:0"): 1.0}) == 12.0
            out.append(list(order))
    return out


def test_shuffle_seed_shuffles_ready_batches_deterministically() -> None:
    plain = _orders(af.ExecutorOptions(straight_line=False))[0]
    by_seed = {
        seed: _orders(af.ExecutorOptions(straight_line=False, shuffle_seed=seed))[0]
        for seed in range(4)
    }
    again = _orders(af.ExecutorOptions(straight_line=False, shuffle_seed=2))[0]
    assert again == by_seed[2]  # the same seed, the same order
    assert all(sorted(o) == list(range(12)) for o in by_seed.values())
    assert len({tuple(o) for o in (plain, *by_seed.values())}) > 2  # seeds differ


def test_defaults_are_the_fastest_and_sessions_take_the_options() -> None:
    options = af.ExecutorOptions()
    assert (
        options.straight_line,
        options.handoffs,
        options.own_task_group,
        options.kernel_parts,
        options.shuffle_seed,
    ) == (True, True, True, True, None)
    assert af.SessionConfig().executor_options == options
    chosen = af.ExecutorOptions(straight_line=False, shuffle_seed=3)
    graph = af.Graph()
    with graph.as_default():
        y = af.constant(np.float32(2.0)) * 3.0
    with af.Session(graph=graph, config=af.SessionConfig(executor_options=chosen)) as sess:
        assert sess.run_sync(y) == np.float32(6.0)
        assert sess.config.executor_options is chosen


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"straight_line": 1}, TypeError, "straight_line must be a bool"),
        ({"handoffs": None}, TypeError, "handoffs must be a bool"),
        ({"schedule_after": -1}, ValueError, "schedule_after must be an int >= 0"),
        ({"shuffle_seed": 1.5}, TypeError, "shuffle_seed must be None or an int"),
    ],
)
def test_bad_options_are_named(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        af.ExecutorOptions(**kwargs)


def test_session_config_checks_the_type() -> None:
    with pytest.raises(TypeError, match=r"executor_options must be an af\.ExecutorOptions"):
        af.SessionConfig(executor_options={"straight_line": False})  # type: ignore[arg-type]


def test_options_are_frozen() -> None:
    options = af.ExecutorOptions()
    with pytest.raises(AttributeError):
        options.handoffs = False  # type: ignore[misc]


def _call_orders(options: af.ExecutorOptions) -> list[int]:
    """The order in which a called (not inlined) function's unordered stateful body
    nodes ran."""
    order: list[int] = []
    graph = af.Graph()
    with graph.as_default():

        @af.Defun(af.float64, func_name="unordered")
        def body(x: af.Tensor) -> af.Tensor:
            parts = []
            for k in range(12):
                y = af.py_func(_probe(order, k), [x], af.float64, stateful=True)
                y.set_shape(())
                parts.append(y)
            return af.add_n(parts)

        x = af.placeholder(af.float64, shape=(), name="x")
        total = af.reshape(body(x), [])
    no_inlining = af.GraphOptions(optimizer_options=af.OptimizerOptions(do_function_inlining=False))
    config = af.SessionConfig(executor_options=options, graph_options=no_inlining)
    with af.Session(graph=graph, config=config) as sess:
        assert sess.run_sync(total, {x: 1.0}) == 12.0
    return order


def test_a_function_body_runs_with_the_callers_options() -> None:
    # The body of a call kernel is a step of its own: it must see the session's
    # shuffle, or a shuffled run would not reach the orders inside calls.
    by_seed = {
        seed: _call_orders(af.ExecutorOptions(straight_line=False, shuffle_seed=seed))
        for seed in range(4)
    }
    assert all(sorted(o) == list(range(12)) for o in by_seed.values())
    assert _call_orders(af.ExecutorOptions(straight_line=False, shuffle_seed=2)) == by_seed[2]
    assert len({tuple(o) for o in by_seed.values()}) > 1
