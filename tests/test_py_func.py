"""af.py_func: sync, expensive and async Python kernels; output conversion; errors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.framework import registry
from asyncflow.testing import reference_run as run


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


def double(x: np.ndarray) -> np.ndarray:
    return x * 2


async def async_double(x: np.ndarray) -> np.ndarray:
    await asyncio.sleep(0)
    return x * 2


def split_sum(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    return x + y, (x * y).tolist()


def kernel_kind(t: af.Tensor | af.Operation) -> int:
    op = t if isinstance(t, af.Operation) else t.op
    return registry.get_kernel(op.type).factory(op)[1]


def test_single_output(g: af.Graph) -> None:
    x = af.constant([1.0, 2.0])
    y = af.py_func(double, [x], af.float32)
    assert isinstance(y, af.Tensor)
    assert (y.op.type, y.op.name, y.dtype) == ("PyFunc", "PyFunc", af.float32)
    assert y.shape.rank is None
    assert y.op.stateful
    assert y.op.get_attr("func") is double
    assert y.op.get_attr("Tout") == [af.float32]
    assert kernel_kind(y) == registry.INLINE
    out = run(y)
    assert out.dtype == np.float32
    assert out.tolist() == [2.0, 4.0]


def test_results_are_converted_to_tout(g: af.Graph) -> None:
    y = af.py_func(lambda: 3, [], af.float64)
    out = run(y)
    assert isinstance(out, np.float64)
    assert out == 3.0
    lst = af.py_func(lambda: [1, 2, 3], [], af.int64)  # a bare Tout: one value
    assert run(lst).tolist() == [1, 2, 3]
    assert run(lst).dtype == np.int64


def test_several_outputs(g: af.Graph) -> None:
    a, b = af.constant([1, 2]), af.constant([3, 4])
    outs = af.py_func(split_sum, [a, b], [af.int64, af.float32], name="multi")
    assert isinstance(outs, list)
    assert [t.name for t in outs] == ["multi:0", "multi:1"]
    assert [t.dtype for t in outs] == [af.int64, af.float32]
    s, p = run(outs)
    assert (s.dtype, s.tolist()) == (np.int64, [4, 6])
    assert (p.dtype, p.tolist()) == (np.float32, [3.0, 8.0])


def test_list_of_one_returns_list(g: af.Graph) -> None:
    outs = af.py_func(double, [af.constant(1)], [af.int32])
    assert isinstance(outs, list)
    assert len(outs) == 1
    assert run(outs[0]) == 2
    wrapped = af.py_func(lambda x: [x + 1], [af.constant(1)], (af.int32,))
    assert run(wrapped[0]) == 2


def test_no_outputs_returns_operation(g: af.Graph) -> None:
    seen: list[Any] = []
    op = af.py_func(seen.append, [af.constant(5)], [])
    assert isinstance(op, af.Operation)
    assert op.outputs == ()
    assert run(op) is None
    assert seen == [5]


def test_wrong_number_of_results_is_value_error(g: af.Graph) -> None:
    outs = af.py_func(lambda: (1, 2, 3), [], [af.int32, af.int32], name="bad_count")
    with pytest.raises(ValueError, match=r"bad_count.*3 values.*2"):
        run(outs)
    single = af.py_func(lambda: (1, 2), [], [af.int32])
    with pytest.raises(ValueError, match="2 values"):
        run(single)


def test_no_outputs_drops_the_result(g: af.Graph) -> None:
    assert run(af.py_func(lambda: 1, [], [])) is None


def test_stateless(g: af.Graph) -> None:
    y = af.py_func(double, [af.constant(1.0)], af.float32, stateful=False)
    assert (y.op.type, y.op.name) == ("PyFuncStateless", "PyFuncStateless")
    assert not y.op.stateful
    assert run(y) == 2.0


def test_expensive_sync_runs_on_thread_kind(g: af.Graph) -> None:
    y = af.py_func(double, [af.constant(2.0)], af.float32, expensive=True)
    assert y.op.get_attr("expensive") is True
    assert kernel_kind(y) == registry.EXPENSIVE
    assert run(y) == 4.0


def test_async_function(g: af.Graph) -> None:
    y = af.py_func(async_double, [af.constant([1, 2])], af.int32)
    assert y.op.get_attr("is_async") is True
    assert kernel_kind(y) == registry.ASYNC
    assert run(y).tolist() == [2, 4]


def test_async_callable_object_and_partial(g: af.Graph) -> None:
    import functools

    class Doubler:
        async def __call__(self, x: np.ndarray) -> np.ndarray:
            return x * 2

    async def scale(x: np.ndarray, k: int) -> np.ndarray:
        return x * k

    a = af.py_func(Doubler(), [af.constant(3)], af.int32)
    b = af.py_func(functools.partial(scale, k=3), [af.constant(3)], af.int32)
    assert kernel_kind(a) == kernel_kind(b) == registry.ASYNC
    assert run([a, b]) == [6, 9]


def test_async_expensive_is_value_error(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="expensive"):
        af.py_func(async_double, [af.constant(1)], af.int32, expensive=True)


def test_not_callable_is_type_error(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="callable"):
        af.py_func(42, [], af.int32)  # type: ignore[call-overload]


def test_function_exception_propagates(g: af.Graph) -> None:
    def boom(x: Any) -> Any:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        run(af.py_func(boom, [af.constant(1)], af.int32))


def test_inputs_are_numpy_values(g: af.Graph) -> None:
    seen: list[Any] = []

    def record(x: Any, y: Any) -> Any:
        seen.extend([x, y])
        return np.float32(0)

    run(af.py_func(record, [af.constant([1.0, 2.0]), 3], af.float32))
    assert isinstance(seen[0], np.ndarray)
    assert seen[0].dtype == np.float32
    assert np.asarray(seen[1]).dtype == np.int32


async def test_a_0_d_result_flows_on_as_a_numpy_scalar(g: af.Graph) -> None:
    # A 0-d value between kernels is a numpy scalar, as a fed one is (the kernels'
    # fast path): what a py_func returns as a 0-d array, a Python number or a scalar of
    # another type reaches the next kernel as a scalar of its Tout; an array stays one.
    seen: dict[str, type] = {}

    def recorder(tag: str) -> Any:
        def record(v: Any) -> Any:
            seen[tag] = type(v)
            return v

        return record

    async def as_0_d_array(v: Any) -> Any:
        return np.asarray(v, np.float64)  # 0-d, of another type

    x = af.placeholder(af.float32, shape=(), name="x")
    vec = af.placeholder(af.float32, shape=(2,), name="vec")
    made = {
        "0-d array": af.py_func(as_0_d_array, [x], af.float32),
        "number": af.py_func(lambda v: float(v) + 1.0, [x], af.float32),
        "array": af.py_func(lambda v: v * 2, [vec], af.float32),
    }
    first, second = af.py_func(lambda v: (v, v * 2), [x], [af.float32, af.float64])
    made.update({"first of two": first, "second of two": second})
    outs = [af.py_func(recorder(tag), [t], t.dtype) for tag, t in made.items()]
    async with af.Session(graph=g) as sess:
        for _ in range(3):  # the general engine, then the plan's program
            seen.clear()
            got = await sess.run(outs, {x: 2.0, vec: [1.0, 2.0]})
            assert seen == {
                "0-d array": np.float32,
                "number": np.float32,
                "array": np.ndarray,
                "first of two": np.float32,
                "second of two": np.float64,
            }
            assert [float(got[0]), float(got[1]), float(got[3]), float(got[4])] == [2, 3, 2, 4]
            assert got[2].tolist() == [2.0, 4.0]


async def test_reference_run_async_kernel_inside_running_loop(g: af.Graph) -> None:
    # reference_run drives the coroutine on its own loop in a helper thread.
    threads: list[str] = []

    async def where_am_i(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return x

    y = af.py_func(where_am_i, [af.constant(1)], af.int32)
    assert run(y) == 1
    assert threads[0] != threading.current_thread().name


async def test_py_func_kinds_through_session(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=[None])
    a = af.py_func(double, [x], af.float32)
    b = af.py_func(async_double, [a], af.float32)
    c = af.py_func(double, [b], af.float32, expensive=True)
    out = af.py_func(split_sum, [c, x], [af.float32, af.float32])
    async with af.Session(graph=g) as sess:
        got = await sess.run(out, feed_dict={x: [1.0, 2.0]})
    assert [v.tolist() for v in got] == [[9.0, 18.0], [8.0, 32.0]]


async def test_wrong_count_through_session_is_invalid_argument(g: af.Graph) -> None:
    y = af.py_func(lambda: (1, 2), [], [af.int32], name="bad_py")
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="bad_py"):
            await sess.run(y)
