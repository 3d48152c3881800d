"""Math ops: static dtype/shape inference, build-time errors, kernels against numpy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import asyncflow as af
from asyncflow.testing import reference_run


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


def run(fetches: Any, feed_dict: Any = None) -> Any:
    return reference_run(fetches, feed_dict)


X = np.array([[1.5, -2.0, 3.0], [4.0, 0.5, -6.25]], np.float32)
Y = np.array([2.0, -1.5, 4.0], np.float32)  # broadcasts against X, no zeros
XI = np.array([[7, -8, 9], [-10, 11, 12]], np.int32)
YI = np.array([2, 3, -4], np.int32)

BINARY = [
    (af.add, np.add, "Add", "Add"),
    (af.subtract, np.subtract, "Sub", "Sub"),
    (af.multiply, np.multiply, "Mul", "Mul"),
    (af.floordiv, np.floor_divide, "FloorDiv", "floordiv"),
    (af.mod, np.remainder, "FloorMod", "FloorMod"),
    (af.maximum, np.maximum, "Maximum", "Maximum"),
    (af.minimum, np.minimum, "Minimum", "Minimum"),
]


# -- elementwise binary ------------------------------------------------------------


@pytest.mark.parametrize(("fn", "np_fn", "op_type", "default_name"), BINARY)
@pytest.mark.parametrize(("x", "y"), [(X, Y), (XI, YI)], ids=["float32", "int32"])
def test_binary_matches_numpy(
    g: af.Graph,
    fn: Callable[..., af.Tensor],
    np_fn: Any,
    op_type: str,
    default_name: str,
    x: np.ndarray,
    y: np.ndarray,
) -> None:
    t = fn(af.constant(x), af.constant(y))
    assert t.op.type == op_type
    assert t.op.name == default_name
    assert t.dtype == af.as_dtype(x.dtype)
    assert t.shape == (2, 3)
    out = run(t)
    np.testing.assert_array_equal(out, np_fn(x, y))
    assert out.dtype == x.dtype


def test_pow_matches_numpy(g: af.Graph) -> None:
    t = af.pow(af.constant(np.abs(X)), af.constant(Y))
    assert t.op.type == "Pow"
    np.testing.assert_allclose(run(t), np.power(np.abs(X), Y), rtol=1e-6)
    ti = af.pow(af.constant(XI), 2)
    np.testing.assert_array_equal(run(ti), XI**2)
    assert run(ti).dtype == np.int32


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("y", [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, 7.0, 0.5, -1.5])
def test_pow_of_negative_bases_matches_numpy(g: af.Graph, dt: Any, y: float) -> None:
    # A whole exponent takes the kernel's |x| ** y path with x's sign for odd y: it
    # must give numpy's values, signs of zero and infinities included.
    x = np.array([-3.5, -2, -1, -0.0, 0.0, 0.5, 2, np.inf, -np.inf, np.nan, -1e3], dt)
    with np.errstate(all="ignore"):
        out = run(af.pow(af.constant(x), af.constant(dt(y))))
        want = np.power(x, dt(y))
    assert out.dtype == want.dtype
    np.testing.assert_allclose(out, want, rtol=4e-7 if dt is np.float32 else 1e-15)
    np.testing.assert_array_equal(
        np.signbit(out[~np.isnan(out)]), np.signbit(want[~np.isnan(want)])
    )


def test_binary_dtype_mismatch_names_op(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="bad_add"):
        af.add(af.constant(X), af.constant(XI), name="bad_add")
    # A failed op leaves its name free.
    assert af.add(af.constant(X), af.constant(X), name="bad_add").op.name == "bad_add"


def test_binary_incompatible_shapes_name_op(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="bad_mul"):
        af.multiply(af.constant(X), af.constant([1.0, 2.0]), name="bad_mul")


def test_python_scalar_takes_other_operand_dtype(g: af.Graph) -> None:
    xi = af.constant(XI)
    assert af.add(xi, 1).dtype == af.int32
    assert af.add(2, xi).dtype == af.int32
    assert af.multiply(af.constant(X), 2).dtype == af.float32
    with pytest.raises(TypeError, match="Add"):
        af.add(xi, 1.5)


def test_scalars_and_unknown_shapes(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 3))
    q = af.placeholder(af.float32)
    assert af.add(p, 1.0).shape.as_list() == [None, 3]
    assert af.add(p, af.constant(np.ones((4, 1), np.float32))).shape.as_list() == [4, 3]
    assert af.add(p, q).shape.rank is None
    s = af.add(af.constant(1.0), af.constant(2.0))
    assert s.shape == ()
    assert run(s) == np.float32(3.0)
    assert isinstance(run(s), np.float32)


def test_bool_arithmetic_is_a_type_error(g: af.Graph) -> None:
    b = af.constant([True, False])
    for fn in (af.add, af.subtract, af.multiply, af.floordiv, af.maximum):
        with pytest.raises(TypeError, match="bool"):
            fn(b, b)


def test_add_strings(g: af.Graph) -> None:
    t = af.add(af.constant(["a", "b"]), af.constant(["c", "d"]))
    assert t.dtype == af.string
    assert list(run(t)) == [b"ac", b"bd"]  # string tensors hold bytes, as TF


# -- division ----------------------------------------------------------------------


def test_divide_floats_is_realdiv(g: af.Graph) -> None:
    t = af.divide(af.constant(X), af.constant(Y))
    assert (t.op.type, t.op.name, t.dtype) == ("RealDiv", "truediv", af.float32)
    np.testing.assert_array_equal(run(t), X / Y)


@pytest.mark.parametrize(
    ("dt", "out"),
    [
        (np.int32, np.float64),
        (np.int64, np.float64),
        (np.int16, np.float32),
        (np.int8, np.float32),
        (np.uint8, np.float32),
    ],
)
def test_divide_ints_gives_floats_like_tf(g: af.Graph, dt: Any, out: Any) -> None:
    x, y = np.array([7, 8, 9], dt), np.array([2, 4, 5], dt)
    t = af.divide(af.constant(x), af.constant(y))
    assert t.op.type == "TrueDiv"
    assert t.dtype == af.as_dtype(out)
    result = run(t)
    assert result.dtype == out
    np.testing.assert_allclose(result, x / y, rtol=1e-6)


def test_divide_bool_is_type_error(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="bad_div"):
        af.divide(af.constant(True), af.constant(False), name="bad_div")


def test_floordiv_and_mod_follow_python_signs(g: af.Graph) -> None:
    a, b = np.array([7, -7, 7, -7], np.int64), np.array([2, 2, -2, -2], np.int64)
    assert run(af.floordiv(af.constant(a), af.constant(b))).tolist() == [3, -4, -4, 3]
    assert run(af.mod(af.constant(a), af.constant(b))).tolist() == [1, 1, -1, -1]


# -- unary -------------------------------------------------------------------------

UNARY = [
    (af.negative, np.negative, "Neg"),
    (af.abs, np.abs, "Abs"),
    (af.square, np.square, "Square"),
    (af.sqrt, np.sqrt, "Sqrt"),
    (af.exp, np.exp, "Exp"),
    (af.log, np.log, "Log"),
    (af.tanh, np.tanh, "Tanh"),
]
POSITIVE = np.array([[0.25, 1.0, 2.0], [3.5, 9.0, 0.5]], np.float32)


@pytest.mark.parametrize(("fn", "np_fn", "op_type"), UNARY)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_unary_matches_numpy(g: af.Graph, fn: Any, np_fn: Any, op_type: str, dt: Any) -> None:
    x = POSITIVE.astype(dt)
    t = fn(af.constant(x))
    assert (t.op.type, t.op.name, t.dtype, t.shape) == (
        op_type,
        op_type,
        af.as_dtype(dt),
        af.TensorShape([2, 3]),
    )
    out = run(t)
    assert out.dtype == dt
    np.testing.assert_allclose(out, np_fn(x), rtol=1e-6)


@pytest.mark.parametrize("fn", [af.negative, af.abs, af.square])
def test_int_unary_keeps_dtype(g: af.Graph, fn: Any) -> None:
    out = run(fn(af.constant(XI)))
    assert out.dtype == np.int32


@pytest.mark.parametrize("fn", [af.sqrt, af.exp, af.log, af.tanh])
def test_float_only_unary_rejects_ints(g: af.Graph, fn: Any) -> None:
    with pytest.raises(TypeError, match="bad_unary"):
        fn(af.constant(XI), name="bad_unary")


def test_abs_of_complex_is_real(g: af.Graph) -> None:
    t = af.abs(af.constant(np.array([3 + 4j], np.complex64)))
    assert t.dtype == af.float32
    assert run(t).tolist() == [5.0]


def test_unary_on_scalar_gives_numpy_scalar(g: af.Graph) -> None:
    out = run(af.negative(af.constant(2.5)))
    assert isinstance(out, np.float32)
    assert out == -2.5


def test_log_of_zero_is_silent(g: af.Graph) -> None:
    assert run(af.log(af.constant(0.0))) == -np.inf


# -- comparisons and logic -------------------------------------------------------------

COMPARE = [
    (af.equal, np.equal, "Equal"),
    (af.not_equal, np.not_equal, "NotEqual"),
    (af.less, np.less, "Less"),
    (af.less_equal, np.less_equal, "LessEqual"),
    (af.greater, np.greater, "Greater"),
    (af.greater_equal, np.greater_equal, "GreaterEqual"),
]


@pytest.mark.parametrize(("fn", "np_fn", "op_type"), COMPARE)
def test_comparisons(g: af.Graph, fn: Any, np_fn: Any, op_type: str) -> None:
    x = np.array([[1, 2, 3], [3, 2, 1]], np.int32)
    y = np.array([2, 2, 2], np.int32)
    t = fn(af.constant(x), af.constant(y))
    assert (t.op.type, t.dtype, t.shape) == (op_type, af.bool, af.TensorShape([2, 3]))
    out = run(t)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, np_fn(x, y))
    with pytest.raises(TypeError, match="bad_cmp"):
        fn(af.constant(x), af.constant(Y), name="bad_cmp")


def test_equal_on_strings(g: af.Graph) -> None:
    t = af.equal(af.constant(["a", "b"]), af.constant(["a", "c"]))
    assert run(t).tolist() == [True, False]


LOGICAL = [
    (af.logical_and, np.logical_and, "LogicalAnd"),
    (af.logical_or, np.logical_or, "LogicalOr"),
]


@pytest.mark.parametrize(("fn", "np_fn", "op_type"), LOGICAL)
def test_logical_binary(g: af.Graph, fn: Any, np_fn: Any, op_type: str) -> None:
    a = np.array([[True, False], [True, True]])
    b = np.array([False, True])
    t = fn(af.constant(a), af.constant(b))
    assert (t.op.type, t.dtype, t.shape) == (op_type, af.bool, af.TensorShape([2, 2]))
    np.testing.assert_array_equal(run(t), np_fn(a, b))
    with pytest.raises(TypeError, match="bad_logic"):
        fn(af.constant([1, 0]), af.constant([0, 1]), name="bad_logic")


def test_logical_not(g: af.Graph) -> None:
    t = af.logical_not(af.constant([True, False]))
    assert t.op.type == "LogicalNot"
    assert run(t).tolist() == [False, True]
    with pytest.raises(TypeError, match="LogicalNot"):
        af.logical_not(af.constant([1.0]))


# -- add_n ---------------------------------------------------------------------------


def test_add_n(g: af.Graph) -> None:
    xs = [np.full((2, 3), i, np.int32) for i in range(1, 5)]
    t = af.add_n([af.constant(x) for x in xs])
    assert (t.op.type, t.dtype, t.shape) == ("AddN", af.int32, af.TensorShape([2, 3]))
    out = run(t)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, sum(xs))
    two = af.add_n([af.constant(1.0), af.constant(2.0)])
    assert run(two) == 3.0
    assert run(af.add_n([af.constant(X)])).tolist() == X.tolist()


def test_add_n_merges_partial_shapes(g: af.Graph) -> None:
    a = af.placeholder(af.float32, shape=(None, 3))
    b = af.placeholder(af.float32, shape=(2, None))
    assert af.add_n([a, b]).shape.as_list() == [2, 3]


def test_add_n_errors(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="bad_addn"):
        af.add_n([af.constant(1.0), af.constant(1)], name="bad_addn")
    with pytest.raises(ValueError, match="bad_addn"):
        af.add_n([af.constant([1.0]), af.constant([1.0, 2.0])], name="bad_addn")
    with pytest.raises(ValueError, match="non-empty"):
        af.add_n([])


# -- matmul --------------------------------------------------------------------------


@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_transposes(g: af.Graph, ta: bool, tb: bool) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    a_in = a.T.copy() if ta else a
    b_in = b.T.copy() if tb else b
    t = af.matmul(af.constant(a_in), af.constant(b_in), transpose_a=ta, transpose_b=tb)
    assert (t.op.type, t.op.name, t.shape) == ("MatMul", "MatMul", af.TensorShape([3, 5]))
    np.testing.assert_allclose(run(t), a @ b, rtol=1e-5)


def test_matmul_batched_broadcasts(g: af.Graph) -> None:
    a = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    b = np.arange(4 * 5, dtype=np.float64).reshape(1, 4, 5)
    t = af.matmul(af.constant(a), af.constant(b))
    assert t.shape == (2, 3, 5)
    np.testing.assert_array_equal(run(t), a @ b)
    tt = af.matmul(af.constant(a), af.constant(np.swapaxes(b, -1, -2).copy()), transpose_b=True)
    np.testing.assert_array_equal(run(tt), a @ b)


def test_matmul_int32_keeps_dtype(g: af.Graph) -> None:
    out = run(af.matmul(af.constant(XI), af.constant(XI.T.copy())))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, XI @ XI.T)


def test_matmul_static_checks(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 3))
    assert af.matmul(p, af.constant(np.ones((3, 2), np.float32))).shape.as_list() == [None, 2]
    assert af.matmul(p, af.placeholder(af.float32)).shape.rank is None
    with pytest.raises(ValueError, match="bad_mm"):
        af.matmul(p, af.constant(np.ones((4, 2), np.float32)), name="bad_mm")
    with pytest.raises(ValueError, match="rank 2"):
        af.matmul(af.constant([1.0, 2.0]), af.constant([1.0, 2.0]))
    with pytest.raises(TypeError, match="bad_mm2"):
        af.matmul(p, af.constant(np.ones((3, 2), np.float64)), name="bad_mm2")


# -- reductions ----------------------------------------------------------------------

REDUCE = [
    (af.reduce_sum, np.sum, "Sum"),
    (af.reduce_mean, np.mean, "Mean"),
    (af.reduce_max, np.max, "Max"),
    (af.reduce_min, np.min, "Min"),
    (af.reduce_prod, np.prod, "Prod"),
]
R3 = np.arange(1, 25, dtype=np.float64).reshape(2, 3, 4) / 7


@pytest.mark.parametrize(("fn", "np_fn", "op_type"), REDUCE)
@pytest.mark.parametrize(
    ("axis", "keepdims"),
    [
        (None, False),
        (None, True),
        (0, False),
        (-1, True),
        ([0, 2], False),
        ((1, -1), True),
        ([], False),
    ],
)
def test_reductions_match_numpy(
    g: af.Graph, fn: Any, np_fn: Any, op_type: str, axis: Any, keepdims: bool
) -> None:
    t = fn(af.constant(R3), axis=axis, keepdims=keepdims)
    np_axis = tuple(axis) if isinstance(axis, list | tuple) else axis
    expected = np_fn(R3, axis=np_axis, keepdims=keepdims)
    assert t.op.type == op_type
    assert t.shape == np.shape(expected)
    out = run(t)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (af.reduce_sum, [8, 13]),
        (af.reduce_mean, [2, 4]),
        (af.reduce_prod, [-504, -1320]),
        (af.reduce_max, [9, 12]),
    ],
)
def test_int_reductions_keep_int32(g: af.Graph, fn: Any, expected: list[int]) -> None:
    # Integer mean truncates toward zero, as TensorFlow's.
    out = run(fn(af.constant(XI), axis=1))
    assert out.dtype == np.int32
    assert out.tolist() == expected
    total = run(fn(af.constant(XI)))
    assert isinstance(total, np.int32)


def test_reduction_shapes_with_unknowns(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 3, 4))
    assert af.reduce_sum(p, axis=1).shape.as_list() == [None, 4]
    assert af.reduce_sum(p, axis=[0, -1], keepdims=True).shape.as_list() == [1, 3, 1]
    q = af.placeholder(af.float32)
    assert af.reduce_sum(q).shape == ()
    assert af.reduce_sum(q, axis=1).shape.rank is None
    assert af.reduce_sum(q, keepdims=True).shape.rank is None


def test_reduction_errors(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="bad_sum"):
        af.reduce_sum(af.constant(R3), axis=3, name="bad_sum")
    with pytest.raises(TypeError, match="bad_sum2"):
        af.reduce_sum(af.constant([True]), name="bad_sum2")
    with pytest.raises(TypeError, match="axis"):
        af.reduce_sum(af.constant(R3), axis=1.5)


def test_reduction_tf1_aliases(g: af.Graph) -> None:
    t = af.reduce_sum(af.constant(R3), reduction_indices=[1], keep_dims=True)
    assert t.shape == (2, 1, 4)
    t2 = af.reduce_sum(af.constant(R3), axis=af.constant([0, 1]))
    assert t2.shape == (4,)
    np.testing.assert_allclose(run(t2), R3.sum(axis=(0, 1)))


def test_reduce_all_any(g: af.Graph) -> None:
    from asyncflow.ops.math_ops import reduce_all, reduce_any

    b = np.array([[True, False], [True, True]])
    assert run(reduce_all(af.constant(b), axis=1)).tolist() == [False, True]
    assert run(reduce_any(af.constant(b))) == np.True_


# -- argmax / argmin -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "np_fn", "op_type"), [(af.argmax, np.argmax, "ArgMax"), (af.argmin, np.argmin, "ArgMin")]
)
def test_arg_reductions(g: af.Graph, fn: Any, np_fn: Any, op_type: str) -> None:
    t = fn(af.constant(R3), axis=-1)
    assert (t.op.type, t.dtype, t.shape) == (op_type, af.int64, af.TensorShape([2, 3]))
    out = run(t)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np_fn(R3, axis=-1))
    t0 = fn(af.constant(R3))  # axis None → 0, as TF
    assert t0.shape == (3, 4)
    np.testing.assert_array_equal(run(t0), np_fn(R3, axis=0))
    t32 = fn(af.constant(Y), output_type=af.int32)
    out32 = run(t32)
    assert t32.dtype == af.int32
    assert isinstance(out32, np.int32)
    assert out32 == np_fn(Y)
    with pytest.raises(ValueError, match="bad_arg"):
        fn(af.constant(Y), axis=1, name="bad_arg")
    with pytest.raises(TypeError, match="output_type"):
        fn(af.constant(Y), output_type=af.float32)


# -- cast -----------------------------------------------------------------------------


def test_cast(g: af.Graph) -> None:
    t = af.cast(af.constant([1.7, -1.7, 0.0]), af.int32)
    assert (t.op.type, t.dtype, t.shape) == ("Cast", af.int32, af.TensorShape([3]))
    out = run(t)
    assert out.dtype == np.int32
    assert out.tolist() == [1, -1, 0]  # truncation toward zero
    assert run(af.cast(af.constant([0, 3]), af.bool)).tolist() == [False, True]
    s = run(af.cast(af.constant(2), "float64"))
    assert isinstance(s, np.float64)
    x = af.constant(1.0)
    assert af.cast(x, af.float32) is x
    with pytest.raises(TypeError):
        af.cast(af.constant(["a"]), af.float32)


# -- range ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "expected_dtype"),
    [
        ((5,), {}, np.int32),
        ((2, 10, 3), {}, np.int32),
        ((10, 2, -2), {}, np.int32),
        ((0.0, 1.0, 0.25), {}, np.float32),
        ((1, 4.5), {}, np.float32),
        ((3,), {"dtype": af.int64}, np.int64),
        ((0, 2), {"dtype": af.float64}, np.float64),
    ],
)
def test_range(
    g: af.Graph, args: tuple[Any, ...], kwargs: dict[str, Any], expected_dtype: Any
) -> None:
    t = af.range(*args, **kwargs)
    expected = np.arange(*args, dtype=expected_dtype)
    assert t.op.type == "Range"
    assert t.op.name.startswith("range")
    assert t.dtype == af.as_dtype(expected_dtype)
    assert t.shape == expected.shape
    out = run(t)
    assert out.dtype == expected_dtype
    np.testing.assert_allclose(out, expected)


def test_range_with_tensor_limit(g: af.Graph) -> None:
    n = af.placeholder(af.int32, shape=())
    t = af.range(n)
    assert t.shape.as_list() == [None]
    assert run(t, {n: 4}).tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        af.range(
            af.placeholder(af.int32, shape=()),
            af.placeholder(af.float32, shape=()),
            dtype=af.string,
        )


def test_range_bad_delta(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="delta"):
        af.range(0, 5, 0)
    d = af.placeholder(af.int32, shape=())
    with pytest.raises(ValueError, match="delta"):
        run(af.range(0, 5, d), {d: 0})


# -- where ----------------------------------------------------------------------------


def test_where_select_broadcasts(g: af.Graph) -> None:
    cond = np.array([True, False, True])
    t = af.where(af.constant(cond), af.constant(X), 0.0)
    assert (t.dtype, t.shape) == (af.float32, af.TensorShape([2, 3]))
    out = run(t)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.where(cond, X, np.float32(0.0)))
    with pytest.raises(TypeError, match="bad_where"):
        af.where(af.constant([1, 0]), af.constant([1, 2]), af.constant([3, 4]), name="bad_where")
    with pytest.raises(TypeError, match="bad_where2"):
        af.where(af.constant([True]), af.constant([1]), af.constant([1.0]), name="bad_where2")
    with pytest.raises(ValueError, match="both"):
        af.where(af.constant([True]), af.constant([1]))


def test_where_indices(g: af.Graph) -> None:
    cond = np.array([[True, False], [False, True], [True, True]])
    t = af.where(af.constant(cond))
    assert (t.op.type, t.dtype, t.shape.as_list()) == ("Where", af.int64, [None, 2])
    out = run(t)
    assert out.dtype == np.int64
    assert out.tolist() == [[0, 0], [1, 1], [2, 0], [2, 1]]
    empty = run(af.where(af.constant(np.zeros((2, 2), bool))))
    assert empty.shape == (0, 2)
    assert af.where(af.placeholder(af.bool)).shape.as_list() == [None, None]


# -- operators on Tensor ---------------------------------------------------------------


def test_arithmetic_operators(g: af.Graph) -> None:
    x, y = af.constant(X), af.constant(Y)
    cases = [
        (x + y, "add", X + Y),
        (x - y, "sub", X - Y),
        (x * y, "mul", X * Y),
        (x / y, "truediv", X / Y),
        (x // y, "floordiv", X // Y),
        (x % y, "mod", X % Y),
        (-x, "Neg", -X),
        (abs(x), "Abs", np.abs(X)),
        (1.0 + x, "add", 1 + X),
        (2.0 - x, "sub", 2 - X),
        (3.0 * x, "mul", 3 * X),
        (1.0 / y, "truediv", 1 / Y),
        (7.0 // y, "floordiv", 7 // Y),
        (7.0 % y, "mod", 7 % Y),
        (abs(x) ** 2.0, "pow", np.abs(X) ** 2),
        (2.0**x, "pow", 2.0**X),
    ]
    for t, name, expected in cases:
        assert t.op.name.split("_")[0] == name
        assert t.dtype == af.float32
        np.testing.assert_allclose(run(t), expected.astype(np.float32), rtol=1e-6)


def test_numpy_operands_defer_to_tensor(g: af.Graph) -> None:
    x = af.constant(X)
    for t in (np.float32(2.0) + x, Y * x, np.ones((2, 3), np.float32) - x):
        assert isinstance(t, af.Tensor)
    np.testing.assert_allclose(run(Y * x), Y * X)


def test_matmul_operator(g: af.Graph) -> None:
    a, b = af.constant(X), af.constant(X.T.copy())
    t = a @ b
    assert t.op.type == "MatMul"
    assert t.op.name == "matmul"
    np.testing.assert_allclose(run(t), X @ X.T, rtol=1e-6)
    t2 = X @ b
    np.testing.assert_allclose(run(t2), X @ X.T, rtol=1e-6)


def test_comparison_and_logic_operators(g: af.Graph) -> None:
    x, y = af.constant(XI), af.constant(YI)
    for t, op_type, expected in [
        (x < y, "Less", XI < YI),
        (x <= y, "LessEqual", XI <= YI),
        (x > 0, "Greater", XI > 0),
        (x >= y, "GreaterEqual", XI >= YI),
        (0 < x, "Greater", XI > 0),  # noqa: SIM300 -- the reflected operator is the point
    ]:
        assert t.op.type == op_type
        np.testing.assert_array_equal(run(t), expected)
    a, b = x > 0, x < 10
    for t, op_type, expected in [
        (a & b, "LogicalAnd", (XI > 0) & (XI < 10)),
        (a | b, "LogicalOr", (XI > 0) | (XI < 10)),
        (a ^ b, "LogicalXor", (XI > 0) ^ (XI < 10)),
        (~a, "LogicalNot", ~(XI > 0)),
        (True & a, "LogicalAnd", XI > 0),
    ]:
        assert t.op.type == op_type
        np.testing.assert_array_equal(run(t), expected)
    with pytest.raises(TypeError):
        _ = x & y


def test_int_operators_keep_int32(g: af.Graph) -> None:
    x = af.constant(XI)
    for t in (x + 1, x - 1, x * 2, x // 2, x % 3, x**2, -x, 1 + x):
        out = run(t)
        assert out.dtype == np.int32, t
    assert (x / 2).dtype == af.float64


def test_tensors_hash_by_identity(g: af.Graph) -> None:
    a, b = af.constant(1.0), af.constant(1.0)
    assert len({a, b}) == 2
    assert a in {a: 1}
    with pytest.raises(TypeError, match="bool"):
        bool(a < b)


# -- property tests: broadcasting vs numpy ---------------------------------------------

_SAFE_BINARY = [
    (af.add, np.add),
    (af.subtract, np.subtract),
    (af.multiply, np.multiply),
    (af.maximum, np.maximum),
    (af.minimum, np.minimum),
    (af.less, np.less),
    (af.equal, np.equal),
]


@settings(max_examples=60, deadline=None)
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    op_index=st.integers(0, len(_SAFE_BINARY) - 1),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]),
    seed=st.integers(0, 2**32 - 1),
    static=st.booleans(),
)
def test_broadcasting_binary_ops_match_numpy(
    shapes: Any, op_index: int, dtype: Any, seed: int, static: bool
) -> None:
    fn, np_fn = _SAFE_BINARY[op_index]
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-50, 50, size=s).astype(dtype) for s in shapes.input_shapes)
    with af.Graph().as_default():
        if static:
            pa, pb = af.placeholder(a.dtype, a.shape), af.placeholder(b.dtype, b.shape)
        else:
            pa = af.placeholder(a.dtype, [None] * a.ndim)
            pb = af.placeholder(b.dtype)
        t = fn(pa, pb)
        expected = np_fn(a, b)
        assert t.shape.is_compatible_with(expected.shape)
        if static:
            assert t.shape == shapes.result_shape
        out = reference_run(t, {pa: a, pb: b})
        assert out.dtype == expected.dtype
        np.testing.assert_array_equal(out, expected)


@settings(max_examples=60, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=4),
    data=st.data(),
    keepdims=st.booleans(),
)
def test_reduce_sum_matches_numpy(
    shape: tuple[int, ...], data: st.DataObject, keepdims: bool
) -> None:
    axes = data.draw(
        st.lists(
            st.integers(-len(shape), len(shape) - 1),
            unique_by=lambda a: a % len(shape),
            max_size=len(shape),
        )
    )
    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    with af.Graph().as_default():
        t = af.reduce_sum(af.constant(x), axis=axes, keepdims=keepdims)
        expected = np.sum(x, axis=tuple(axes), keepdims=keepdims, dtype=np.int32)
        assert t.shape == expected.shape
        out = reference_run(t)
        assert np.asarray(out).dtype == np.int32
        np.testing.assert_array_equal(out, expected)


# -- through the session -----------------------------------------------------------------


def test_math_ops_through_session(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.reduce_mean(af.square(x - Y), axis=1) + af.reduce_max(x)
    i = af.argmax(x, axis=1)
    feed = {x: X}
    with af.Session(graph=g) as sess:
        got = sess.run_sync([y, i], feed_dict=feed)
    want = reference_run([y, i], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])


def test_int_mean_truncates_toward_zero(g: af.Graph) -> None:
    out = run(af.reduce_mean(af.constant([[-1, -2], [1, 2]]), axis=1))
    assert out.tolist() == [-1, 1]


def test_where_indices_of_numeric_condition(g: af.Graph) -> None:
    assert run(af.where(af.constant([0, 3, 0, 1]))).tolist() == [[1], [3]]


@pytest.mark.parametrize("transpose_b", [False, True])
def test_a_stack_times_a_matrix_equals_numpy_matmul(g: af.Graph, transpose_b: bool) -> None:
    # The kernel multiplies [batch, rows, k] @ [k, n] as one [batch * rows, k] GEMM; a
    # transposed (non-contiguous) stack and a transposed matrix take the same path.
    rnd = np.random.default_rng(7)
    a = rnd.standard_normal((3, 4, 6, 5)).astype(np.float32)
    strided = np.swapaxes(rnd.standard_normal((3, 4, 5, 6)).astype(np.float32), -1, -2)
    b = rnd.standard_normal((7, 5) if transpose_b else (5, 7)).astype(np.float32)
    want_b = b.T if transpose_b else b
    x = af.placeholder(af.float32)
    y = af.matmul(x, af.constant(b), transpose_b=transpose_b)
    for value in (a, strided):
        out = run(y, {x: value})
        assert out.shape == (3, 4, 6, 7)
        np.testing.assert_allclose(out, np.matmul(value, want_b), rtol=1e-5, atol=1e-5)
    empty = np.zeros((2, 0, 5), np.float32)  # no rows: an empty product, as numpy's
    assert run(y, {x: empty}).shape == (2, 0, 7)


@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_mean_and_softmax_equal_numpy_bit_for_bit(g: af.Graph, dt: Any) -> None:
    # Both kernels call the ufuncs' reduce directly: the same sums and rounding as
    # np.mean and the max-shifted exp / sum.
    x = np.random.default_rng(8).standard_normal((4, 5, 7)).astype(dt)
    t = af.constant(x)
    for axis in (None, 0, [0, 2], -1):
        for keep in (False, True):
            out = run(af.reduce_mean(t, axis=axis, keepdims=keep))
            want = np.mean(
                x,
                axis=None if axis is None else tuple(np.atleast_1d(axis)),
                keepdims=keep,
                dtype=dt,
            )
            np.testing.assert_array_equal(out, want)
            assert np.asarray(out).dtype == dt
    for axis in (-1, 0, 1):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        np.testing.assert_array_equal(
            run(af.nn.softmax(t, axis=axis)), e / np.sum(e, axis=axis, keepdims=True)
        )


@pytest.mark.parametrize("dt", [np.int32, np.float32, np.float64])
def test_reductions_equal_numpy_functions(g: af.Graph, dt: Any) -> None:
    # The kernels call the ufuncs' reduce; the values and dtypes are np.sum's and the rest.
    x = (np.random.default_rng(9).standard_normal((3, 4, 2)) * 4).astype(dt)
    t = af.constant(x)
    for axis in (None, 1, [0, 2]):
        np_axis = None if axis is None else tuple(np.atleast_1d(axis))
        for keep in (False, True):
            for fn, want in (
                (af.reduce_sum, np.sum(x, axis=np_axis, keepdims=keep, dtype=dt)),
                (af.reduce_prod, np.prod(x, axis=np_axis, keepdims=keep, dtype=dt)),
                (af.reduce_max, np.max(x, axis=np_axis, keepdims=keep)),
                (af.reduce_min, np.min(x, axis=np_axis, keepdims=keep)),
            ):
                out = run(fn(t, axis=axis, keepdims=keep))
                np.testing.assert_array_equal(out, want)
                assert np.asarray(out).dtype == dt
            b = af.constant(x > 0)
            np.testing.assert_array_equal(
                run(af.reduce_all(b, axis=axis, keepdims=keep)),
                np.all(x > 0, np_axis, keepdims=keep),
            )
            np.testing.assert_array_equal(
                run(af.reduce_any(b, axis=axis, keepdims=keep)),
                np.any(x > 0, np_axis, keepdims=keep),
            )
