"""TF-exact numerics and errors.

Each expected answer below is what TensorFlow 1.x (``tf.compat.v1`` graph mode,
tensorflow-cpu 2.21) returns for the same program, checked interactively and
hard-coded here so that the tests do not import TensorFlow.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import asyncflow as af

nan, inf = np.nan, np.inf


def run(fetches: Any, feed_dict: Any = None) -> Any:
    with af.Session() as sess:
        return sess.run_sync(fetches, feed_dict)


@pytest.fixture(autouse=True)
def fresh_graph() -> Any:
    g = af.Graph()
    with g.as_default():
        yield g


# -- item 6: numerics ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [af.int32, af.int64, af.uint8])
@pytest.mark.parametrize("op", [af.floordiv, af.mod])
def test_integer_division_by_zero_is_invalid_argument(dtype: af.DType, op: Any) -> None:
    y = af.placeholder(dtype, shape=[None], name="y")
    out = op(af.constant([7, 6], dtype=dtype), y, name="div")
    with pytest.raises(af.errors.InvalidArgumentError, match="Integer division by zero") as e:
        run(out, {y: [0, 2]})
    assert e.value.op is not None
    assert e.value.op.name == "div"
    assert run(out, {y: [2, 4]}).tolist() == ([3, 1] if op is af.floordiv else [1, 2])
    # 0-d divisors (numpy scalars: the check's scalar branch) too.
    z = af.placeholder(dtype, shape=(), name="z")
    scalar = op(af.constant(7, dtype=dtype), z, name="div_scalar")
    with pytest.raises(af.errors.InvalidArgumentError, match="Integer division by zero"):
        run(scalar, {z: 0})
    assert run(scalar, {z: 2}) == (3 if op is af.floordiv else 1)


@pytest.mark.parametrize("op", [af.truncatediv, af.truncatemod])
def test_integer_truncating_division_by_zero_fails(op: Any) -> None:
    # TF 2.21 fails these steps too (with InternalError, a TF bug: see README).
    out = op(af.constant([5, -5]), af.constant([0, 3]))
    with pytest.raises(af.errors.InvalidArgumentError, match="Integer division by zero"):
        run(out)
    assert run(op(af.constant([5, -5, 7]), af.constant([2, 3, -2]))).tolist() == (
        [2, -1, -3] if op is af.truncatediv else [1, -2, 1]
    )


def test_integer_floordiv_and_mod_round_toward_negative_infinity() -> None:
    x, y = af.constant([7, -7, 7, -7]), af.constant([2, 2, -2, -2])
    assert run(x // y).tolist() == [3, -4, -4, 3]
    assert run(x % y).tolist() == [1, 1, -1, -1]


def test_float_floordiv_is_floor_of_quotient() -> None:
    x = af.constant([-10.0, 10.0, -10.0, 1.0, 0.0, -1.0, 5.0, 1e300, -5.0, 5.0], af.float64)
    y = af.constant([3.0, -3.0, 0.0, 0.0, 0.0, 0.0, inf, 1e-300, inf, -inf], af.float64)
    got = run(af.floordiv(x, y))
    # TF 1.x: floor(x / y); numpy's floor_divide gives -1.0 for -5.0 // inf.
    expected = np.array([-4.0, -4.0, -inf, inf, nan, -inf, 0.0, inf, -0.0, -0.0])
    np.testing.assert_array_equal(got, expected)
    assert np.signbit(got[8])
    assert np.signbit(got[9])
    f32 = run(af.floordiv(af.constant([-10.0, 0.3, -7.5]), af.constant([0.1, 0.1, inf])))
    np.testing.assert_array_equal(f32, np.array([-100.0, 3.0, -0.0], np.float32))


def test_float_mod_as_tf() -> None:
    x = af.constant([-10.0, 10.0, -10.0, 1.0, 5.0, -5.0], af.float64)
    y = af.constant([3.0, -3.0, 0.0, 0.0, inf, inf], af.float64)
    np.testing.assert_array_equal(run(af.mod(x, y)), [2.0, -2.0, nan, nan, 5.0, inf])


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([0, 5], r"indices\[1\] = 5 is not in \[0, 3\)"),
        ([-1], r"indices\[0\] = -1 is not in \[0, 3\)"),
    ],
)
def test_gather_rejects_out_of_range_and_negative_indices(indices: list[int], message: str) -> None:
    i = af.placeholder(af.int32, shape=[None])
    out = af.gather(af.constant([1, 2, 3]), i, name="g")
    with pytest.raises(af.errors.InvalidArgumentError, match=message) as e:
        run(out, {i: indices})
    assert e.value.op is not None
    assert e.value.op.name == "g"


def test_gather_error_names_the_multi_dimensional_index() -> None:
    i = af.placeholder(af.int32, shape=[2, 1])
    out = af.gather(af.constant([[1, 2, 3]]), i, axis=1)
    with pytest.raises(
        af.errors.InvalidArgumentError,
        match=r"indices\[1,0\] = 4 is not in "
        r"\[0, 3\)",
    ):
        run(out, {i: [[0], [4]]})


@pytest.mark.parametrize(("indices", "shown"), [([[0, 2]], r"\[0, 2\]"), ([[-1, 0]], r"\[-1, 0\]")])
def test_gather_nd_rejects_bad_indices(indices: list[list[int]], shown: str) -> None:
    i = af.placeholder(af.int32, shape=[None, 2])
    out = af.gather_nd(af.constant([[1, 2], [3, 4]]), i)
    with pytest.raises(
        af.errors.InvalidArgumentError,
        match=rf"indices\[0\] = {shown} does not index into param shape "
        rf"\[2,2\]",
    ):
        run(out, {i: indices})


def test_reduce_max_min_over_empty_axes_give_the_identity() -> None:
    empty_f = af.zeros([0, 3])
    empty_i = af.zeros([0, 3], af.int32)
    np.testing.assert_array_equal(run(af.reduce_max(empty_f, axis=0)), [-inf] * 3)
    np.testing.assert_array_equal(run(af.reduce_min(empty_f, axis=0)), [inf] * 3)
    assert run(af.reduce_max(empty_i, axis=0)).tolist() == [-2147483648] * 3
    assert run(af.reduce_min(empty_i)) == 2147483647
    assert run(af.reduce_max(af.zeros([0], af.uint8))) == 0
    # Non-empty reductions keep propagating NaN, as TF.
    assert np.isnan(run(af.reduce_max(af.constant([1.0, nan, 3.0]))))
    assert np.isnan(run(af.reduce_min(af.constant([nan, 1.0, -3.0]))))


def test_integer_reduce_mean_does_not_overflow_and_is_zero_when_empty() -> None:
    cases = [
        (af.constant([2**30] * 3, af.int32), None, 1073741824),
        (af.constant([100, 100, -7], af.int8), None, 64),
        (af.constant([-7, 0], af.int32), None, -3),  # truncated toward zero
        (af.constant([-9, 2], af.int64), None, -3),
        (af.constant([255, 255, 1], af.uint8), None, 170),
        (af.zeros([0], af.int32), None, 0),
    ]
    for x, axis, expected in cases:
        got = run(af.reduce_mean(x, axis=axis))
        assert got == expected
        assert got.dtype == x.dtype.np
    rows = run(af.reduce_mean(af.constant([[2**30, 2**30], [-5, -6]], af.int32), axis=1))
    assert rows.tolist() == [1073741824, -5]
    empty_mean = run(af.reduce_mean(af.zeros([0], af.float32)))
    assert np.isnan(empty_mean)
    assert empty_mean.dtype == np.float32


def test_sigmoid_is_exact_for_large_negative_inputs() -> None:
    x = af.constant([-1000.0, -700.0, -100.0, -20.0, 0.0, 20.0, 100.0, 1000.0], af.float64)
    expected = [
        0.0,
        9.8596765437597708e-305,
        3.7200759760208356e-044,
        2.0611536181902033e-009,
        0.5,
        9.9999999793884642e-001,
        1.0,
        1.0,
    ]
    np.testing.assert_allclose(run(af.nn.sigmoid(x)), expected, rtol=1e-15, atol=0)
    f32 = run(af.nn.sigmoid(af.constant([-87.0, -50.0, -20.0, 0.0, 20.0])))
    np.testing.assert_allclose(
        f32, [1.6458112e-38, 1.9287498e-22, 2.0611541e-09, 0.5, 1.0], rtol=1e-5
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_of_each_float_dtype_keeps_its_dtype_and_values(dtype: Any) -> None:
    """The kernel's 0 and 1 are of the input's dtype: the values are those of the
    formula with Python numbers, in the input's dtype, scalars as scalars."""
    from asyncflow.ops.nn_ops import _sigmoid_kernel

    x = np.array([[-1000.0, -60.0, -3.5, -0.0, 0.0, 1e-3, 2.0, 30.0, 1000.0]], dtype)
    got = _sigmoid_kernel(x)
    assert got.dtype == dtype
    assert got.shape == x.shape
    with np.errstate(over="ignore"):
        reference = np.exp(np.minimum(x, 0)) / (1 + np.exp(-np.abs(x)))
    np.testing.assert_array_equal(got, reference)
    one = _sigmoid_kernel(dtype(2.0))
    assert type(one) is dtype
    assert one == reference[0, 6]


@pytest.mark.parametrize(
    ("values", "argmax", "argmin"),
    [
        ([1.0, nan, 3.0, nan], 2, 0),
        ([1.0, nan, -3.0], 0, 2),
        ([nan, 5.0, 1.0], 1, 2),
        ([nan, nan], 0, 0),
        ([-inf, nan], 0, 0),
        ([nan, -inf, -inf], 0, 1),
        ([inf, nan, inf], 0, 0),
        ([nan, inf], 1, 0),
        ([1.0, nan, 1.0], 0, 0),
        ([1.0, 3.0, 3.0], 1, 0),
    ],
)
def test_argmax_argmin_skip_nan_as_tf(values: list[float], argmax: int, argmin: int) -> None:
    # TF's CPU kernel never picks a NaN; an all-NaN slice gives 0; ties the first index.
    x = af.constant(values)
    assert run(af.argmax(x)) == argmax
    assert run(af.argmin(x)) == argmin


def test_argmax_nan_along_an_axis_and_in_float64() -> None:
    x = af.constant([[nan, 1.0], [2.0, nan], [nan, nan]])
    assert run(af.argmax(x, axis=1)).tolist() == [1, 0, 0]
    assert run(af.argmax(af.constant([nan, 5.0, 1.0], af.float64))) == 1
    many = np.where(np.arange(100) % 3 == 0, np.nan, np.arange(100.0)).astype(np.float32)
    assert run(af.argmax(af.constant(many))) == 98


def test_argmax_over_an_empty_axis_is_invalid_argument() -> None:
    with pytest.raises(
        af.errors.InvalidArgumentError, match=r"Reduction axis 0 is empty in shape \[0,2\]"
    ):
        run(af.argmax(af.zeros([0, 2]), axis=0))


# -- item 7: control flow, queues, where ------------------------------------------------


def test_case_without_default_and_no_true_predicate_fails() -> None:
    p = af.placeholder(af.bool, shape=[2])
    out = af.case([(p[0], lambda: af.constant(1)), (p[1], lambda: af.constant(2))])
    with pytest.raises(
        af.errors.InvalidArgumentError, match=r"None of conditions evaluated as True:\] \[0 0\]"
    ):
        run(out, {p: [False, False]})
    assert run(out, {p: [True, False]}) == 1
    assert run(out, {p: [False, True]}) == 2


def test_case_without_default_guards_tensors_made_outside() -> None:
    outside = af.constant(5)
    p = af.placeholder(af.bool, shape=[])
    out = af.case([(p, lambda: outside)])
    assert run(out, {p: True}) == 5
    with pytest.raises(af.errors.InvalidArgumentError, match="None of conditions"):
        run(out, {p: False})


def test_dequeue_many_zero_has_the_component_shape() -> None:
    q = af.FIFOQueue(3, [af.float32, af.int32], shapes=[(2,), (3, 1)])
    a, b = q.dequeue_many(0)
    got_a, got_b = run([a, b])
    assert got_a.shape == (0, 2)
    assert got_a.dtype == np.float32
    assert got_b.shape == (0, 3, 1)
    assert got_b.dtype == np.int32


def test_closing_a_closed_queue_is_cancelled() -> None:
    q = af.FIFOQueue(3, [af.float32], name="q")
    close = q.close()
    with af.Session() as sess:
        sess.run_sync(close)
        with pytest.raises(af.errors.CancelledError, match="'q' is already closed"):
            sess.run_sync(close)
        assert sess.run_sync(q.size()) == 0  # the session stays usable


def test_where_with_a_scalar_condition() -> None:
    # With x and y: the scalar picks one whole operand (TF: [1, 2]).
    assert run(af.where(af.constant(True), af.constant([1, 2]), af.constant([3, 4]))).tolist() == [
        1,
        2,
    ]
    assert run(af.where(af.constant(False), af.constant([1, 2]), af.constant([3, 4]))).tolist() == [
        3,
        4,
    ]
    # Coordinates of a scalar: as TF, it builds (statically [n, 0], int64) and the
    # kernel rejects it ("Unhandled input dimensions: 0"), naming the op.
    w0 = af.where(af.constant(True), name="w0")
    assert (w0.dtype, w0.shape.as_list()) == (af.int64, [None, 0])
    with pytest.raises(af.errors.InvalidArgumentError, match="w0"):
        run(w0)
    fed = af.placeholder(af.bool)
    with pytest.raises(af.errors.InvalidArgumentError, match="Unhandled input dimensions: 0"):
        run(af.where(fed), {fed: True})


# -- item 8: build-time type and shape rules ---------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda x: x + 1.5,
        lambda x: x * 2.0,
        lambda x: 2.0 + x,
        lambda x: x // 2.0,
        lambda x: x < 2.0,
        lambda x: af.maximum(x, 2.0, name="mx"),
        lambda x: af.multiply(x, [1.0, 2.0], name="mx"),
    ],
)
def test_python_float_with_an_int_tensor_is_a_type_error(build: Any) -> None:
    x = af.constant([1, 2])
    with pytest.raises(TypeError, match=r"expected int32 for the other operand, got"):
        build(x)


def test_float_literal_type_error_names_the_op() -> None:
    with pytest.raises(TypeError, match=r"bad_mul"):
        af.multiply(af.constant([1, 2]), 2.0, name="bad_mul")
    # Integral Python ints and bools still convert, as TF.
    assert run(af.constant([1.0, 2.0]) + 2).tolist() == [3.0, 4.0]
    assert run(af.constant([1, 2]) + True).tolist() == [2, 3]


@pytest.mark.parametrize(
    ("build", "op_name"),
    [
        (lambda: af.add(af.constant([1, 2, 3]), af.constant([1, 2]), name="bad"), "bad"),
        (lambda: af.reshape(af.constant([1, 2, 3]), [2], name="bad"), "bad"),
        (
            lambda: af.concat([af.constant([[1, 2]]), af.constant([[1, 2, 3]])], 0, name="bad"),
            "bad",
        ),
        (
            lambda: af.matmul(af.constant([[1.0, 2.0]]), af.constant([[1.0, 2.0]]), name="bad"),
            "bad",
        ),
        (lambda: af.slice(af.constant([1, 2, 3]), [1], [5], name="bad"), "bad"),
        (
            lambda: af.strided_slice(
                af.constant([1, 2, 3]), [5], [6], [1], shrink_axis_mask=1, name="bad"
            ),
            "bad",
        ),
    ],
)
def test_statically_invalid_shapes_fail_at_build_time_naming_the_op(
    build: Any, op_name: str
) -> None:
    with pytest.raises(ValueError, match=f"'{op_name}'"):
        build()


# -- item 9: import_graph_def and af.constant errors -----------------------------------


def _graph_def() -> dict[str, Any]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        af.cast(x, af.int32, name="c")
        af.FIFOQueue(3, [af.float32], name="q")
    return g.as_graph_def()


@pytest.mark.parametrize(
    ("node", "attr", "bad"),
    [
        ("x", "dtype", {"dtype": "float99"}),
        ("x", "dtype", {"s": "float32"}),
        ("x", "dtype", {"i": 1}),
        ("c", "DstT", {"np_dtype": "<f4"}),
        ("q", "component_types", {"list": [{"s": "x"}]}),
    ],
)
def test_import_graph_def_rejects_an_unknown_dtype_attr(
    node: str, attr: str, bad: dict[str, Any]
) -> None:
    gd = copy.deepcopy(_graph_def())
    for n in gd["node"]:
        if n["name"] == node:
            n["attr"][attr] = bad
    target = af.Graph()
    with pytest.raises(af.errors.InvalidArgumentError, match=f"node '{node}', attr '{attr}'"):
        af.import_graph_def(gd, graph=target)
    assert target.get_operations() == []  # nothing was added


def test_import_tf_graph_def_rejects_an_invalid_dtype_enum() -> None:
    from asyncflow.compat._values import dtype_from_enum

    with pytest.raises(af.errors.InvalidArgumentError, match="999 is not a valid DataType"):
        dtype_from_enum(999, "node 'x' (Placeholder), attr 'dtype'")
    with pytest.raises(af.errors.UnimplementedError, match="DT_VARIANT"):
        dtype_from_enum(21, "node 'x' (Placeholder), attr 'dtype'")


def test_constant_shape_errors_name_the_op() -> None:
    with pytest.raises(
        ValueError,
        match="af.constant 'cc': value with 3 elements cannot "
        r"fill shape \[2\]",
    ):
        af.constant([1, 2, 3], shape=[2], name="cc")
    with pytest.raises(ValueError, match=r"af\.constant 'ragged'"):
        af.constant([[1, 2], [3]], name="ragged")
    with pytest.raises(TypeError, match=r"af\.constant 'lossy'"):
        af.constant([1.5], dtype=af.int32, name="lossy")
