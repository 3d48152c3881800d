"""TensorFlow GraphDef protobuf import and export (``af.compat``).

The graphs in ``tests/fixtures/tf`` were frozen by real TensorFlow 1.x-style code
(``make_fixtures.py``) together with their inputs and TF's outputs; these tests never
import TensorFlow.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compat import export_tf_graph_def, import_tf_graph_def, supported_tf_op_types
from asyncflow.compat._tf_proto import messages

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "tf"
GRAPHS = ["cnn", "mlp_bn", "control_flow", "array_ops"]


def _fixture(name: str) -> tuple[dict[str, Any], Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text()), np.load(FIXTURES / f"{name}.npz")


def _run_and_compare(g: af.Graph, name: str, prefix: str = "") -> None:
    spec, data = _fixture(name)
    feeds = {prefix + k: data[f"feed/{k}"] for k in spec["feeds"]}
    with af.Session(graph=g) as sess:
        outs = sess.run_sync([prefix + f for f in spec["fetches"]], feed_dict=feeds)
    for fetch, value in zip(spec["fetches"], outs):
        expected = data[f"fetch/{fetch}"]
        assert np.asarray(value).dtype == expected.dtype, fetch
        assert np.shape(value) == expected.shape, fetch
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6, err_msg=fetch)


@pytest.mark.parametrize("name", GRAPHS)
def test_frozen_tf_graph_runs_with_tf_outputs(name: str) -> None:
    g = af.Graph()
    with g.as_default():
        assert import_tf_graph_def(FIXTURES / f"{name}.pb") is None
    _run_and_compare(g, name, prefix="import/")


@pytest.mark.parametrize("name", ["cnn", "mlp_bn", "array_ops", "control_flow"])
def test_imported_graphs_survive_the_json_graph_def(name: str) -> None:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(FIXTURES / f"{name}.pb", name="")
    g2 = af.Graph()
    with g2.as_default():
        af.import_graph_def(json.loads(json.dumps(g.as_graph_def())))
    _run_and_compare(g2, name)


def test_every_fixture_op_type_is_supported() -> None:
    for name in GRAPHS:
        spec, _ = _fixture(name)
        assert set(spec["op_types"]) <= set(supported_tf_op_types()), name


def test_image_classifier_details() -> None:
    g = af.Graph()
    with g.as_default():
        elements = import_tf_graph_def(
            (FIXTURES / "cnn.pb").read_bytes(), name="", return_elements=["images:0", "probs:0"]
        )
    assert elements is not None
    images, probs = elements
    assert isinstance(images, af.Tensor)
    assert isinstance(probs, af.Tensor)
    assert images.shape.as_list() == [None, 16, 16, 3]
    assert probs.shape.as_list() == [None, 10]
    types = {op.type for op in g.get_operations()}
    assert {
        "Conv2D",
        "DepthwiseConv2dNative",
        "FusedBatchNormV3",
        "MaxPool",
        "AvgPool",
        "BiasAdd",
        "Relu6",
        "Softmax",
    } <= types
    _run_and_compare(g, "cnn")


def test_text_format_and_loops() -> None:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(str(FIXTURES / "control_flow.pbtxt"), name="cf")
    types = {op.type for op in g.get_operations()}
    assert {"Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond"} <= types
    _run_and_compare(g, "control_flow", prefix="cf/")
    with af.Session(graph=g) as sess:  # a different trip count: the loop really iterates
        n, acc = sess.run_sync(
            ["cf/iterations:0", "cf/acc:0"], {"cf/n:0": 2, "cf/x:0": [1.0, 0.0, 0.0]}
        )
    assert n == 2
    np.testing.assert_allclose(acc, [2.5, 0, 0])


def test_name_prefix_is_uniquified_like_tf() -> None:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(FIXTURES / "mlp_bn.pb")
        import_tf_graph_def(FIXTURES / "mlp_bn.pb")
    names = {op.name for op in g.get_operations()}
    assert "import/x" in names
    assert "import_1/x" in names
    _run_and_compare(g, "mlp_bn", prefix="import_1/")


def test_input_map_and_return_elements() -> None:
    _spec, data = _fixture("mlp_bn")
    g = af.Graph()
    with g.as_default():
        raw = af.placeholder(af.float32, (None, 10), name="raw")
        x = raw * 2.0
        elements = import_tf_graph_def(
            FIXTURES / "mlp_bn.pb",
            input_map={"x:0": x},
            return_elements=["embedding:0", "embedding"],
        )
    assert elements is not None
    emb, op = elements
    assert isinstance(op, af.Operation)
    assert op.name == "import/embedding"
    with af.Session(graph=g) as sess:
        out = sess.run_sync(emb, {raw: data["feed/x:0"] / 2.0})
    np.testing.assert_allclose(out, data["fetch/embedding:0"], rtol=1e-5, atol=1e-6)
    with g.as_default():
        with pytest.raises(ValueError, match=r"not found in graph_def.*nope"):
            import_tf_graph_def(FIXTURES / "mlp_bn.pb", input_map={"nope:0": x})
        with pytest.raises(ValueError, match="return_element 'missing:0' not found"):
            import_tf_graph_def(FIXTURES / "mlp_bn.pb", return_elements=["missing:0"])


def _graph_def(*nodes: tuple[str, str, list[str], dict[str, Any]]) -> bytes:
    m = messages()
    gd = m.GraphDef()
    for name, op, inputs, attrs in nodes:
        nd = gd.node.add(name=name, op=op)
        nd.input.extend(inputs)
        for key, value in attrs.items():
            if key == "dtype":
                nd.attr[key].type = value
            elif key == "value":
                nd.attr[key].tensor.CopyFrom(value)
    data: bytes = gd.SerializeToString()
    return data


def test_unsupported_op_types_are_listed_with_counts() -> None:
    data = _graph_def(
        ("a", "Placeholder", [], {"dtype": 1}),
        ("b", "Conv3D", ["a", "a"], {}),
        ("c", "Conv3D", ["b", "a"], {}),
        ("d", "HashTableV2", [], {}),
        ("e", "Relu", ["c"], {}),
    )
    g = af.Graph()
    with g.as_default(), pytest.raises(af.errors.UnimplementedError) as info:
        import_tf_graph_def(data)
    assert "Conv3D (x2), HashTableV2 (x1)" in str(info.value)
    assert g.get_operations() == []


@pytest.mark.parametrize(
    ("data", "error", "fragment"),
    [
        (b"\xff\xff\xff", af.errors.DataLossError, "cannot parse"),
        (b"\x0a\x05\x0a\x01", af.errors.DataLossError, "cannot parse"),
    ],
)
def test_malformed_bytes(data: bytes, error: type[Exception], fragment: str) -> None:
    with af.Graph().as_default(), pytest.raises(error, match=fragment):
        import_tf_graph_def(data)


def test_malformed_graphs_name_the_node() -> None:
    m = messages()
    short = m.TensorProto(dtype=1, tensor_content=b"\x00\x00\x80\x3f")
    short.tensor_shape.dim.add(size=3)
    cases = [
        (
            _graph_def(("k", "Const", [], {"value": short, "dtype": 1})),
            af.errors.DataLossError,
            "'k'.*4 bytes",
        ),
        (_graph_def(("r", "Relu", ["ghost"], {})), af.errors.InvalidArgumentError, "'r'.*'ghost'"),
        (
            _graph_def(("a", "Placeholder", [], {"dtype": 1}), ("a", "Relu", ["a"], {})),
            af.errors.InvalidArgumentError,
            "two nodes named 'a'",
        ),
        (
            _graph_def(("a", "Relu", ["b"], {}), ("b", "Relu", ["a"], {})),
            af.errors.InvalidArgumentError,
            "cycle",
        ),
        (
            _graph_def(("a", "Placeholder", [], {"dtype": 1}), ("s", "Sum", ["a", "a"], {})),
            af.errors.UnimplementedError,
            "'s'.*constant",
        ),
        (
            _graph_def(
                ("a", "Placeholder", [], {"dtype": 7}),
                ("b", "Placeholder", [], {"dtype": 1}),
                ("c", "AddV2", ["a", "b"], {}),
            ),
            af.errors.InvalidArgumentError,
            "'c'.*dtype",
        ),
        (
            _graph_def(("a", "Placeholder", [], {"dtype": 20})),
            af.errors.UnimplementedError,
            "DT_RESOURCE",
        ),
    ]
    for data, error, fragment in cases:
        with af.Graph().as_default(), pytest.raises(error, match=fragment):
            import_tf_graph_def(data)


def test_a_failing_node_leaves_the_graph_unchanged() -> None:
    m = messages()
    w = m.TensorProto(dtype=1, float_val=[1.0])
    for d in (1, 1, 2, 1):  # in_channels 2: does not fit an input of depth 3
        w.tensor_shape.dim.add(size=d)
    gd = m.GraphDef()
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = 1
    for d in (1, 4, 4, 3):
        x.attr["shape"].shape.dim.add(size=d)
    k = gd.node.add(name="w", op="Const")
    k.attr["dtype"].type = 1
    k.attr["value"].tensor.CopyFrom(w)
    conv = gd.node.add(name="conv", op="Conv2D", input=["x", "w"])
    conv.attr["T"].type = 1
    conv.attr["strides"].list.i.extend([1, 1, 1, 1])
    conv.attr["padding"].s = b"SAME"
    g = af.Graph()
    with g.as_default():
        before = af.constant(1.0, name="before")
        with pytest.raises(af.errors.InvalidArgumentError, match=r"'conv'.*in_channels"):
            import_tf_graph_def(gd.SerializeToString())
    assert g.get_operations() == [before.op]
    with af.Session(graph=g) as sess:  # the graph (and a session on it) stay usable
        assert sess.run_sync(before) == 1.0


def test_compact_and_typed_tensor_values() -> None:
    m = messages()
    fill = m.TensorProto(dtype=1, float_val=[1.5, 2.0])
    fill.tensor_shape.dim.add(size=4)
    half = m.TensorProto(dtype=19, half_val=[int(np.float16(0.5).view(np.uint16))])
    strings = m.TensorProto(dtype=7, string_val=[b"a", b"bc"])
    strings.tensor_shape.dim.add(size=2)
    flags = m.TensorProto(dtype=10, bool_val=[True])
    data = _graph_def(
        ("f", "Const", [], {"value": fill, "dtype": 1}),
        ("h", "Const", [], {"value": half, "dtype": 19}),
        ("s", "Const", [], {"value": strings, "dtype": 7}),
        ("b", "Const", [], {"value": flags, "dtype": 10}),
    )
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(data, name="")
    with af.Session(graph=g) as sess:
        f, h, s, b = sess.run_sync(["f:0", "h:0", "s:0", "b:0"])
    np.testing.assert_array_equal(f, [1.5, 2.0, 2.0, 2.0])
    assert h == np.float16(0.5)
    assert h.dtype == np.float16
    assert list(s) == [b"a", b"bc"]
    assert b is np.True_


def test_integer_div_truncates_as_tf() -> None:
    m = messages()
    a = m.TensorProto(dtype=3, int_val=[7, -7, 7, -7])
    a.tensor_shape.dim.add(size=4)
    b = m.TensorProto(dtype=3, int_val=[2, 2, -2, -2])
    b.tensor_shape.dim.add(size=4)
    data = _graph_def(
        ("a", "Const", [], {"value": a, "dtype": 3}),
        ("b", "Const", [], {"value": b, "dtype": 3}),
        ("q", "Div", ["a", "b"], {}),
    )
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(data, name="")
    assert g.get_operation_by_name("q").type == "TruncateDiv"
    with af.Session(graph=g) as sess:
        np.testing.assert_array_equal(sess.run_sync("q:0"), [3, -3, -3, 3])


def test_devices_and_colocation() -> None:
    m = messages()
    gd = m.GraphDef()
    a = gd.node.add(
        name="a", op="Placeholder", device="/job:localhost/replica:0/task:0/device:CPU:1"
    )
    a.attr["dtype"].type = 1
    gpu = gd.node.add(name="g", op="Relu", device="/device:GPU:0", input=["a"])
    gpu.attr["T"].type = 1
    col = gd.node.add(name="c", op="Neg", input=["g"])
    col.attr["_class"].list.s.append(b"loc:@a")
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(gd.SerializeToString(), name="p")
    assert g.get_operation_by_name("p/a").device.endswith("CPU:1")
    assert g.get_operation_by_name("p/g").device == ""  # unknown devices: soft placement
    assert g.get_operation_by_name("p/c").get_attr("_class") == ["loc:@p/a"]
    config = af.SessionConfig(device_count={"CPU": 2})
    with af.Session(graph=g, config=config) as sess:
        np.testing.assert_array_equal(sess.run_sync("p/c:0", {"p/a:0": [1.0, -2.0]}), [-1, 0])


def test_protobuf_is_not_needed_to_import_asyncflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['google.protobuf'] = None; import asyncflow as af; "
        "import asyncflow.compat; print('ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=pathlib.Path(__file__).parent.parent,
    )
    assert proc.stdout.strip() == "ok", proc.stderr


# -- export ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GRAPHS)
def test_export_round_trip(name: str) -> None:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(FIXTURES / f"{name}.pb", name="")
    data = export_tf_graph_def(g)
    g2 = af.Graph()
    with g2.as_default():
        import_tf_graph_def(data, name="")
    _run_and_compare(g2, name)


def test_export_of_a_built_graph_has_tf_type_attrs() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (None, 8, 8, 3), name="x")
        y = af.nn.conv2d(x, np.ones((3, 3, 3, 4), np.float32), 1, "SAME", name="conv")
        z = af.reduce_mean(y, axis=[1, 2], name="z")
        _i, acc = af.while_loop(
            lambda i, a: i < 3, lambda i, a: (i + 1, a + 1.0), (af.constant(0), z)
        )
        af.identity(acc, name="acc")
        af.identity(x[:, 1:3, ..., 0], name="sl")
    gd = messages().GraphDef()
    gd.ParseFromString(export_tf_graph_def(g))
    nodes = {n.name: n for n in gd.node}
    assert nodes["conv"].op == "Conv2D"
    assert nodes["conv"].attr["T"].type == 1
    assert nodes["z"].op == "Mean"
    assert list(nodes["z"].input) == ["conv", "z/reduction_indices"]
    assert nodes["x"].attr["shape"].shape.dim[0].size == -1
    merges = [n for n in gd.node if n.op == "Merge"]
    assert merges
    assert all(n.attr["N"].i == 2 for n in merges)
    xv = np.random.default_rng(0).random((2, 8, 8, 3)).astype(np.float32)
    with af.Session(graph=g) as sess:
        expected = sess.run_sync(["acc:0", "sl:0"], {"x:0": xv})
    g2 = af.Graph()
    with g2.as_default():
        import_tf_graph_def(gd.SerializeToString(), name="")
    with af.Session(graph=g2) as sess:
        got = sess.run_sync(["acc:0", "sl:0"], {"x:0": xv})
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_export_refuses_ops_without_tf_twin() -> None:
    async def remote(v: Any) -> Any:
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (), name="x")
        af.py_func(lambda v: v, [x], af.float32, name="local_fn")
        af.py_func(remote, [x], af.float32, name="remote_fn")
        af.Variable(1.0, name="v")
    with pytest.raises(
        af.errors.UnimplementedError,
        match=r"'local_fn' \(PyFunc\).*'remote_fn'.*'v' \(VariableV2\)",
    ):
        export_tf_graph_def(g)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_graphs_fail_cleanly(data: st.DataObject) -> None:
    """Flipped, cut or inserted bytes: either the graph imports, or a clear error — never
    another exception type, a crash or a hang."""
    raw = bytearray((FIXTURES / data.draw(st.sampled_from(GRAPHS)).__add__(".pb")).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del raw[i:]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        if not raw:
            break
    with af.Graph().as_default():
        try:
            import_tf_graph_def(bytes(raw))
        except (af.errors.OpError, ValueError, TypeError):
            pass
