"""Array ops: constants, placeholders, shape manipulation, slicing, nn ops."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import asyncflow as af
from asyncflow.testing import reference_run as run


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


# -- constant, placeholder, identity, no_op, group -----------------------------------------


def test_constant_dtype_shape_and_value(g: af.Graph) -> None:
    c = af.constant([[1, 2], [3, 4]])
    assert (c.op.type, c.op.name, c.dtype, c.shape) == (
        "Const",
        "Const",
        af.int32,
        af.TensorShape([2, 2]),
    )
    assert run(c).tolist() == [[1, 2], [3, 4]]
    assert af.constant(1.5).dtype == af.float32
    assert af.constant(7, shape=[2, 2]).shape == (2, 2)
    assert run(af.constant([1, 2, 3, 4], shape=(2, 2))).tolist() == [[1, 2], [3, 4]]
    assert isinstance(run(af.constant(3.0)), np.float32)
    with pytest.raises(ValueError, match=r"af\.constant 'c3': value with 3 elements cannot fill"):
        af.constant([1, 2, 3], shape=[2, 2], name="c3")
    with pytest.raises(TypeError):
        af.constant(1.5, dtype=af.int32)


def test_placeholder_with_default_and_identity(g: af.Graph) -> None:
    d = af.placeholder_with_default(af.constant([1.0, 2.0]), shape=[None])
    assert d.shape.as_list() == [None]
    assert run(d).tolist() == [1.0, 2.0]
    assert run(d, {d: [5.0]}).tolist() == [5.0]
    i = af.identity(d, name="ident")
    assert (i.op.type, i.name) == ("Identity", "ident:0")
    with pytest.raises(ValueError, match="not compatible"):
        af.placeholder_with_default(af.constant([1.0, 2.0]), shape=[3])


def test_unfed_placeholder_fails(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    with pytest.raises(af.errors.InvalidArgumentError, match="'x'"):
        run(x)


def test_no_op_and_group(g: af.Graph) -> None:
    a, b = af.no_op(name="a"), af.no_op()
    grp = af.group(a, [b], name="both")
    assert grp.type == "NoOp"
    assert set(grp.control_inputs) == {a, b}
    assert run(grp) is None


# -- reshape ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ([4, 6], (4, 6)),
        ([-1], (24,)),
        ([2, -1, 3], (2, 4, 3)),
        ((24,), (24,)),
        ([1, 2, 3, 4], (1, 2, 3, 4)),
    ],
)
def test_reshape_static(g: af.Graph, shape: Any, expected: tuple[int, ...]) -> None:
    t = af.reshape(af.constant(A), shape)
    assert (t.op.type, t.shape) == ("Reshape", af.TensorShape(expected))
    out = run(t)
    np.testing.assert_array_equal(out, A.reshape(expected))
    assert out.dtype == np.float32


def test_reshape_with_tensor_shapes(g: af.Graph) -> None:
    t = af.reshape(af.constant(A), af.constant([6, -1]))
    assert t.shape == (6, 4)
    assert run(t).shape == (6, 4)
    s = af.placeholder(af.int32, shape=[3])
    u = af.reshape(af.constant(A), s)
    assert u.shape.as_list() == [None, None, None]
    assert run(u, {s: [4, 3, 2]}).shape == (4, 3, 2)
    assert af.reshape(af.constant(A), af.placeholder(af.int32)).shape.rank is None


def test_reshape_unknown_input(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 4))
    assert af.reshape(p, [-1, 2]).shape.as_list() == [None, 2]
    assert af.reshape(p, [2, 2, 2]).shape == (2, 2, 2)
    assert run(af.reshape(af.constant(5.0), [])) == 5.0


def test_reshape_errors_name_op(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="bad_reshape"):
        af.reshape(af.constant(A), [5, 5], name="bad_reshape")
    with pytest.raises(ValueError, match="bad_reshape2"):
        af.reshape(af.constant(A), [5, -1], name="bad_reshape2")
    with pytest.raises(ValueError, match="one dimension"):
        af.reshape(af.constant(A), [-1, -1])
    p = af.placeholder(af.int32, shape=[2])
    with pytest.raises(ValueError, match="reshape"):
        run(af.reshape(af.constant(A), p), {p: [5, 5]})


# -- transpose -------------------------------------------------------------------------


def test_transpose(g: af.Graph) -> None:
    t = af.transpose(af.constant(A))
    assert (t.op.type, t.op.name, t.shape) == ("Transpose", "transpose", af.TensorShape([4, 3, 2]))
    np.testing.assert_array_equal(run(t), A.T)
    t2 = af.transpose(af.constant(A), perm=[1, 0, 2])
    assert t2.shape == (3, 2, 4)
    np.testing.assert_array_equal(run(t2), A.transpose(1, 0, 2))
    p = af.placeholder(af.float32, shape=(None, 5))
    assert af.transpose(p).shape.as_list() == [5, None]
    assert af.transpose(af.placeholder(af.float32), perm=[1, 0]).shape.as_list() == [None, None]
    with pytest.raises(ValueError, match="bad_t"):
        af.transpose(af.constant(A), perm=[0, 1], name="bad_t")


# -- concat, stack ---------------------------------------------------------------------


def test_concat(g: af.Graph) -> None:
    a, b = A, A[:, :1]
    t = af.concat([af.constant(a), af.constant(b)], axis=1)
    assert (t.op.type, t.op.name, t.shape) == ("ConcatV2", "concat", af.TensorShape([2, 4, 4]))
    np.testing.assert_array_equal(run(t), np.concatenate([a, b], axis=1))
    t2 = af.concat([af.constant(a), af.constant(a)], axis=-1)
    assert t2.shape == (2, 3, 8)
    np.testing.assert_array_equal(run(t2), np.concatenate([a, a], axis=-1))
    p = af.placeholder(af.float32, shape=(None, 3, 4))
    assert af.concat([p, af.constant(a)], 0).shape.as_list() == [None, 3, 4]
    assert af.concat([p, af.constant(a)], 1).shape.as_list() == [2, 6, 4]
    single = af.concat([af.constant(a)], 0)
    assert single.op.type == "Identity"


def test_concat_errors(g: af.Graph) -> None:
    with pytest.raises(ValueError, match="bad_concat"):
        af.concat([af.constant(A), af.constant(A[:, :, :1])], axis=1, name="bad_concat")
    with pytest.raises(TypeError, match="bad_concat2"):
        af.concat([af.constant([1.0]), af.constant([1])], axis=0, name="bad_concat2")
    with pytest.raises(ValueError, match="rank"):
        af.concat([af.constant([1.0]), af.constant([[1.0]])], axis=0)
    with pytest.raises(ValueError, match="out of range"):
        af.concat([af.constant([1.0]), af.constant([1.0])], axis=1)


def test_stack(g: af.Graph) -> None:
    xs = [A[0], A[1] * 2]
    for axis in (0, 1, 2, -1, -3):
        t = af.stack([af.constant(x) for x in xs], axis=axis)
        expected = np.stack(xs, axis=axis)
        assert (t.op.type, t.shape.as_list()) == ("Pack", list(expected.shape))
        np.testing.assert_array_equal(run(t), expected)
    scalars = af.stack([af.constant(1), af.constant(2), 3])
    assert scalars.shape == (3,)
    assert run(scalars).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="bad_stack"):
        af.stack([af.constant([1.0]), af.constant([1.0, 2.0])], name="bad_stack")
    with pytest.raises(ValueError, match="out of range"):
        af.stack([af.constant([1.0])], axis=2)


# -- gather ------------------------------------------------------------------------------


def test_gather(g: af.Graph) -> None:
    idx = np.array([[2, 0], [1, 1]], np.int32)
    t = af.gather(af.constant(A), af.constant(idx), axis=1)
    assert (t.op.type, t.shape) == ("GatherV2", af.TensorShape([2, 2, 2, 4]))
    np.testing.assert_array_equal(run(t), np.take(A, idx, axis=1))
    t0 = af.gather(af.constant(A), af.constant(np.int64(1)))
    assert t0.shape == (3, 4)
    np.testing.assert_array_equal(run(t0), A[1])
    with pytest.raises(TypeError, match="bad_gather"):
        af.gather(af.constant(A), af.constant([0.0]), name="bad_gather")
    i = af.placeholder(af.int32, shape=[None])
    assert af.gather(af.constant(A), i, axis=-1).shape.as_list() == [2, 3, None]
    with pytest.raises(
        af.errors.InvalidArgumentError, match=r"indices\[0\] = 5 is not in \[0, 2\)"
    ):
        run(af.gather(af.constant(A), i), {i: [5]})


# -- expand_dims, squeeze ---------------------------------------------------------------


def test_expand_dims(g: af.Graph) -> None:
    for axis in (0, 1, 3, -1, -4):
        t = af.expand_dims(af.constant(A), axis)
        expected = np.expand_dims(A, axis)
        assert (t.op.type, t.shape.as_list()) == ("ExpandDims", list(expected.shape))
        np.testing.assert_array_equal(run(t), expected)
    assert run(af.expand_dims(af.constant(1.0), 0)).shape == (1,)
    assert af.expand_dims(af.constant(A), dim=1).shape == (2, 1, 3, 4)
    with pytest.raises(ValueError, match="bad_ed"):
        af.expand_dims(af.constant(A), 4, name="bad_ed")


def test_squeeze(g: af.Graph) -> None:
    x = np.zeros((1, 3, 1, 2), np.int32)
    t = af.squeeze(af.constant(x))
    assert (t.op.type, t.shape) == ("Squeeze", af.TensorShape([3, 2]))
    assert run(t).shape == (3, 2)
    t2 = af.squeeze(af.constant(x), axis=[-2])
    assert t2.shape == (1, 3, 2)
    assert run(t2).shape == (1, 3, 2)
    assert af.squeeze(af.constant(x), squeeze_dims=[0]).shape == (3, 1, 2)
    p = af.placeholder(af.float32, shape=(None, 1, 3))
    assert af.squeeze(p).shape.rank is None
    assert af.squeeze(p, axis=1).shape.as_list() == [None, 3]
    with pytest.raises(ValueError, match="bad_sq"):
        af.squeeze(af.constant(x), axis=1, name="bad_sq")


# -- shape, size, rank ---------------------------------------------------------------------


def test_shape_size_rank(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 3))
    s, n, r = af.shape(p), af.size(p), af.rank(p)
    assert (s.op.type, s.dtype, s.shape) == ("Shape", af.int32, af.TensorShape([2]))
    assert (n.op.type, n.dtype, n.shape) == ("Size", af.int32, af.TensorShape([]))
    assert (r.op.type, r.dtype, r.shape) == ("Rank", af.int32, af.TensorShape([]))
    v = np.ones((5, 3), np.float32)
    got_s, got_n, got_r = run([s, n, r], {p: v})
    assert got_s.tolist() == [5, 3]
    assert got_s.dtype == np.int32
    assert (got_n, got_r) == (15, 2)
    assert isinstance(got_n, np.int32)
    assert isinstance(got_r, np.int32)
    s64 = af.shape(p, out_type=af.int64)
    assert run(s64, {p: v}).dtype == np.int64
    assert run(af.size(p, out_type=af.int64), {p: v}).dtype == np.int64
    assert af.shape(af.placeholder(af.float32)).shape.as_list() == [None]
    assert run(af.shape(af.constant(1.0))).shape == (0,)
    with pytest.raises(TypeError, match="out_type"):
        af.shape(p, out_type=af.float32)


# -- zeros, ones, fill --------------------------------------------------------------------


def test_zeros_ones_small_are_constants(g: af.Graph) -> None:
    z = af.zeros([2, 3])
    assert (z.op.type, z.op.name, z.dtype, z.shape) == (
        "Const",
        "zeros",
        af.float32,
        af.TensorShape([2, 3]),
    )
    np.testing.assert_array_equal(run(z), np.zeros((2, 3), np.float32))
    o = af.ones((4,), dtype=af.int64, name="o")
    assert (o.op.name, o.dtype) == ("o", af.int64)
    assert run(o).tolist() == [1, 1, 1, 1]
    assert run(af.zeros([])) == 0.0
    assert af.zeros(af.TensorShape([2])).shape == (2,)


def test_zeros_large_and_dynamic_use_fill(g: af.Graph) -> None:
    z = af.zeros([100, 100], dtype=af.int32)
    assert (z.op.type, z.op.name, z.shape) == ("Fill", "zeros", af.TensorShape([100, 100]))
    out = run(z)
    assert (out.shape, out.dtype, out.sum()) == ((100, 100), np.int32, 0)
    s = af.placeholder(af.int32, shape=[2])
    o = af.ones(s)
    assert o.shape.as_list() == [None, None]
    assert run(o, {s: [2, 5]}).tolist() == np.ones((2, 5), np.float32).tolist()
    with pytest.raises(ValueError, match="fully defined"):
        af.zeros([None, 3])


def test_fill(g: af.Graph) -> None:
    f = af.fill([2, 3], 7)
    assert (f.op.type, f.dtype, f.shape) == ("Fill", af.int32, af.TensorShape([2, 3]))
    out = run(f)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.full((2, 3), 7, np.int32))
    assert af.fill(af.constant([4]), 1.5).shape == (4,)
    with pytest.raises(ValueError, match="bad_fill"):
        af.fill([2], af.constant([1.0, 2.0]), name="bad_fill")
    d = af.placeholder(af.int32, shape=[1])
    with pytest.raises(ValueError, match="non-negative"):
        run(af.fill(d, 1.0), {d: [-1]})


# -- slicing (Tensor.__getitem__) ---------------------------------------------------------

SLICES: list[Any] = [
    0,
    -1,
    (1, 2),
    (1, 2, 3),
    slice(None),
    slice(1, None),
    slice(None, None, -1),
    (slice(None), 0),
    (Ellipsis, 1),
    (None, 0),
    (0, None, slice(None, None, 2)),
    (Ellipsis, None),
    (slice(0, 5), slice(-2, None), slice(None, None, 3)),
    (1, Ellipsis, slice(1, 3)),
    (slice(5, 10),),
    (slice(None, None, -2), Ellipsis, 0),
]


@pytest.mark.parametrize("key", SLICES, ids=repr)
def test_getitem_matches_numpy(g: af.Graph, key: Any) -> None:
    t = af.constant(A)[key]
    expected = A[key]
    assert t.op.type == "StridedSlice"
    assert t.op.name == "strided_slice"
    assert t.shape == expected.shape
    out = run(t)
    np.testing.assert_array_equal(out, expected)
    assert np.asarray(out).dtype == np.float32


def test_getitem_unknown_dims(g: af.Graph) -> None:
    p = af.placeholder(af.float32, shape=(None, 4))
    assert p[0].shape.as_list() == [4]
    assert p[1:3].shape.as_list() == [None, 4]
    assert p[:, 1:3].shape.as_list() == [None, 2]
    assert p[..., None].shape.as_list() == [None, 4, 1]
    assert af.placeholder(af.float32)[0].shape.rank is None
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run(p[1:, ::2], {p: v}), v[1:, ::2])


def test_getitem_tensor_indices(g: af.Graph) -> None:
    i = af.placeholder(af.int32, shape=())
    t = af.constant(A)[i, 1 : i + 2]
    assert t.shape.as_list() == [None, 4]
    np.testing.assert_array_equal(run(t, {i: 1}), A[1, 1:3])
    with pytest.raises(TypeError):
        _ = af.constant(A)[af.constant([0, 1])]


def test_getitem_errors(g: af.Graph) -> None:
    c = af.constant(A)
    with pytest.raises(ValueError, match="too many indices"):
        _ = c[0, 0, 0, 0]
    with pytest.raises(ValueError, match="out of bounds"):
        _ = c[2]
    with pytest.raises(ValueError, match="ellipsis"):
        _ = c[..., ...]
    with pytest.raises(ValueError, match="zero"):
        _ = c[::0]
    with pytest.raises(TypeError):
        _ = c[[0, 1]]
    with pytest.raises(TypeError):
        _ = c[1.5]
    i = af.placeholder(af.int32, shape=())
    with pytest.raises(ValueError, match="out of range"):
        run(c[i], {i: 7})


def test_getitem_is_tf_strided_slice(g: af.Graph) -> None:
    import json

    t = af.constant(A)[1, ..., None, ::2]
    # TensorFlow's form: (input, begin, end, strides) and the five masks as ints.
    assert [x.op.type for x in t.op.inputs] == ["Const"] * 4
    assert t.op.get_attr("shrink_axis_mask") == 0b0001
    assert t.op.get_attr("ellipsis_mask") == 0b0010
    assert t.op.get_attr("new_axis_mask") == 0b0100
    assert t.op.get_attr("begin_mask") == t.op.get_attr("end_mask") == 0b1000
    json.dumps(g.as_graph_def())


@settings(max_examples=80, deadline=None)
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5))
def test_getitem_property(data: st.DataObject, shape: tuple[int, ...]) -> None:
    key = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    expected = x[key]
    with af.Graph().as_default():
        t = af.constant(x)[key]
        assert t.shape == expected.shape
        np.testing.assert_array_equal(run(t), expected)


# -- nn ------------------------------------------------------------------------------------


def test_relu(g: af.Graph) -> None:
    x = np.array([[-1.5, 0.0, 2.0]], np.float32)
    t = af.nn.relu(af.constant(x))
    assert (t.op.type, t.dtype, t.shape) == ("Relu", af.float32, af.TensorShape([1, 3]))
    out = run(t)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    ri = run(af.nn.relu(af.constant([-3, 4])))
    assert (ri.dtype, ri.tolist()) == (np.int32, [0, 4])
    assert isinstance(run(af.nn.relu(af.constant(-1.0))), np.float32)
    with pytest.raises(TypeError, match="bad_relu"):
        af.nn.relu(af.constant([True]), name="bad_relu")


def test_sigmoid_is_stable(g: af.Graph) -> None:
    x = np.array([-1000.0, -5.0, 0.0, 5.0, 1000.0], np.float32)
    out = run(af.nn.sigmoid(af.constant(x)))
    assert out.dtype == np.float32
    expected = 1 / (1 + np.exp(-x.astype(np.float64).clip(-700, 700)))
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="Sigmoid"):
        af.nn.sigmoid(af.constant([1]))


def test_softmax(g: af.Graph) -> None:
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, -1000.0]], np.float64)
    t = af.nn.softmax(af.constant(x))
    assert (t.op.type, t.shape) == ("Softmax", af.TensorShape([2, 3]))
    out = run(t)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(out.sum(axis=-1), 1.0)
    col = run(af.nn.softmax(af.constant(x[:1]), axis=0))
    np.testing.assert_allclose(col, np.ones((1, 3)))
    with pytest.raises(ValueError, match="bad_sm"):
        af.nn.softmax(af.constant(x), axis=2, name="bad_sm")
    with pytest.raises(ValueError, match="rank"):
        af.nn.softmax(af.constant(1.0))


def test_array_ops_through_session(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3, 4), name="x")
    y = af.concat([af.transpose(x, [0, 2, 1])[:, :2], af.zeros([2, 1, 3])], axis=1)
    z = af.nn.softmax(af.reshape(y, [-1, 3]))
    feed = {x: A}
    with af.Session(graph=g) as sess:
        got = sess.run_sync({"y": y, "z": z}, feed_dict=feed)
    want = run({"y": y, "z": z}, feed)
    np.testing.assert_allclose(got["y"], want["y"])
    np.testing.assert_allclose(got["z"], want["z"])
