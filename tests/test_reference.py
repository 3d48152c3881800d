"""asyncflow.testing.reference_run: the sequential oracle itself."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.testing import reference_run


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


Pair = namedtuple("Pair", ["left", "right"])


def test_fetch_structures(g: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.constant([1, 2], name="b")
    noop = af.no_op(name="nothing")
    out = reference_run({"x": [a, (b, "a:0")], "p": Pair(a, noop), "n": "nothing"})
    assert out["x"][0] == 1.0
    assert isinstance(out["x"][1], tuple)
    assert out["x"][1][0].tolist() == [1, 2]
    assert out["x"][1][1] == 1.0
    assert isinstance(out["p"], Pair)
    assert out["p"].right is None
    assert out["n"] is None


def test_scalars_are_numpy_scalars_and_arrays_ndarrays(g: af.Graph) -> None:
    s = reference_run(af.constant(2, dtype=af.int64))
    assert isinstance(s, np.int64)
    v = reference_run(af.constant([2.0]))
    assert isinstance(v, np.ndarray)


def test_feeds_by_tensor_and_name_are_converted(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=[None], name="x")
    y = x * 2.0
    out = reference_run(y, {"x:0": [1, 2]})
    assert out.dtype == np.float32
    assert out.tolist() == [2.0, 4.0]
    assert reference_run(y, {x: np.array([3.0], np.float64)}).dtype == np.float32


def test_feeding_an_intermediate_cuts_off_its_ancestors(g: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")  # never fed: must not run
    y = af.identity(x, name="y")
    z = y + 1.0
    assert reference_run(z, {y: 1.0}) == 2.0
    assert reference_run(y, {y: 5.0}) == 5.0


def test_each_op_runs_once_and_controls_run_first(g: af.Graph) -> None:
    log: list[str] = []

    def note(tag: str) -> Any:
        def f(*args: Any) -> Any:
            log.append(tag)
            return np.int32(len(log))

        return f

    first = af.py_func(note("first"), [], [])
    with af.control_dependencies([first]):
        second = af.py_func(note("second"), [], af.int32)
    total = second + second
    assert reference_run([total, second]) == [4, 2]
    assert log == ["first", "second"]


def test_deep_chain_does_not_recurse(g: af.Graph) -> None:
    t = af.constant(0)
    for _ in range(10_000):
        t = t + 1
    assert reference_run(t) == 10_000


def test_kernel_errors_propagate(g: af.Graph) -> None:
    x = af.placeholder(af.float32, name="unfed")
    with pytest.raises(af.errors.InvalidArgumentError, match="unfed"):
        reference_run(x + 1.0)


def test_dtype_check_catches_bad_kernels(g: af.Graph) -> None:
    make = af.register_op(
        "RefTestWidening",
        lambda inputs, attrs: [(inputs[0].dtype, inputs[0].shape)],
        kernel=lambda x: x.astype(np.float64),
    )
    t = make(af.constant([1.0]))
    with pytest.raises(AssertionError, match="RefTestWidening"):
        reference_run(t)
    assert reference_run(t, check_dtypes=False).dtype == np.float64


def test_graph_argument_and_unknown_names(g: af.Graph) -> None:
    af.constant(3, name="c")
    other = af.Graph()
    assert reference_run("c:0", graph=g) == 3
    with pytest.raises(ValueError, match="'c'"):
        reference_run("c:0", graph=other)


def test_async_kernel_without_running_loop(g: af.Graph) -> None:
    async def inc(x: Any) -> Any:
        return x + 1

    assert reference_run(af.py_func(inc, [af.constant(1)], af.int32)) == 2


def test_reference_agrees_with_session(g: af.Graph) -> None:
    x = af.placeholder(af.int64, shape=[None])
    y = af.reduce_sum(af.where(x > 2, x, -x) * 3)
    with af.Session(graph=g) as sess:
        assert sess.run_sync(y, {x: [1, 2, 3, 4]}) == reference_run(y, {x: [1, 2, 3, 4]})


# -- property: random DAGs of elementwise ops vs direct numpy evaluation -----------------

# (arity, the graph op, the numpy function it must agree with)
_OPS: list[tuple[int, Callable[..., af.Tensor], Callable[..., np.ndarray]]] = [
    (2, lambda a, b: a + b, np.add),
    (2, lambda a, b: a - b, np.subtract),
    (2, lambda a, b: af.maximum(a, b), np.maximum),
    (2, lambda a, b: a * b % 97, lambda a, b: np.remainder(a * b, 97)),
    (1, lambda a: -a, np.negative),
    (1, lambda a: af.abs(a), np.abs),
]


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_random_dags_match_numpy(data: st.DataObject) -> None:
    n_inputs = data.draw(st.integers(1, 3))
    n_nodes = data.draw(st.integers(1, 25))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    with af.Graph().as_default():
        placeholders = [af.placeholder(af.int64, shape=[4]) for _ in range(n_inputs)]
        feeds = {p: rng.integers(-9, 9, size=4) for p in placeholders}
        tensors: list[af.Tensor] = list(placeholders)
        values: list[np.ndarray] = [feeds[p] for p in placeholders]
        for _ in range(n_nodes):
            arity, build, np_fn = _OPS[data.draw(st.integers(0, len(_OPS) - 1))]
            picks = [data.draw(st.integers(0, len(tensors) - 1)) for _ in range(arity)]
            tensors.append(build(*(tensors[i] for i in picks)))
            values.append(np_fn(*(values[i] for i in picks)))
        fetch_ids = data.draw(st.lists(st.integers(0, len(tensors) - 1), min_size=1, max_size=4))
        out = reference_run([tensors[i] for i in fetch_ids], feeds)
        for got, i in zip(out, fetch_ids, strict=True):
            np.testing.assert_array_equal(got, values[i])
