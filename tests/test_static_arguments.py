"""Static op arguments computed from constants fold when the graph is built.

An op constructor's perm, axis, reduction axes (and the shape arguments shape
functions read) may be tensors computed from constants alone, as TF's
``tensor_util.constant_value`` allows: ``ConcatV2`` of constants, arithmetic on
constants, ``Shape`` / ``Size`` / ``Rank`` of a statically known shape.  A value that
depends on a feed, a variable or a random op is refused, naming the op being built.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import asyncflow as af
from asyncflow.framework.constant_eval import blocking_op, constant_value
from asyncflow.testing import reference_run as run


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _perm() -> af.Tensor:
    return af.concat([af.constant([0]), af.constant([2, 1])], 0, name="perm")


def test_transpose_perm_from_concat_of_constants(g: af.Graph) -> None:
    y = af.transpose(af.constant(A), _perm())
    assert y.op.get_attr("perm") == [0, 2, 1]
    assert y.shape.as_list() == [2, 4, 3]
    np.testing.assert_array_equal(run(y), np.transpose(A, (0, 2, 1)))


def test_transpose_perm_from_shape_arithmetic(g: af.Graph) -> None:
    x = af.placeholder(af.float32, [2, 3, 4], name="x")
    # rank - 1 - range(rank): the reversed dims, computed from x's static rank.
    perm = af.rank(x) - 1 - af.range(af.rank(x))
    y = af.transpose(x, perm)
    np.testing.assert_array_equal(run(y, {x: A}), np.transpose(A))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_mean"])
def test_reduction_axis_computed(g: af.Graph, op: str) -> None:
    axis = af.constant(3) - af.constant(2)  # 1
    axes = af.stack([af.constant(0), af.constant(4) - 2])  # [0, 2]
    y1 = getattr(af, op)(af.constant(A), axis)
    y2 = getattr(af, op)(af.constant(A), axes, keepdims=True)
    expect = getattr(np, op.split("_")[1])
    np.testing.assert_allclose(run(y1), expect(A, axis=1))
    np.testing.assert_allclose(run(y2), expect(A, axis=(0, 2), keepdims=True))
    assert y2.shape.as_list() == [1, 3, 1]


def test_argmax_axis_computed(g: af.Graph) -> None:
    y = af.argmax(af.constant(A), af.size(af.constant([7, 7])))  # axis 2
    np.testing.assert_array_equal(run(y), np.argmax(A, axis=2))


def test_expand_dims_squeeze_axis_computed(g: af.Graph) -> None:
    x = af.placeholder(af.float32, [2, 3, 4], name="x")
    y = af.expand_dims(x, af.rank(x))  # axis 3
    assert y.shape.as_list() == [2, 3, 4, 1]
    z = af.squeeze(y, af.constant([1]) + 2)  # axis [3]
    np.testing.assert_array_equal(run(y, {x: A}), np.expand_dims(A, 3))
    np.testing.assert_array_equal(run(z, {x: A}), A)


def test_concat_stack_unstack_gather_axis_computed(g: af.Graph) -> None:
    a = af.constant(A)
    one = af.constant(2) // 2
    np.testing.assert_array_equal(run(af.concat([a, a], one)), np.concatenate([A, A], 1))
    np.testing.assert_array_equal(run(af.stack([a, a], one)), np.stack([A, A], 1))
    parts = af.unstack(a, axis=one)
    assert len(parts) == 3
    np.testing.assert_array_equal(run(parts[2]), A[:, 2])
    g_ = af.gather(a, af.constant([2, 0]), axis=one + 1)
    np.testing.assert_array_equal(run(g_), np.take(A, [2, 0], axis=2))


def test_split_count_computed(g: af.Graph) -> None:
    a = af.constant(A)
    parts = af.split(a, af.size(af.constant([0, 0])), axis=af.constant(1) * 2)  # 2 along 2
    assert [p.shape.as_list() for p in parts] == [[2, 3, 2], [2, 3, 2]]
    for got, want in zip(run(parts), np.split(A, 2, axis=2)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(
        TypeError,
        match=r"cannot build Split 'sp': num_or_size_splits .*"
        r"'n' \(Placeholder\)",
    ):
        af.split(a, af.placeholder(af.int32, [], name="n"), name="sp")


def test_reshape_shape_from_static_shape_slice(g: af.Graph) -> None:
    x = af.placeholder(af.float32, [2, 3, 4], name="x")
    shape = af.concat([af.constant([-1]), af.shape(x)[2:]], 0)  # [-1, 4]
    np.testing.assert_array_equal(constant_value(shape), [-1, 4])
    y = af.reshape(x, shape)
    assert y.shape.as_list() == [6, 4]  # static, as TF infers
    np.testing.assert_array_equal(run(y, {x: A}), A.reshape(-1, 4))


def test_tile_fill_broadcast_multiples_and_shapes_computed(g: af.Graph) -> None:
    a = af.constant(A)
    t = af.tile(a, af.constant([1, 1, 1]) * af.constant([2, 1, 3]))
    assert t.shape.as_list() == [4, 3, 12]
    np.testing.assert_array_equal(run(t), np.tile(A, (2, 1, 3)))
    f = af.fill(af.shape(a)[:2], 5.0)
    assert f.shape.as_list() == [2, 3]
    np.testing.assert_array_equal(run(f), np.full((2, 3), 5.0, np.float32))
    b = af.broadcast_to(af.constant([1.0, 2.0, 3.0, 4.0]), af.shape(a))
    assert b.shape.as_list() == [2, 3, 4]
    np.testing.assert_array_equal(run(b), np.broadcast_to([1.0, 2.0, 3.0, 4.0], (2, 3, 4)))


def test_slice_pad_one_hot_range_sizes_computed(g: af.Graph) -> None:
    a = af.constant(A)
    s = af.slice(a, af.constant([0, 1, 0]), af.shape(a) - af.constant([1, 1, 2]))
    assert s.shape.as_list() == [1, 2, 2]
    np.testing.assert_array_equal(run(s), A[0:1, 1:3, 0:2])
    p = af.pad(a, af.reshape(af.range(6), [3, 2]) % 2)  # [[0, 1]] * 3
    assert p.shape.as_list() == [3, 4, 5]
    np.testing.assert_array_equal(run(p), np.pad(A, [[0, 1]] * 3))
    h = af.one_hot(af.constant([0, 2]), af.size(a) // 8)  # depth 3
    assert h.shape.as_list() == [2, 3]
    np.testing.assert_array_equal(run(h), np.eye(3, dtype=np.float32)[[0, 2]])
    r = af.range(af.constant(1), af.size(a) // 4)  # 1 .. 5
    assert r.shape.as_list() == [5]
    np.testing.assert_array_equal(run(r), np.arange(1, 6))


def test_random_shape_computed_is_static(g: af.Graph) -> None:
    r = af.random_uniform(af.constant([2, 1]) * 3, seed=1)
    assert r.shape.as_list() == [6, 3]
    assert run(r).shape == (6, 3)


def test_data_dependent_argument_refused_naming_the_op(g: af.Graph) -> None:
    x = af.placeholder(af.float32, [2, 3, 4], name="x")
    p = af.placeholder(af.int32, [3], name="p")
    with pytest.raises(
        TypeError,
        match=r"cannot build Transpose 'tr': perm must be known "
        r"when the graph is built .*'p:0' \(Placeholder\)",
    ):
        af.transpose(x, p, name="tr")
    k = af.placeholder(af.int32, [], name="k")
    with pytest.raises(
        TypeError,
        match=r"cannot build ExpandDims 'ed': axis .*'add:0' "
        r"\(Add\), which depends on 'k' \(Placeholder\)",
    ):
        af.expand_dims(x, k + 1, name="ed")
    v = af.Variable(1, name="v")
    with pytest.raises(
        TypeError,
        match=r"cannot build Sum 'total': the reduction axis .*"
        r"'v:0' \(VariableV2\), which depends on 'v' ",
    ):
        af.reduce_sum(x, v, name="total")
    with pytest.raises(
        TypeError,
        match=r"cannot build ConcatV2 'cat': axis .*'Cast:0' "
        r"\(Cast\), which depends on 'random_uniform.*",
    ):
        af.concat([x, x], af.cast(af.random_uniform([]) * 0, af.int32), name="cat")


def test_partly_known_shape_is_not_a_constant(g: af.Graph) -> None:
    x = af.placeholder(af.float32, [None, 3], name="x")
    assert constant_value(af.shape(x)) is None
    assert constant_value(af.shape(x)[1:]) is None  # TF's constant_value: no slice rule
    assert constant_value(af.rank(x)) == 2
    assert constant_value(af.size(x)) is None
    with pytest.raises(TypeError, match=r"cannot build Transpose 'tr2': perm"):
        af.transpose(
            af.placeholder(af.float32, [None, 3, 4]), af.reverse(af.shape(x), [0]) - 1, name="tr2"
        )


def test_shape_of_unknown_shape_stops_the_walk(g: af.Graph) -> None:
    """``Shape`` of a tensor without a full static shape is not a constant (as TF): the
    walk stops there instead of going back through the network behind it."""
    x = af.placeholder(af.float32, [None, 4], name="x")
    h = x
    for _ in range(50):
        h = af.tanh(h * 2.0)
    s = af.shape(h)
    assert blocking_op(s) is s.op
    blocker = blocking_op(af.tanh(h))
    assert blocker is not None
    assert blocker.name == "x"
    np.testing.assert_array_equal(constant_value(af.shape(af.zeros([3, 4])) * 2), [6, 8])
