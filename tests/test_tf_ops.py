"""The TF-compatible ops: numerics against TensorFlow's own outputs, numpy references,
shape inference and build-time errors.

TensorFlow's numbers come from ``tests/fixtures/tf/ops.{json,npz}``, written by
``tests/fixtures/tf/make_fixtures.py`` with real TensorFlow; these tests never import it.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pytest

import asyncflow as af

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "tf"
CASES = json.loads((FIXTURES / "ops.json").read_text())
ARRAYS = np.load(FIXTURES / "ops.npz")


@runtime_checkable
class _HasNowait(Protocol):
    """An async kernel with a ``nowait`` twin the step tries first."""

    def nowait(self, *args: Any) -> Any: ...


def run(fetches: Any, feed_dict: Any = None) -> Any:
    with af.Session(graph=af.get_default_graph()) as sess:
        return sess.run_sync(fetches, feed_dict=feed_dict)


def _resolve(path: str) -> Any:
    obj: Any = af
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_matches_tensorflow(graph: af.Graph, case: dict[str, Any]) -> None:
    inputs = {k: ARRAYS[f"{case['name']}/{k}"] for k in case["inputs"]}
    fn = _resolve(case["fn"])
    if case["fn"] == "einsum":
        out = fn(case["kwargs"]["equation"], *inputs.values())
    else:
        out = fn(**inputs, **case["kwargs"])
    outs = list(out) if isinstance(out, tuple | list) else [out]
    got = run(outs[: case["outputs"]])
    for i, value in enumerate(got):
        expected = ARRAYS[f"{case['name']}/out{i}"]
        assert outs[i].shape.is_compatible_with(expected.shape), (outs[i].shape, expected.shape)
        assert np.asarray(value).dtype == expected.dtype
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)


# -- numpy references --------------------------------------------------------------------


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """A loop-based NHWC convolution (symmetric padding) for cross-checking."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, _, o = w.shape
    oh = (x.shape[1] - kh) // stride + 1
    ow = (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, o), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            out[:, i, j, :] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize(("stride", "pad"), [(1, 1), (2, 0), (3, 2)])
def test_conv2d_matches_loop_reference(graph: af.Graph, stride: int, pad: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 6, 3))
    w = rng.standard_normal((3, 3, 3, 5))
    y = af.nn.conv2d(x, w, stride, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    np.testing.assert_allclose(run(y), _conv_reference(x, w, stride, pad), rtol=1e-10)


def test_python_values_take_the_inputs_dtype(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, (1, 3, 3, 2))
    y = af.nn.bias_add(af.nn.conv2d(x, np.ones((1, 1, 2, 2)), 1, "VALID"), [1, 2])
    loss = af.nn.softmax_cross_entropy_with_logits(labels=[[0, 1]], logits=y[0, 0, :1])
    assert y.dtype is af.float32
    assert y.op.inputs[1].dtype is af.float32
    assert loss.dtype is af.float32


def test_big_conv_runs_on_a_worker_thread(graph: af.Graph) -> None:
    from asyncflow.framework import registry
    from asyncflow.runtime.resources import WOULD_BLOCK

    x = af.placeholder(af.float32, (8, 64, 64, 16))
    big = af.nn.conv2d(x, np.ones((3, 3, 16, 32), np.float32), 1, "SAME")
    small = af.nn.conv2d(
        af.placeholder(af.float32, (1, 4, 4, 1)), np.ones((1, 1, 1, 1), np.float32), 1, "SAME"
    )
    one = af.nn.conv2d(
        af.placeholder(af.float32, (1, 128, 128, 16)),
        np.ones((3, 3, 16, 32), np.float32),
        1,
        "SAME",
    )
    kdef = registry.get_kernel("Conv2D")
    # A batch is split across the device's threads when it runs: an async kernel whose
    # nowait twin declines to compute it on the loop.
    kernel, kind = kdef.instantiate(big.op)
    assert kind == registry.ASYNC
    assert isinstance(kernel, _HasNowait)
    assert (
        kernel.nowait(np.zeros((8, 64, 64, 16), np.float32), np.ones((3, 3, 16, 32), np.float32))
        is WOULD_BLOCK
    )
    assert kdef.instantiate(one.op)[1] == registry.EXPENSIVE
    assert kdef.instantiate(small.op)[1] == registry.INLINE


def test_pooling_references(graph: af.Graph) -> None:
    x = np.arange(2 * 5 * 5 * 2, dtype=np.float32).reshape(2, 5, 5, 2) % 7
    m = run(af.nn.max_pool(x, 2, 2, "VALID"))
    np.testing.assert_array_equal(m, x[:, :4, :4].reshape(2, 2, 2, 2, 2, 2).max(axis=(2, 4)))
    # SAME average pooling divides by the number of valid (unpadded) elements.
    a = run(af.nn.avg_pool(x, 2, 2, "SAME"))
    assert a.shape == (2, 3, 3, 2)
    np.testing.assert_allclose(a[:, 2, 2], x[:, 4, 4])
    np.testing.assert_allclose(a[:, 0, 2], x[:, 0:2, 4].mean(axis=1))


def test_activation_references(graph: af.Graph) -> None:
    x = np.linspace(-8, 8, 33).astype(np.float32)
    out = run(
        [
            af.nn.relu6(x),
            af.nn.elu(x),
            af.nn.leaky_relu(x, 0.3),
            af.nn.selu(x),
            af.nn.log_softmax(x),
        ]
    )
    np.testing.assert_array_equal(out[0], np.clip(x, 0, 6))
    np.testing.assert_allclose(out[1], np.where(x < 0, np.expm1(x), x), rtol=1e-6)
    np.testing.assert_allclose(out[2], np.where(x > 0, x, np.float32(0.3) * x), rtol=1e-6)
    assert out[3][-1] == pytest.approx(1.0507009873554805 * 8, rel=1e-6)
    np.testing.assert_allclose(np.exp(out[4]).sum(), 1.0, rtol=1e-6)
    assert all(o.dtype == np.float32 for o in out)


def test_math_references(graph: af.Graph) -> None:
    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -4.0]])
    out = run(
        [
            af.rsqrt(np.abs(x) + 1),
            af.erf(x),
            af.cumsum(x, axis=1, exclusive=True),
            af.cumsum(x, 1, reverse=True),
            af.squared_difference(x, 1.0),
            af.clip_by_value(x, -1.5, 1.5),
            af.einsum("ij->j", x),
        ]
    )
    np.testing.assert_allclose(out[0], 1 / np.sqrt(np.abs(x) + 1))
    np.testing.assert_allclose(out[1], np.vectorize(math.erf)(x))
    np.testing.assert_allclose(out[2], np.cumsum(x, axis=1) - x)
    np.testing.assert_allclose(out[3], np.cumsum(x[:, ::-1], axis=1)[:, ::-1])
    np.testing.assert_allclose(out[4], (x - 1) ** 2)
    np.testing.assert_allclose(out[5], np.clip(x, -1.5, 1.5))
    np.testing.assert_allclose(out[6], x.sum(axis=0))


def test_top_k_ties_prefer_lower_index(graph: af.Graph) -> None:
    values, indices = af.nn.top_k(np.array([1, 5, 5, 2, 5], np.int32), k=3)
    assert indices.dtype is af.int32
    v, i = run([values, indices])
    np.testing.assert_array_equal(v, [5, 5, 5])
    np.testing.assert_array_equal(i, [1, 2, 4])


def test_array_references(graph: af.Graph) -> None:
    x = np.arange(24).reshape(2, 3, 4)
    parts = af.split(x, [1, -1, 1], axis=2)
    assert [p.shape.as_list() for p in parts] == [[2, 3, 1], [2, 3, 2], [2, 3, 1]]
    rows = af.unstack(x, axis=1)
    out = run(
        [
            *parts,
            *rows,
            af.tile(x[0], [2, 1]),
            af.reverse(x, [1]),
            af.gather_nd(x, [[1, 2], [0, 0]]),
            af.boolean_mask(x, [True, False]),
            af.slice(x, [0, 1, 1], [-1, 2, 2]),
            af.one_hot([0, 3], 3, dtype=af.int32),
            af.pad(x[0], [[1, 0], [0, 2]], constant_values=-1),
        ]
    )
    np.testing.assert_array_equal(out[0], x[:, :, :1])
    np.testing.assert_array_equal(out[1], x[:, :, 1:3])
    for k in range(3):
        np.testing.assert_array_equal(out[3 + k], x[:, k])
    np.testing.assert_array_equal(out[6], np.tile(x[0], (2, 1)))
    np.testing.assert_array_equal(out[7], x[:, ::-1])
    np.testing.assert_array_equal(out[8], [x[1, 2], x[0, 0]])
    np.testing.assert_array_equal(out[9], x[:1])
    np.testing.assert_array_equal(out[10], x[:, 1:3, 1:3])
    np.testing.assert_array_equal(out[11], [[1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(out[12], np.pad(x[0], [[1, 0], [0, 2]], constant_values=-1))


def test_strided_slice_with_masks_matches_numpy(graph: af.Graph) -> None:
    x = np.arange(60).reshape(3, 4, 5)
    t = af.strided_slice(
        x, [0, 1, 0], [0, -1, 0], [1, 2, -1], begin_mask=0b101, end_mask=0b101, shrink_axis_mask=0
    )
    assert t.shape.as_list() == [3, 1, 5]
    np.testing.assert_array_equal(run(t), x[:, 1:-1:2, ::-1])
    i = af.placeholder(af.int32, ())
    dyn = af.strided_slice(
        x, af.stack([i, 0, 0]), [0, 0, 0], [1, 1, 1], end_mask=0b110, shrink_axis_mask=0b001
    )
    assert dyn.shape.as_list() == [None, None]
    np.testing.assert_array_equal(run(dyn, {i: 2}), x[2])


def test_fused_batch_norm_nchw_matches_nhwc(graph: af.Graph) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    scale, offset, mean, var = (rng.random(3).astype(np.float32) + 0.5 for _ in range(4))
    y_nchw, _, _ = af.nn.fused_batch_norm(
        x, scale, offset, mean, var, data_format="NCHW", is_training=False
    )
    y_nhwc, _, _ = af.nn.fused_batch_norm(
        x.transpose(0, 2, 3, 1), scale, offset, mean, var, is_training=False
    )
    a, b = run([y_nchw, y_nhwc])
    np.testing.assert_allclose(a, b.transpose(0, 3, 1, 2), rtol=1e-6)


def test_l2_normalize_and_xent_references(graph: af.Graph) -> None:
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    labels = np.array([2, 0])
    loss = af.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    dense = af.nn.softmax_cross_entropy_with_logits(
        labels=np.eye(3, dtype=np.float32)[labels], logits=logits
    )
    out = run([loss, dense, af.nn.l2_normalize(logits, axis=1)])
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(out[0], -log_p[[0, 1], labels], rtol=1e-6)
    np.testing.assert_allclose(out[1], out[0], rtol=1e-6)
    np.testing.assert_allclose(out[2][0], logits[0] / np.linalg.norm(logits[0]), rtol=1e-6)
    np.testing.assert_array_equal(out[2][1], [0, 0, 0])


def test_sparse_xent_bad_label_names_it(graph: af.Graph) -> None:
    loss = af.nn.sparse_softmax_cross_entropy_with_logits(
        labels=np.array([0, 7]), logits=np.zeros((2, 3), np.float32), name="xent"
    )
    with pytest.raises(af.errors.InvalidArgumentError, match=r"label value of 7[\s\S]*xent"):
        run(loss)


# -- shape inference and build-time errors -------------------------------------------------


def test_shapes_are_inferred(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, (None, 9, 8, 3))
    assert af.nn.conv2d(x, np.zeros((3, 3, 3, 4), np.float32), 2, "SAME").shape.as_list() == [
        None,
        5,
        4,
        4,
    ]
    assert af.nn.conv2d(
        x, np.zeros((3, 3, 3, 4), np.float32), 1, "VALID", dilations=2
    ).shape.as_list() == [None, 5, 4, 4]
    assert af.nn.depthwise_conv2d(
        x, np.zeros((3, 3, 3, 2), np.float32), [1, 1, 1, 1], "SAME"
    ).shape.as_list() == [None, 9, 8, 6]
    assert af.nn.max_pool(x, 3, 2, "SAME").shape.as_list() == [None, 5, 4, 3]
    assert af.nn.conv2d_transpose(
        af.placeholder(af.float32, (2, 5, 4, 4)),
        np.zeros((3, 3, 3, 4), np.float32),
        [2, 9, 8, 3],
        2,
        "SAME",
    ).shape.as_list() == [2, 9, 8, 3]
    assert af.nn.avg_pool(x, 2, 2, "VALID").shape.as_list() == [None, 4, 4, 3]
    nchw = af.placeholder(af.float32, (None, 3, 9, 8))
    assert af.nn.conv2d(
        nchw, np.zeros((3, 3, 3, 4), np.float32), 2, "SAME", data_format="NCHW"
    ).shape.as_list() == [None, 4, 5, 4]
    y, mean, _var = af.nn.fused_batch_norm(x, *(np.ones(3, np.float32),) * 4, is_training=False)
    assert y.shape.as_list() == [None, 9, 8, 3]
    assert mean.shape.as_list() == [3]
    assert af.nn.bias_add(x, np.zeros(3, np.float32)).shape.as_list() == [None, 9, 8, 3]
    m = af.placeholder(af.float32, (4, 6))
    assert af.tile(m, [2, 3]).shape.as_list() == [8, 18]
    assert af.pad(m, [[1, 2], [0, 0]]).shape.as_list() == [7, 6]
    assert af.one_hot(af.placeholder(af.int32, (5,)), 3, axis=0).shape.as_list() == [3, 5]
    assert af.gather_nd(m, [[0, 1], [2, 3]]).shape.as_list() == [2]
    assert af.split(m, 3, axis=1)[0].shape.as_list() == [4, 2]
    assert af.unstack(m)[0].shape.as_list() == [6]
    assert af.slice(m, [1, 0], [2, -1]).shape.as_list() == [2, 6]
    assert af.nn.top_k(m, 2)[0].shape.as_list() == [4, 2]
    assert af.einsum("ij,jk->ik", m, af.placeholder(af.float32, (6, 2))).shape.as_list() == [4, 2]
    assert af.cumsum(m, 1).shape.as_list() == [4, 6]
    assert af.random_uniform([2, 3]).shape.as_list() == [2, 3]


@pytest.mark.parametrize(
    ("build", "error", "fragment"),
    [
        (
            lambda: af.nn.conv2d(
                af.placeholder(af.float32, (1, 4, 4)),
                np.zeros((1, 1, 1, 1), np.float32),
                1,
                "SAME",
                name="bad_conv",
            ),
            ValueError,
            "rank 4",
        ),
        (
            lambda: af.nn.conv2d(
                af.placeholder(af.float32, (1, 4, 4, 3)),
                np.zeros((1, 1, 2, 1), np.float32),
                1,
                "SAME",
                name="bad_conv",
            ),
            ValueError,
            "in_channels",
        ),
        (
            lambda: af.nn.conv2d(
                af.placeholder(af.float32, (1, 4, 4, 3)),
                af.constant(np.zeros((1, 1, 3, 1), np.float64)),
                1,
                "SAME",
                name="bad_conv",
            ),
            TypeError,
            "dtype",
        ),
        (
            lambda: af.nn.conv2d(
                af.placeholder(af.float32, (1, 4, 4, 3)),
                np.zeros((1, 1, 3, 1), np.float32),
                1,
                "FULL",
                name="bad_conv",
            ),
            ValueError,
            "padding",
        ),
        (
            lambda: af.nn.depthwise_conv2d(
                af.placeholder(af.float32, (1, 4, 4, 3)),
                np.zeros((1, 1, 2, 1), np.float32),
                [1, 1, 1, 1],
                "SAME",
                name="bad_dw",
            ),
            ValueError,
            "in_channels",
        ),
        (
            lambda: af.nn.conv2d_transpose(
                af.placeholder(af.float32, (2, 5, 4, 4)),
                np.zeros((3, 3, 3, 5), np.float32),
                [2, 9, 8, 3],
                2,
                name="bad_convt",
            ),
            ValueError,
            "out_channels",
        ),
        (
            lambda: af.nn.conv2d_transpose(
                af.placeholder(af.float32, (2, 5, 4, 4)),
                np.zeros((3, 3, 3, 4), np.float32),
                [2, 9, 8, 2],
                2,
                name="bad_convt",
            ),
            ValueError,
            "in_channels",
        ),
        (
            lambda: af.nn.max_pool(
                af.placeholder(af.float32, (4, 4)), 2, 2, "SAME", name="bad_pool"
            ),
            ValueError,
            "rank 4",
        ),
        (
            lambda: af.nn.avg_pool(
                af.placeholder(af.float32, (1, 4, 4, 1)), [2, 2, 2, 2], 1, "SAME", name="bad_pool"
            ),
            ValueError,
            "ksize",
        ),
        (
            lambda: af.nn.bias_add(
                af.placeholder(af.float32, (2, 3)), np.zeros(4, np.float32), name="bad_bias"
            ),
            ValueError,
            "channel",
        ),
        (
            lambda: af.nn.fused_batch_norm(
                af.placeholder(af.float32, (1, 2, 2, 3)),
                *(np.ones(4, np.float32),) * 4,
                is_training=False,
                name="bad_bn",
            ),
            ValueError,
            "channels",
        ),
        (
            lambda: af.nn.softmax_cross_entropy_with_logits(
                labels=np.zeros((2, 3), np.float32),
                logits=np.zeros((2, 4), np.float32),
                name="bad_xent",
            ),
            ValueError,
            "same shape",
        ),
        (
            lambda: af.nn.sparse_softmax_cross_entropy_with_logits(
                labels=np.zeros((2, 1), np.int32),
                logits=np.zeros((2, 4), np.float32),
                name="bad_xent",
            ),
            ValueError,
            "1-D",
        ),
        (lambda: af.nn.log_softmax(af.constant(1.0), name="bad_lsm"), ValueError, "rank"),
        (lambda: af.tile(np.zeros((2, 2)), [1, 2, 3], name="bad_tile"), ValueError, "multiples"),
        (
            lambda: af.pad(np.zeros((2, 2)), [[3, 0], [0, 0]], mode="REFLECT", name="bad_pad"),
            ValueError,
            "REFLECT",
        ),
        (lambda: af.split(np.zeros((2, 5)), 2, axis=1, name="bad_split"), ValueError, "divisible"),
        (lambda: af.unstack(np.zeros((2, 3)), num=3, name="bad_unstack"), ValueError, "unstack"),
        (
            lambda: af.slice(np.zeros((2, 3)), [1, 1], [2, 1], name="bad_slice"),
            ValueError,
            "out of range",
        ),
        (
            lambda: af.gather_nd(np.zeros((2, 3)), [[0, 1, 2]], name="bad_gnd"),
            ValueError,
            "exceeds",
        ),
        (lambda: af.reverse(np.zeros((2, 3)), [2], name="bad_rev"), ValueError, "out of range"),
        (lambda: af.nn.top_k(np.zeros((2, 3)), 4, name="bad_topk"), ValueError, "k = 4"),
        (
            lambda: af.einsum("ij,jk->ik", np.zeros((2, 3)), np.zeros((4, 2)), name="bad_einsum"),
            ValueError,
            "sizes",
        ),
        (lambda: af.cumsum(np.zeros((2, 3)), 2, name="bad_cumsum"), ValueError, "out of range"),
        (lambda: af.one_hot(np.zeros(2, np.float32), 3, name="bad_oh"), TypeError, "indices"),
        (lambda: af.erf(np.zeros(2, np.int32), name="bad_erf"), TypeError, "floating"),
        (lambda: af.Assert(np.zeros(2, bool), [1], name="bad_assert"), ValueError, "scalar"),
        (
            lambda: af.broadcast_to(np.zeros((2, 3)), [4, 3], name="bad_bcast"),
            ValueError,
            "cannot broadcast",
        ),
        (lambda: af.floor(np.zeros(2, np.int32), name="bad_floor"), TypeError, "floating"),
        (lambda: af.is_nan(np.zeros(2, np.int32), name="bad_isnan"), TypeError, "floating"),
        (
            lambda: af.strided_slice(
                np.zeros((2, 3)), [5], [6], [1], shrink_axis_mask=1, name="bad_ss"
            ),
            ValueError,
            "out of bounds",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_build_errors_name_the_op(
    graph: af.Graph, build: Any, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment) as info:
        build()
    assert "'bad_" in str(info.value)


# -- random ops: TF's seed rules ------------------------------------------------------------


def test_seeded_random_ops_give_tensorflows_numbers(graph: af.Graph) -> None:
    spec = json.loads((FIXTURES / "random.json").read_text())
    expected = np.load(FIXTURES / "random.npz")
    af.set_random_seed(spec["graph_seed"])
    outs = []
    for case in spec["cases"]:
        kwargs = dict(case["kwargs"])
        if "dtype" in kwargs:
            kwargs["dtype"] = af.as_dtype(kwargs["dtype"])
        outs.append(getattr(af, case["fn"])(**kwargs))
    with af.Session(graph=graph) as sess:
        for run in range(2):  # the second run continues each op's stream, as TF's
            for i, value in enumerate(sess.run_sync(outs)):
                want = expected[f"{i}/run{run}"]
                assert value.dtype == want.dtype
                # float32 log / sin / cos may round differently in the last bit.
                np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-6)
    with af.Session(graph=graph) as sess:  # a new session starts the streams over
        np.testing.assert_allclose(sess.run_sync(outs[0]), expected["0/run0"], rtol=1e-6)


def test_random_seed_rules(graph: af.Graph) -> None:
    from asyncflow.ops.random_ops import DEFAULT_GRAPH_SEED, get_seed

    assert get_seed(None) == (None, None)
    assert get_seed(5) == (DEFAULT_GRAPH_SEED, 5)
    af.set_random_seed(0)
    assert get_seed(0) == (0, 2**31 - 1)
    af.set_random_seed(3)
    n = len(graph.get_operations())
    assert get_seed(None) == (3, n)
    t = af.random_normal([2], seed=9)
    rnd = t.op.inputs[0].op.inputs[0].op  # Add(Mul(RandomStandardNormal, stddev), mean)
    assert rnd.type == "RandomStandardNormal"
    assert (rnd.get_attr("seed"), rnd.get_attr("seed2")) == (3, 9)


def _sample(graph_seed: int | None, op_seed: int | None, runs: int = 2) -> list[np.ndarray]:
    with af.Graph().as_default() as g:
        if graph_seed is not None:
            af.set_random_seed(graph_seed)
        t = af.random_uniform([4], seed=op_seed)
        with af.Session(graph=g) as sess:
            return [sess.run_sync(t) for _ in range(runs)]


def test_random_sequences_are_reproducible_per_seed() -> None:
    a, b = _sample(1, None), _sample(1, None)
    np.testing.assert_array_equal(a[0], b[0])  # same graph seed: same sequence
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], a[1])  # the op is stateful across runs
    assert not np.array_equal(_sample(2, None)[0], a[0])
    np.testing.assert_array_equal(_sample(None, 4)[0], _sample(None, 4)[0])
    assert not np.array_equal(_sample(None, None)[0], _sample(None, None)[0])
    assert all(0 <= v < 1 for v in a[0])


def test_random_distributions(graph: af.Graph) -> None:
    af.set_random_seed(11)
    n = af.random_normal([20000], mean=2.0, stddev=3.0)
    t = af.truncated_normal([20000], stddev=2.0)
    u = af.random_uniform([20000], -1.0, 5.0, dtype=af.float64)
    i = af.random_uniform([1000], 3, 7, dtype=af.int64)
    nv, tv, uv, iv = run([n, t, u, i])
    assert nv.dtype == np.float32
    assert uv.dtype == np.float64
    assert iv.dtype == np.int64
    assert abs(nv.mean() - 2.0) < 0.1
    assert abs(nv.std() - 3.0) < 0.1
    assert np.abs(tv).max() <= 4.0
    assert uv.min() >= -1.0
    assert uv.max() < 5.0
    assert set(np.unique(iv)) == {3, 4, 5, 6}
    assert n.op.inputs[0].op.inputs[0].op.stateful


# -- Print, Assert, map_fn ---------------------------------------------------------------


def test_print_passes_through_and_writes(
    graph: af.Graph, capfd: pytest.CaptureFixture[str]
) -> None:
    x = af.constant([1.0, 2.0, 3.0, 4.0])
    y = af.Print(x, [x, af.constant(b"tag")], message="x is ", summarize=2, first_n=1) * 2.0
    with af.Session(graph=graph) as sess:
        np.testing.assert_array_equal(sess.run_sync(y), [2, 4, 6, 8])
        sess.run_sync(y)
    err = capfd.readouterr().err
    assert err.count("x is [1 2...][tag]") == 1  # TF 1.x's format, byte for byte


def test_print_summarizes_as_tf(graph: af.Graph, capfd: pytest.CaptureFixture[str]) -> None:
    # The expected line is what TensorFlow 2.21's tf.compat.v1.Print wrote for these.
    x = af.constant(np.arange(12, dtype=np.float32).reshape(2, 2, 3) / 3)
    p = af.Print(
        x,
        [
            x,
            af.constant([True, False]),
            af.constant(5),
            af.constant(np.arange(3, dtype=np.float64) / 3),
            af.constant(np.zeros((0, 2))),
        ],
        message="m: ",
        summarize=5,
    )
    run(p)
    assert capfd.readouterr().err == (
        "m: [[[0 0.333333343 0.666666687][1 1.33333337...]]...][1 0][5]"
        "[0 0.33333333333333331 0.66666666666666663][]\n"
    )


def test_assert_fails_the_step_naming_it(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, (3,))
    check = af.Assert(af.reduce_all(x > 0), [x], name="positive")
    with af.control_dependencies([check]):
        y = af.identity(x)
    with af.Session(graph=graph) as sess:
        np.testing.assert_array_equal(sess.run_sync(y, {x: [1, 2, 3]}), [1, 2, 3])
        with pytest.raises(
            af.errors.InvalidArgumentError, match=r"assertion failed: \[1 -2 3\][\s\S]*positive"
        ):
            sess.run_sync(y, {x: [1, -2, 3]})
        np.testing.assert_array_equal(sess.run_sync(y, {x: [4, 5, 6]}), [4, 5, 6])


def test_map_fn(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, (None, 3))
    squares = af.map_fn(lambda row: af.reduce_sum(row * row), x)
    both = af.map_fn(lambda ab: (ab[0] + ab[1], ab[0] * 2), (x, x * 10.0))
    assert squares.shape.as_list() == [None]
    v = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = run([squares, *both], {x: v})
    np.testing.assert_allclose(out[0], (v * v).sum(axis=1))
    np.testing.assert_allclose(out[1], v * 11)
    np.testing.assert_allclose(out[2], v * 2)
    empty = run(squares, {x: np.zeros((0, 3), np.float32)})
    assert empty.shape == (0,)
    known = af.map_fn(lambda row: row[:2] * 2.0, af.constant(v))
    assert known.shape.as_list() == [4, 2]
    np.testing.assert_allclose(run(known), v[:, :2] * 2)


def test_new_ops_are_exported() -> None:
    for name in (
        "slice",
        "strided_slice",
        "split",
        "unstack",
        "tile",
        "pad",
        "one_hot",
        "zeros_like",
        "ones_like",
        "gather_nd",
        "boolean_mask",
        "clip_by_value",
        "reverse",
        "cumsum",
        "top_k",
        "einsum",
        "rsqrt",
        "erf",
        "reduce_any",
        "reduce_all",
        "logical_xor",
        "squared_difference",
        "random_uniform",
        "random_normal",
        "truncated_normal",
        "set_random_seed",
        "Print",
        "Assert",
        "map_fn",
        "floor",
        "ceil",
        "round",
        "sign",
        "reciprocal",
        "log1p",
        "expm1",
        "sin",
        "cos",
        "is_nan",
        "is_finite",
        "truncatediv",
        "truncatemod",
        "broadcast_to",
    ):
        assert name in af.__all__, name
    for name in (
        "conv2d",
        "conv2d_transpose",
        "depthwise_conv2d",
        "bias_add",
        "max_pool",
        "avg_pool",
        "relu6",
        "leaky_relu",
        "elu",
        "selu",
        "log_softmax",
        "fused_batch_norm",
        "softmax_cross_entropy_with_logits",
        "sparse_softmax_cross_entropy_with_logits",
        "l2_normalize",
        "softplus",
        "softsign",
    ):
        assert name in af.nn.__all__, name
