"""The fast convolution and pooling kernels against straightforward loop references, and
the optimizer's convolution rewrites (batch norms folded, bias + activation fused).

The references loop over output pixels and compute TF's geometry on their own
(SAME: ``ceil(in / stride)`` outputs, the extra padding after), so the kernels'
im2col / 1x1 GEMM / einsum / strided-view paths are checked against independent code
on random shapes, strides, dilations and paddings.

This module checks numpy's kernels: oneDNN (the ``asyncflow[onednn]`` extra) is off
while it runs.  ``tests/test_onednn.py`` checks oneDNN's against the same references.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compiler.fold_batchnorm import FUSED_CONV
from asyncflow.compiler.ir import graph_ir, ref_of
from asyncflow.compiler.optimize import optimize
from asyncflow.compiler.placement import place
from asyncflow.compiler.prune import prune
from asyncflow.ops import onednn

DEVICES = ("/job:localhost/replica:0/task:0/device:CPU:0",)
L0 = af.SessionConfig(
    graph_options=af.GraphOptions(
        optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
    )
)


@pytest.fixture(autouse=True)
def _numpy_kernels() -> Iterator[None]:
    """numpy's convolution kernels, whether or not oneDNN is installed."""
    before = onednn.set_enabled(False)
    try:
        yield
    finally:
        onednn.set_enabled(before)


# -- references -------------------------------------------------------------------------


def _pads(size: int, k: int, s: int, d: int, padding: Any) -> tuple[int, int, int]:
    """(output size, pad before, pad after) as TF computes them."""
    ek = (k - 1) * d + 1
    if padding == "VALID":
        return max(math.ceil((size - ek + 1) / s), 0), 0, 0
    if padding == "SAME":
        out = math.ceil(size / s)
        total = max((out - 1) * s + ek - size, 0)
        return out, total // 2, total - total // 2
    before, after = padding
    return max((size + before + after - ek) // s + 1, 0), before, after


def _reference(
    x: np.ndarray,
    k: tuple[int, int],
    s: tuple[int, int],
    d: tuple[int, int],
    padding: Any,
    pad_value: float,
    reduce: Any,
    depth: int,
) -> np.ndarray:
    """``reduce(window (KH, KW, C))`` at every output pixel of NHWC ``x``."""
    n, h, w, _ = x.shape
    ph = padding if not isinstance(padding, list) else padding[0]
    pw = padding if not isinstance(padding, list) else padding[1]
    oh, top, bottom = _pads(h, k[0], s[0], d[0], ph)
    ow, left, right = _pads(w, k[1], s[1], d[1], pw)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=pad_value)
    valid = np.pad(np.ones((h, w)), ((top, bottom), (left, right)))
    rows = []
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                ii = i * s[0] + np.arange(k[0]) * d[0]
                jj = j * s[1] + np.arange(k[1]) * d[1]
                rows.append(reduce(xp[b][np.ix_(ii, jj)], valid[np.ix_(ii, jj)]))
    return np.array(rows, np.float64).reshape(n, oh, ow, depth)


def _run(y: af.Tensor, config: af.SessionConfig | None = None) -> np.ndarray:
    with af.Session(graph=y.graph, config=config) as sess:
        return np.asarray(sess.run_sync(y))


geometry = st.fixed_dictionaries(
    {
        "n": st.integers(1, 2),
        "h": st.integers(1, 8),
        "w": st.integers(1, 8),
        "c": st.integers(1, 4),
        "k": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "s": st.tuples(st.integers(1, 3), st.integers(1, 3)),
        "d": st.tuples(st.integers(1, 2), st.integers(1, 2)),
        "padding": st.one_of(
            st.sampled_from(["SAME", "VALID"]),
            st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=2, max_size=2),
        ),
        "nchw": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)


def _tf_padding(padding: Any, nchw: bool) -> Any:
    if isinstance(padding, str):
        return padding
    pairs = [[0, 0], list(padding[0]), list(padding[1]), [0, 0]]
    return [pairs[0], pairs[3], pairs[1], pairs[2]] if nchw else pairs


def _nhwc(y: np.ndarray, nchw: bool) -> np.ndarray:
    return np.transpose(y, (0, 2, 3, 1)) if nchw else y


@settings(max_examples=80, deadline=None)
@given(g=geometry, o=st.integers(1, 4))
def test_conv2d_matches_the_loop_reference(g: dict[str, Any], o: int) -> None:
    rng = np.random.default_rng(g["seed"])
    x = rng.standard_normal((g["n"], g["h"], g["w"], g["c"]))
    f = rng.standard_normal((*g["k"], g["c"], o))
    expected = _reference(
        x, g["k"], g["s"], g["d"], g["padding"], 0.0, lambda win, _: np.tensordot(win, f, 3), o
    )
    graph = af.Graph()
    with graph.as_default():
        fmt = "NCHW" if g["nchw"] else "NHWC"
        xin = np.transpose(x, (0, 3, 1, 2)) if g["nchw"] else x
        y = af.nn.conv2d(
            af.constant(xin),
            af.constant(f),
            list(g["s"]),
            _tf_padding(g["padding"], g["nchw"]),
            data_format=fmt,
            dilations=list(g["d"]),
        )
    np.testing.assert_allclose(_nhwc(_run(y, L0), g["nchw"]), expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(g=geometry, m=st.integers(1, 2))
def test_depthwise_conv2d_matches_the_loop_reference(g: dict[str, Any], m: int) -> None:
    rng = np.random.default_rng(g["seed"])
    x = rng.standard_normal((g["n"], g["h"], g["w"], g["c"]))
    f = rng.standard_normal((*g["k"], g["c"], m))
    expected = _reference(
        x,
        g["k"],
        g["s"],
        g["d"],
        g["padding"],
        0.0,
        lambda win, _: np.einsum("ijc,ijcm->cm", win, f).reshape(-1),
        g["c"] * m,
    )
    graph = af.Graph()
    with graph.as_default():
        fmt = "NCHW" if g["nchw"] else "NHWC"
        xin = np.transpose(x, (0, 3, 1, 2)) if g["nchw"] else x
        y = af.nn.depthwise_conv2d(
            af.constant(xin),
            af.constant(f),
            [1, *g["s"], 1] if not g["nchw"] else [1, 1, *g["s"]],
            _tf_padding(g["padding"], g["nchw"]),
            data_format=fmt,
            dilations=list(g["d"]),
        )
    np.testing.assert_allclose(_nhwc(_run(y, L0), g["nchw"]), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("shape", "k", "s", "d", "padding"),
    [
        ((2, 9, 8, 16), (3, 3), (1, 1), (1, 1), "SAME"),
        ((1, 9, 9, 5), (3, 3), (2, 1), (2, 2), "SAME"),
        ((3, 6, 7, 4), (5, 3), (1, 1), (1, 1), "VALID"),
        ((1, 4, 4, 130), (3, 3), (1, 1), (1, 1), "SAME"),
    ],
)
def test_depthwise_row_taps_equal_the_einsum(
    shape: tuple[int, ...],
    k: tuple[int, int],
    s: Any,
    d: Any,
    padding: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Below _EINSUM_CHANNELS channels a column-stride-1 depthwise convolution runs as
    # one multiply-add per tap over whole rows; the einsum path gives the same values.
    from asyncflow.ops import conv_ops

    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32)
    f = rng.standard_normal((*k, shape[3], 1)).astype(np.float32)
    graph = af.Graph()
    with graph.as_default():
        y = af.nn.depthwise_conv2d(
            af.constant(x), af.constant(f), [1, *s, 1], padding, dilations=list(d)
        )
    calls: list[str] = []
    rows = conv_ops._depthwise_rows

    def recorded(*args: Any) -> Any:
        calls.append("rows")
        return rows(*args)

    monkeypatch.setattr(conv_ops, "_depthwise_rows", recorded)
    outs = []
    for threshold in (1 << 20, 0):  # every depth on the row taps, then none
        monkeypatch.setattr(conv_ops, "_EINSUM_CHANNELS", threshold)
        outs.append(_run(y, L0))
    assert calls == ["rows"]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(g=geometry, kind=st.sampled_from(["max", "avg"]), padding=st.sampled_from(["SAME", "VALID"]))
def test_pooling_matches_the_loop_reference(g: dict[str, Any], kind: str, padding: str) -> None:
    rng = np.random.default_rng(g["seed"])
    x = rng.standard_normal((g["n"], g["h"], g["w"], g["c"]))
    if kind == "max":

        def reduce(win: np.ndarray, valid: np.ndarray) -> np.ndarray:
            return np.asarray(win.max(axis=(0, 1)))

        pad_value = -np.inf
    else:

        def reduce(win: np.ndarray, valid: np.ndarray) -> np.ndarray:
            return np.asarray(win.sum(axis=(0, 1)) / valid.sum())

        pad_value = 0.0
    expected = _reference(x, g["k"], g["s"], (1, 1), padding, pad_value, reduce, g["c"])
    graph = af.Graph()
    with graph.as_default():
        pool = af.nn.max_pool if kind == "max" else af.nn.avg_pool
        y = pool(af.constant(x), list(g["k"]), list(g["s"]), padding)
    np.testing.assert_allclose(_run(y, L0), expected, rtol=1e-9, atol=1e-9)


# -- the optimizer's rewrites -----------------------------------------------------------


def _optimized_types(y: af.Tensor, fetches: list[af.Tensor] | None = None) -> list[str]:
    ir = graph_ir(y.graph)
    refs = [ref_of(t) for t in (fetches or [y])]
    nodes = prune(ir, refs, (), [])
    out, _, _ = optimize(
        nodes, place(nodes, DEVICES, lookup=ir.by_name), devices=DEVICES, fetches=refs
    )
    return [n.op for n in out]


def _conv_bn_graph(
    depthwise: bool, keras_style: bool, activation: Any
) -> tuple[af.Graph, af.Tensor, af.Tensor, af.Tensor]:
    rng = np.random.default_rng(7)
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, [None, 9, 9, 4], name="x")
        if depthwise:
            f = rng.standard_normal((3, 3, 4, 2)).astype(np.float32)
            h = af.nn.depthwise_conv2d(x, af.constant(f), [1, 2, 2, 1], "SAME")
        else:
            f = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
            h = af.nn.conv2d(x, af.constant(f), 2, "SAME")
        gamma, beta, mean = (rng.standard_normal(8).astype(np.float32) for _ in range(3))
        var = rng.random(8).astype(np.float32) + 0.5
        if keras_style:  # as Keras 3 exports it: the scale is a constant after folding
            scale = af.constant(gamma) * af.rsqrt(af.constant(var) + 1e-3)
            bn = (h - af.constant(mean)) * scale + af.constant(beta)
        else:
            bn, _, _ = af.nn.fused_batch_norm(
                h, gamma, beta, mean, var, epsilon=1e-3, is_training=False
            )
        y = activation(af.nn.bias_add(bn, rng.standard_normal(8).astype(np.float32)))
    return graph, x, bn, y


@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("keras_style", [False, True])
@pytest.mark.parametrize("activation", [af.nn.relu, af.nn.relu6, af.identity])
def test_batch_norm_folds_and_bias_activation_fuse(
    depthwise: bool, keras_style: bool, activation: Any
) -> None:
    graph, x, _, y = _conv_bn_graph(depthwise, keras_style, activation)
    types = _optimized_types(y)
    assert not {"FusedBatchNormV3", "Sub", "Mul", "Conv2D", "DepthwiseConv2dNative"} & set(types), (
        types
    )
    assert types.count(FUSED_CONV) == 1
    feed = {x: np.random.default_rng(1).standard_normal((2, 9, 9, 4)).astype(np.float32)}
    with af.Session(graph=graph) as fast, af.Session(graph=graph, config=L0) as plain:
        np.testing.assert_allclose(
            fast.run_sync(y, feed), plain.run_sync(y, feed), rtol=1e-5, atol=1e-5
        )


def _residual_graph(
    dtype: Any, projection: bool, activation: Any
) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """A ResNet block's end: conv -> batch norm -> ``Add`` of the shortcut -> activation,
    the shortcut the block's input or (``projection``) a 1x1 convolution of it with its
    own batch norm, as ResNets' first blocks have."""
    rng = np.random.default_rng(3)
    graph = af.Graph()
    np_dtype = np.dtype(dtype.as_numpy_dtype)

    def bn(h: af.Tensor, o: int) -> af.Tensor:  # (as Keras exports it, any float dtype)
        scale, beta, mean = (rng.standard_normal(o).astype(np_dtype) for _ in range(3))
        return (h - af.constant(mean)) * af.constant(scale) + af.constant(beta)

    with graph.as_default():
        x = af.placeholder(dtype, [None, 7, 7, 6], name="x")
        f = rng.standard_normal((3, 3, 6, 6)).astype(np_dtype)
        main = bn(af.nn.conv2d(x, af.constant(f), 1, "SAME"), 6)
        shortcut = x
        if projection:
            p = rng.standard_normal((1, 1, 6, 6)).astype(np_dtype)
            shortcut = bn(af.nn.conv2d(x, af.constant(p), 1, "SAME"), 6)
        y = activation(af.add(main, shortcut, name="residual"))
    return graph, x, y


@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("activation", [af.nn.relu, af.nn.relu6, af.identity])
def test_a_residual_add_fuses_into_the_convolution(projection: bool, activation: Any) -> None:
    """The shortcut's ``Add`` (and the activation after it) joins one convolution's
    ``_FusedConv2D``, as TF's remapper fuses it; an ``Add`` of two convolutions joins one
    of them only.  The values are the unfused graph's."""
    graph, x, y = _residual_graph(af.float32, projection, activation)
    types = _optimized_types(y)
    assert not {"AddV2", "Add", "Relu", "Relu6"} & set(types), types
    assert types.count(FUSED_CONV) == 1 + projection, types
    feed = {x: np.random.default_rng(1).standard_normal((2, 7, 7, 6)).astype(np.float32)}
    with af.Session(graph=graph) as fast, af.Session(graph=graph, config=L0) as plain:
        np.testing.assert_allclose(
            fast.run_sync(y, feed), plain.run_sync(y, feed), rtol=1e-5, atol=1e-5
        )


def test_an_add_that_broadcasts_is_not_fused() -> None:
    """An ``Add`` whose other input broadcasts the sum to a larger shape is no residual."""
    rng = np.random.default_rng(4)
    with af.Graph().as_default() as graph:
        x = af.placeholder(af.float32, [1, 5, 5, 2], name="x")
        big = af.placeholder(af.float32, [3, 5, 5, 2], name="big")
        conv = af.nn.conv2d(
            x, af.constant(rng.standard_normal((3, 3, 2, 2)).astype(np.float32)), 1, "SAME"
        )
        y = af.nn.relu(af.add(af.nn.bias_add(conv, np.ones(2, np.float32)), big))
    types = _optimized_types(y)
    assert "Add" in types, types
    assert types.count(FUSED_CONV) == 1, types
    feed = {x: np.ones((1, 5, 5, 2), np.float32), big: np.ones((3, 5, 5, 2), np.float32)}
    with af.Session(graph=graph) as fast, af.Session(graph=graph, config=L0) as plain:
        np.testing.assert_allclose(fast.run_sync(y, feed), plain.run_sync(y, feed), rtol=1e-6)


def test_nothing_folds_through_a_fetched_value() -> None:
    graph, x, bn, y = _conv_bn_graph(False, False, af.nn.relu)
    conv = bn.op.inputs[0]
    types = _optimized_types(y, [conv, y])
    assert "FusedBatchNormV3" in types
    assert "Conv2D" in types
    # A fetched batch norm is the end of its chain: folded into the conv, still fetchable.
    assert "FusedBatchNormV3" not in _optimized_types(y, [bn, y])
    feed = {x: np.ones((1, 9, 9, 4), np.float32)}
    with af.Session(graph=graph) as fast, af.Session(graph=graph, config=L0) as plain:
        for fetches in ([conv, y], [bn, y]):
            for a, b in zip(fast.run_sync(fetches, feed), plain.run_sync(fetches, feed)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_filter_that_is_not_constant_is_not_folded() -> None:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, [1, 5, 5, 2])
        f = af.placeholder(af.float32, [1, 1, 2, 3])
        y = af.nn.conv2d(x, f, 1, "VALID") * af.constant(np.float32(2.0))
    assert "Mul" in _optimized_types(y)


@pytest.mark.parametrize("depthwise", [False, True])
def test_a_zero_pad_before_a_valid_convolution_becomes_its_padding(depthwise: bool) -> None:
    rng = np.random.default_rng(3)
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, [None, 8, 7, 3], name="x")
        padded = af.pad(x, [[0, 0], [0, 1], [1, 2], [0, 0]])
        f = af.constant(rng.standard_normal((3, 3, 3, 2)).astype(np.float32))
        y = (
            af.nn.depthwise_conv2d(padded, f, [1, 2, 2, 1], "VALID")
            if depthwise
            else af.nn.conv2d(padded, f, 2, "VALID")
        )
    assert "Pad" not in _optimized_types(y)
    assert "Pad" in _optimized_types(y, [padded, y])  # a fetched pad stays
    feed = {x: rng.standard_normal((2, 8, 7, 3)).astype(np.float32)}
    with af.Session(graph=graph) as fast, af.Session(graph=graph, config=L0) as plain:
        np.testing.assert_allclose(
            fast.run_sync(y, feed), plain.run_sync(y, feed), rtol=1e-5, atol=1e-5
        )


# -- run-time sizing ----------------------------------------------------------------------


def _unknown_batch_conv(kind: str, c: int, k: int, o: int, seed: int) -> tuple[Any, Any]:
    """A convolution of a placeholder whose batch is unknown (as every exported model's)."""
    rng = np.random.default_rng(seed)
    with af.Graph().as_default():
        x = af.placeholder(af.float64, [None, None, None, c], name="x")
        f = af.constant(rng.standard_normal((k, k, c, o if kind != "depthwise" else 1)))
        if kind == "depthwise":
            y = af.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME")
        elif kind == "fused":
            y = af.nn.relu(
                af.nn.bias_add(af.nn.conv2d(x, f, 1, "SAME"), af.constant(rng.standard_normal(o)))
            )
        else:
            y = af.nn.conv2d(x, f, 1, "SAME")
    return x, y


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int, bool]]:
    """Record, per convolution call: on the main thread?, its batch, and whether its
    GEMMs may boost BLAS (not when it is one part of a split batch)."""
    import threading

    from asyncflow.ops import conv_ops

    calls: list[tuple[bool, int, bool]] = []
    for name in ("_conv2d", "_depthwise"):
        real = getattr(conv_ops, name)

        def spy(x: np.ndarray, *args: Any, _real: Any = real) -> Any:
            calls.append(
                (
                    threading.current_thread() is threading.main_thread(),
                    x.shape[0],
                    not getattr(conv_ops._part, "active", False),
                )
            )
            return _real(x, *args)

        monkeypatch.setattr(conv_ops, name, spy)
    return calls


TWO_THREADS = af.SessionConfig(inter_op_parallelism_threads=2)


@pytest.mark.parametrize("kind", ["conv", "depthwise", "fused"])
def test_an_unknown_batch_is_sized_by_the_fed_input(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 runs inline on the loop; the same graph fed batch 8 crosses the threshold
    and runs on the device's worker threads, split in parts (one per thread, one BLAS
    thread each) when the device has two threads and the machine two cores."""
    from asyncflow.ops import conv_ops
    from asyncflow.runtime.devices import available_cores

    x, y = _unknown_batch_conv(kind, 4, 3, 4, seed=5)
    one = np.random.default_rng(0).standard_normal((1, 6, 6, 4))
    eight = np.repeat(one, 8, axis=0)
    per_image = 6 * 6 * 4 * 3 * 3 * (4 if kind != "depthwise" else 1)
    monkeypatch.setattr(conv_ops, "_EXPENSIVE_MACS", 4 * per_image)
    calls = _calls(monkeypatch)
    with af.Session(graph=y.graph, config=TWO_THREADS) as sess:
        small = sess.run_sync(y, {x: one})
        large = sess.run_sync(y, {x: eight})
        assert calls[0] == (True, 1, True)
        split = [(False, 4, False)] * 2 if available_cores() >= 2 else [(False, 8, True)]
        assert calls[1:] == split
        np.testing.assert_allclose(large, np.repeat(small, 8, axis=0), rtol=1e-12)
        # A batch of one above the threshold is one call on a thread (it may boost).
        del calls[:]
        monkeypatch.setattr(conv_ops, "_EXPENSIVE_MACS", per_image // 2)
        np.testing.assert_allclose(sess.run_sync(y, {x: one}), small, rtol=1e-12)
        assert calls == [(False, 1, True)]


def test_a_failing_part_of_a_split_batch_fails_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first part's error is the node's (not an exception group); the session stays
    usable."""
    from asyncflow.ops import conv_ops

    monkeypatch.setattr(conv_ops, "_EXPENSIVE_MACS", 1)
    with af.Graph().as_default() as graph:
        x = af.placeholder(af.float64, [None, None, None, None], name="x")
        y = af.nn.conv2d(x, af.constant(np.ones((3, 3, 4, 2))), 1, "SAME", name="conv")
    with af.Session(graph=graph, config=TWO_THREADS) as sess:
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match=r"(?s)^ValueError: input depth 3 does not match.*node conv ",
        ):
            sess.run_sync(y, {x: np.ones((8, 5, 5, 3))})
        assert sess.run_sync(y, {x: np.ones((8, 5, 5, 4))}).shape == (8, 5, 5, 2)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["conv", "depthwise", "fused"]),
    n=st.integers(1, 3),
    h=st.integers(1, 6),
    c=st.integers(1, 3),
    k=st.integers(1, 3),
    threshold=st.integers(1, 400),
    seed=st.integers(0, 2**16),
)
def test_run_time_sized_convolutions_match_the_static_ones(
    kind: str, n: int, h: int, c: int, k: int, threshold: int, seed: int
) -> None:
    """Whichever side of the threshold the fed input falls, the result is the kernel's:
    the same graph with static shapes (constants) is the oracle."""
    from asyncflow.ops import conv_ops

    x, y = _unknown_batch_conv(kind, c, k, 2, seed)
    feed = np.random.default_rng(seed).standard_normal((n, h, h + 1, c))
    with af.Session(graph=y.graph, config=L0) as sess:
        static = sess.run_sync(y, {x: feed})  # L0 folds nothing: shapes stay unknown
    saved = conv_ops._EXPENSIVE_MACS
    conv_ops._EXPENSIVE_MACS = threshold
    try:
        with af.Session(graph=y.graph) as sess:
            got = sess.run_sync(y, {x: feed})
    finally:
        conv_ops._EXPENSIVE_MACS = saved
    np.testing.assert_allclose(got, static, rtol=1e-12, atol=1e-12)


def test_a_split_batch_splits_its_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused convolution with a residual, split across the device's threads, cuts the
    residual along the batch with its input (each part adds its own images' shortcut)."""
    from asyncflow.ops import conv_ops
    from asyncflow.runtime.devices import available_cores

    graph, x, y = _residual_graph(af.float64, False, af.nn.relu)
    feed = {x: np.random.default_rng(2).standard_normal((8, 7, 7, 6))}
    with af.Session(graph=graph, config=L0) as sess:
        expected = sess.run_sync(y, feed)
    monkeypatch.setattr(conv_ops, "_EXPENSIVE_MACS", 1)
    calls = _calls(monkeypatch)
    with af.Session(graph=graph, config=TWO_THREADS) as sess:
        np.testing.assert_allclose(sess.run_sync(y, feed), expected, rtol=1e-12)
    if available_cores() >= 2:
        assert [batch for _, batch, _ in calls] == [4, 4]


def test_run_time_sizing_keeps_static_decisions() -> None:
    """A convolution whose shapes are all known is decided once, when the plan is made
    (no sizing per run); so is one whose images are too small for any batch to need a
    thread."""
    from asyncflow.framework import registry

    with af.Graph().as_default():
        x = af.placeholder(af.float32, [1, 8, 8, 4])
        y = af.nn.conv2d(x, af.constant(np.ones((3, 3, 4, 4), np.float32)), 1, "SAME")
        # Only the batch free, small images: inline at any batch (the plan keeps the
        # executor's all-inline path).
        z = af.nn.conv2d(
            af.placeholder(af.float32, [None, 8, 8, 4]),
            af.constant(np.ones((3, 3, 4, 4), np.float32)),
            1,
            "SAME",
        )
        # Images below the threshold of which four would cross it.
        big = af.nn.conv2d(
            af.placeholder(af.float32, [None, 32, 32, 64]),
            af.constant(np.ones((3, 3, 64, 8), np.float32)),
            1,
            "SAME",
        )
        free = af.nn.conv2d(
            af.placeholder(af.float32, [None, None, None, 4]),
            af.constant(np.ones((3, 3, 4, 4), np.float32)),
            1,
            "SAME",
        )
    kdef = registry.get_kernel("Conv2D", "CPU")
    assert kdef.instantiate(y.op)[1] == registry.INLINE
    assert kdef.instantiate(z.op)[1] == registry.INLINE
    assert 32 * 32 * 8 * 9 * 64 < 1 << 24 <= 32 * 32 * 8 * 9 * 64 * 4
    assert kdef.instantiate(big.op)[1] == registry.ASYNC
    assert kdef.instantiate(free.op)[1] == registry.ASYNC


@pytest.mark.parametrize("channels", [3, 16, 70])
def test_per_channel_rows_equal_the_broadcast(
    channels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Below ROW_CHANNELS an NHWC batch norm and a fused convolution's bias go row by row
    # (the per-channel vectors tiled along a row); the values are the broadcast's.
    from asyncflow.ops import nn_ops

    rng = np.random.default_rng(12)
    f = rng.standard_normal((3, 3, 3, channels)).astype(np.float32)
    vec = [rng.standard_normal(channels).astype(np.float32) for _ in range(5)]
    graph = af.Graph()
    with graph.as_default():
        image = af.placeholder(af.float32, (None, 5, 6, 3))
        conv = af.nn.conv2d(image, af.constant(f), [1, 1, 1, 1], "SAME")
        fused = af.nn.relu(af.nn.bias_add(conv, af.constant(vec[0])))
        xin = af.placeholder(af.float32, (None, None, None, channels))
        bn, _, _ = af.nn.fused_batch_norm(
            xin,
            af.constant(vec[1]),
            af.constant(vec[2]),
            mean=af.constant(vec[3]),
            variance=af.constant(np.abs(vec[4]) + 0.5),
            is_training=False,
        )
    feed = {
        image: rng.standard_normal((2, 5, 6, 3)).astype(np.float32),
        xin: rng.standard_normal((2, 4, 5, channels)).astype(np.float32),
    }
    outs = []
    for threshold in (1 << 20, 0):  # every depth row by row, then none
        monkeypatch.setattr(nn_ops, "ROW_CHANNELS", threshold)
        with af.Session(graph=graph) as sess:
            outs.append(sess.run_sync([fused, bn], feed))
    assert FUSED_CONV in _optimized_types(fused)
    for rows, broadcast in zip(outs[0], outs[1], strict=True):
        np.testing.assert_array_equal(rows, broadcast)
