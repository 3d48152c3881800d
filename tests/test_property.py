"""Property test: random DAGs run by the Session equal the reference interpreter.

Each example builds a random graph over the op library (binary, unary and n-ary
ops, constants, placeholders, control edges, and async / expensive py_funcs so the
task and thread paths run too), picks random feeds (placeholders and intermediate
tensors) and random fetches (tensors and targets), and compares
``Session.run`` against ``asyncflow.testing.reference_run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af

SHAPE = (3,)
BINARY: list[Callable[[Any, Any], af.Tensor]] = [
    af.add,
    af.subtract,
    af.multiply,
    af.maximum,
    af.minimum,
]
UNARY: list[Callable[[Any], af.Tensor]] = [af.negative, af.abs, af.tanh, af.identity, af.square]


async def _async_identity(v: np.ndarray) -> np.ndarray:
    await asyncio.sleep(0)
    return v


def _thread_identity(v: np.ndarray) -> np.ndarray:
    return v + 0.5


@af.Defun(af.float64, af.float64, func_name="prop_scaled_add")
def _scaled_add(x: af.Tensor, y: af.Tensor) -> af.Tensor:
    return x * 2.0 + y


@af.Defun(af.float64, func_name="prop_nested")
def _nested(x: af.Tensor) -> af.Tensor:
    result: af.Tensor = _scaled_add(af.tanh(x), x) - af.constant(np.ones(3)) * 0.5
    return result


Made = list[
    tuple[Callable[..., af.Tensor], tuple[af.Tensor, ...]]
]  # (op function, inputs) of each node made


@st.composite
def random_graphs(
    draw: st.DrawFn, optimizable: bool = False, inline_only: bool = False
) -> tuple[af.Graph, list[Any], dict[Any, Any]]:
    """A random graph; ``optimizable`` adds constant subgraphs, duplicated
    subexpressions and function calls (nested too) for the optimizer to work on;
    ``inline_only`` leaves out the async and expensive py_funcs (plans the static
    schedule takes)."""
    g = af.Graph()
    values = st.lists(st.floats(-2, 2, allow_nan=False, width=64), min_size=3, max_size=3)
    with g.as_default():
        tensors: list[af.Tensor] = []
        placeholders: list[af.Tensor] = []
        for k in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                p = af.placeholder(af.float64, shape=SHAPE, name=f"p{k}")
                placeholders.append(p)
                tensors.append(p)
            else:
                tensors.append(af.constant(np.array(draw(values)), name=f"c{k}"))
        ops: list[af.Operation] = []
        made: Made = []
        kinds = ["binary", "unary", "add_n"] + ([] if inline_only else ["async", "thread"])
        if optimizable:
            kinds += ["const", "dup", "call", "nested"]
        for _ in range(draw(st.integers(1, 25))):
            kind = draw(st.sampled_from(kinds))
            if kind == "dup" and not made:
                kind = "const"
            deps = draw(st.lists(st.sampled_from(ops), max_size=2)) if ops else []
            with af.control_dependencies(deps):
                t = _random_node(draw, kind, st.sampled_from(tensors), made, values)
            t = af.reshape(t, SHAPE) if kind in ("async", "thread") else t
            tensors.append(t)
            ops.append(t.op)
        fetches: list[Any] = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=4))
        if draw(st.booleans()):
            fetches.append(draw(st.sampled_from(ops)))
        feeds: dict[Any, Any] = {p: np.array(draw(values)) for p in placeholders}
        for t in draw(st.lists(st.sampled_from(tensors), max_size=2)):
            if t not in feeds:
                feeds[t] = np.array(draw(values))
    return g, fetches, feeds


def _random_node(
    draw: st.DrawFn,
    kind: str,
    pick: st.SearchStrategy[af.Tensor],
    made: Made,
    values: st.SearchStrategy[list[float]],
) -> af.Tensor:
    """One node of ``kind`` over tensors drawn by ``pick``; elementwise ones are noted
    in ``made`` so that a later "dup" can build the same expression again."""
    fn: Callable[..., af.Tensor]
    if kind == "const":
        fn = draw(st.sampled_from(BINARY))
        return fn(af.constant(np.array(draw(values))), af.constant(np.array(draw(values))))
    if kind == "dup":
        fn, args = draw(st.sampled_from(made))
        return fn(*args)
    if kind == "call":
        return af.reshape(_scaled_add(draw(pick), draw(pick)), SHAPE)
    if kind == "nested":
        return af.reshape(_nested(draw(pick)), SHAPE)
    if kind in ("binary", "unary"):
        fn = draw(st.sampled_from(BINARY if kind == "binary" else UNARY))
        args = (draw(pick), draw(pick)) if kind == "binary" else (draw(pick),)
        made.append((fn, args))
        return fn(*args)
    if kind == "add_n":
        return af.add_n(draw(st.lists(pick, min_size=1, max_size=4)))
    if kind == "async":
        return af.py_func(_async_identity, [draw(pick)], af.float64)
    return af.py_func(_thread_identity, [draw(pick)], af.float64, expensive=True)


def _assert_same(a: Any, b: Any) -> None:
    if a is None or b is None:
        assert a is None
        assert b is None
        return
    if isinstance(a, list):
        assert isinstance(b, list)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
        return
    np.testing.assert_array_equal(a, b)
    assert np.asarray(a).dtype == np.asarray(b).dtype


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(random_graphs())
def test_session_matches_reference(case: tuple[af.Graph, list[Any], dict[Any, Any]]) -> None:
    graph, fetches, feeds = case
    expected = af.testing.reference_run(fetches, feeds, graph=graph)
    # The step's own task group and py_func parts (the default), then asyncio's
    # TaskGroup and the kernels themselves (the general path).
    for fast in (True, False):
        options = af.ExecutorOptions(own_task_group=fast, kernel_parts=fast)
        with af.Session(
            graph=graph,
            config=af.SessionConfig(inter_op_parallelism_threads=2, executor_options=options),
        ) as sess:
            got = sess.run_sync(fetches, feeds)
            again = sess.run_sync(fetches, feeds)  # the cached plan: the same answer
        _assert_same(got, expected)
        _assert_same(again, expected)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(random_graphs(optimizable=True))
def test_optimizer_levels_agree_with_reference(
    case: tuple[af.Graph, list[Any], dict[Any, Any]],
) -> None:
    graph, fetches, feeds = case
    expected = af.testing.reference_run(fetches, feeds, graph=graph)
    levels = [
        af.OptimizerOptions(),
        af.OptimizerOptions(do_function_inlining=False),
        af.OptimizerOptions(opt_level=af.OptimizerOptions.L0),
    ]
    sizes = []
    for options in levels:
        config = af.SessionConfig(
            inter_op_parallelism_threads=2, graph_options=af.GraphOptions(optimizer_options=options)
        )
        with af.Session(graph=graph, config=config) as sess:
            _assert_same(sess.run_sync(fetches, feeds), expected)
            (stats,) = sess.statistics().optimizer
            sizes.append(stats.nodes_after)
    if not any(op.type.startswith("prop_") for op in graph.get_operations()):
        assert sizes[0] <= sizes[2]  # without calls (whose inlining adds nodes), never more
