"""Graph serialization: as_graph_def / import_graph_def round trips and malformed input."""

from __future__ import annotations

import copy
import json
import math
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.framework.graph_def import FORMAT, decode_attr, encode_attr, import_graph_def


def double(x: np.ndarray) -> np.ndarray:
    """A module-level py_func body: serializable by reference."""
    return (x * 2).astype(x.dtype)


def _json_round_trip(graph_def: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(graph_def))  # type: ignore[no-any-return]


def _nodes_by_name(graph: af.Graph) -> dict[str, Any]:
    return {n["name"]: n for n in graph.as_graph_def()["node"]}


def _import_fresh(graph_def: dict[str, Any], **kwargs: Any) -> af.Graph:
    g = af.Graph()
    with g.as_default():
        import_graph_def(graph_def, **kwargs)
    return g


def _sample_graph() -> tuple[af.Graph, dict[str, Any]]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 3), name="x")
        w = af.constant(np.arange(6, dtype=np.float32).reshape(3, 2), name="w")
        init = af.no_op(name="init")
        with af.name_scope("layer"), af.control_dependencies([init]):
            y = af.matmul(x, w, name="y")
        with af.device("/cpu:1"):
            z = af.add(y, af.constant(1.0), name="z")
        s = af.reduce_sum(z, axis=1, name="s")
    return g, {"x": x, "y": y, "z": z, "s": s}


# -- round trips ----------------------------------------------------------------


def test_graph_def_is_json_and_round_trips_structure() -> None:
    g, _ = _sample_graph()
    graph_def = g.as_graph_def()
    assert graph_def["versions"] == {"producer": 1, "format": FORMAT}
    text = json.dumps(graph_def)
    g2 = _import_fresh(json.loads(text))
    assert _nodes_by_name(g2) == _nodes_by_name(g)
    y = g2.get_operation_by_name("layer/y")
    assert [t.name for t in y.inputs] == ["x:0", "w:0"]
    assert [c.name for c in y.control_inputs] == ["init"]
    assert g2.get_operation_by_name("z").device == "/cpu:1"
    assert tuple(g2.get_tensor_by_name("layer/y:0").shape) == (None, 2)


def test_input_spelling_is_tensorflow_style() -> None:
    g, _ = _sample_graph()
    node = _nodes_by_name(g)["layer/y"]
    assert node["input"] == ["x", "w", "^init"]
    assert node["op"] == "MatMul"


def test_import_accepts_any_node_order() -> None:
    g, _ = _sample_graph()
    graph_def = _json_round_trip(g.as_graph_def())
    graph_def["node"].reverse()
    g2 = _import_fresh(graph_def)
    assert _nodes_by_name(g2) == _nodes_by_name(g)


def test_import_with_prefix_and_return_elements() -> None:
    g, _ = _sample_graph()
    graph_def = _json_round_trip(g.as_graph_def())
    g2 = af.Graph()
    with g2.as_default():
        af.constant(0.0, name="x")  # would clash without a prefix
        with pytest.raises(ValueError, match=r"'x'.*already used"):
            import_graph_def(graph_def)
        elements = import_graph_def(graph_def, name="imported", return_elements=["s:0", "layer/y"])
    assert elements is not None
    s, y_op = elements
    assert isinstance(y_op, af.Operation)
    assert s.name == "imported/s:0"
    assert y_op.name == "imported/layer/y"
    assert [t.name for t in y_op.inputs] == ["imported/x:0", "imported/w:0"]
    assert import_graph_def(graph_def, name="again", graph=g2) is None


def test_import_with_input_map() -> None:
    g, _ = _sample_graph()
    graph_def = _json_round_trip(g.as_graph_def())
    g2 = af.Graph()
    with g2.as_default():
        feed = af.placeholder(af.float32, shape=(4, 3), name="feed")
        elements = import_graph_def(
            graph_def, name="m", input_map={"x:0": feed}, return_elements=["layer/y:0"]
        )
    assert elements is not None
    (y,) = elements
    assert isinstance(y, af.Tensor)
    assert y.op.inputs[0] is feed
    assert tuple(y.shape) == (4, 2)


def test_import_into_default_graph_via_public_name() -> None:
    g, _ = _sample_graph()
    g2 = af.Graph()
    with g2.as_default():
        assert af.import_graph_def(_json_round_trip(g.as_graph_def()), name="") is None
    assert len(g2.get_operations()) == len(g.get_operations())


# -- constants of every dtype are bit-exact ---------------------------------------

_NUMERIC_VALUES: list[tuple[str, np.ndarray]] = [
    ("float16", np.array([0.0, -0.0, 1.5, np.inf, -np.inf, np.nan, 65504.0], np.float16)),
    ("float32", np.array([[1e-45, -3.4e38], [np.nan, 0.1]], np.float32)),
    ("float64", np.array([np.pi, 5e-324, -0.0, np.nan], np.float64)),
    ("int8", np.array([-128, 0, 127], np.int8)),
    ("int16", np.array([-32768, 32767], np.int16)),
    ("int32", np.array([-(2**31), 2**31 - 1], np.int32)),
    ("int64", np.array([-(2**63), 2**63 - 1], np.int64)),
    ("uint8", np.array([0, 255], np.uint8)),
    ("bool", np.array([[True, False], [False, True]])),
    ("complex64", np.array([1 + 2j, np.nan - 1j], np.complex64)),
    ("complex128", np.array([[1e300 + 1e-300j]], np.complex128)),
    ("float32-0d", np.array(2.5, np.float32)),
    ("int64-0d", np.array(-7, np.int64)),
    ("float64-empty", np.zeros((0, 3), np.float64)),
    ("bool-empty", np.zeros((2, 0), bool)),
]


def _const_round_trip(value: np.ndarray, dtype: Any = None) -> np.ndarray:
    g = af.Graph()
    with g.as_default():
        af.constant(value, dtype=dtype, name="c")
    g2 = _import_fresh(_json_round_trip(g.as_graph_def()))
    op = g2.get_operation_by_name("c")
    assert op.get_attr("dtype") is g.get_operation_by_name("c").get_attr("dtype")
    return op.get_attr("value")  # type: ignore[no-any-return]


@pytest.mark.parametrize(("label", "value"), _NUMERIC_VALUES, ids=[v[0] for v in _NUMERIC_VALUES])
def test_numeric_constants_round_trip_bit_exact(label: str, value: np.ndarray) -> None:
    # A NaN with a payload must survive too.
    if value.dtype == np.float64 and value.size:
        value = value.copy()
        value.view(np.uint64)[-1] = 0x7FF8_0000_0000_BEEF
    out = _const_round_trip(value)
    assert out.dtype == value.dtype
    assert out.shape == value.shape
    assert out.tobytes() == value.tobytes()


@pytest.mark.parametrize(
    "value",
    [
        np.array([b"abc", b"", b"\x00\xff"], dtype=object),
        np.array([["unicode \u00e9\u4e2d", "x"]], dtype=object),
        np.array(b"scalar", dtype=object),
        np.zeros((0,), dtype=object),
    ],
    ids=["bytes", "str-2d", "0d", "empty"],
)
def test_string_constants_round_trip(value: np.ndarray) -> None:
    out = _const_round_trip(value, dtype=af.string)
    assert out.dtype == object
    assert out.shape == value.shape
    # String tensors hold bytes (as TF): str items are UTF-8 encoded when the constant is made.
    expected = [v.encode() if isinstance(v, str) else v for v in value.reshape(-1)]
    assert [(type(v), v) for v in out.reshape(-1)] == [(bytes, v) for v in expected]


def test_constant_run_results_match_after_round_trip() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.constant(np.array([[1.0, 2.0], [3.0, 4.0]], np.float64), name="a")
        b = af.constant(np.array([0.5, -1.0], np.float64), name="b")
        af.add(af.matmul(a, a), b, name="out")
    g2 = _import_fresh(_json_round_trip(g.as_graph_def()))
    with af.Session(graph=g) as s1, af.Session(graph=g2) as s2:
        r1 = s1.run_sync("out:0")
        r2 = s2.run_sync("out:0")
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(r1, np.array([[7.5, 9.0], [15.5, 21.0]]))


def test_sample_graph_runs_identically_after_round_trip() -> None:
    g, _ = _sample_graph()
    g2 = _import_fresh(_json_round_trip(g.as_graph_def()))
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    config = af.SessionConfig(device_count={"CPU": 2})
    with af.Session(graph=g, config=config) as s1, af.Session(graph=g2, config=config) as s2:
        r1 = s1.run_sync(["s:0", "z:0"], feed_dict={"x:0": data})
        r2 = s2.run_sync(["s:0", "z:0"], feed_dict={"x:0": data})
    for a, b in zip(r1, r2, strict=True):
        np.testing.assert_array_equal(a, b)


def test_reference_run_matches_after_round_trip() -> None:
    testing = pytest.importorskip("asyncflow.testing")
    g, _ = _sample_graph()
    g2 = _import_fresh(_json_round_trip(g.as_graph_def()))
    data = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    r1 = testing.reference_run(["s:0", "layer/y:0"], {"x:0": data}, graph=g)
    r2 = testing.reference_run(["s:0", "layer/y:0"], {"x:0": data}, graph=g2)
    for a, b in zip(r1, r2, strict=True):
        np.testing.assert_array_equal(a, b)


# -- attribute encoding ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -5,
        2**100,
        1.5,
        -0.0,
        1e308,
        "",
        "text \u2603",
        b"\x00bytes",
        1 + 2j,
        [1, "a", None],
        (1, (2.5, [3])),
        [],
        (),
        {"k": [1, 2], 3: (None,)},
        af.float16,
        af.string,
        af.complex128,
        af.TensorShape(None),
        af.TensorShape([None, 3]),
        af.TensorShape([]),
        np.float32(1.25),
        np.int8(-3),
        np.bool_(True),
        np.complex64(1j),
        np.float64(2.0),
        np.dtype("int16"),
        np.str_("npstr"),
    ],
)
def test_attr_values_round_trip_exactly(value: Any) -> None:
    encoded = json.loads(json.dumps(encode_attr(value)))
    out = decode_attr(encoded)
    assert type(out) is type(value)
    if isinstance(value, float) and value == 0:
        assert math.copysign(1, out) == math.copysign(1, value)
    assert out == value
    if isinstance(value, list | tuple):
        assert [type(v) for v in out] == [type(v) for v in value]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_round_trip_as_strict_json(value: float) -> None:
    text = json.dumps(encode_attr(value), allow_nan=False)
    out = decode_attr(json.loads(text))
    assert out == value or (math.isnan(out) and math.isnan(value))


def test_unserializable_attr_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="lambda or local function"):
        encode_attr(lambda x: x)

    def local(x: Any) -> Any:
        return x

    with pytest.raises(ValueError, match="lambda or local function"):
        encode_attr(local)
    with pytest.raises(TypeError, match="object"):
        encode_attr(object())


def test_callable_by_reference() -> None:
    assert encode_attr(np.negative) == {"func": "numpy:negative"}
    assert decode_attr({"func": "numpy:negative"}) is np.negative
    assert decode_attr({"func": "json:dumps"}) is json.dumps
    assert decode_attr(encode_attr(double)) is double
    for ref, match in [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("json:no_such_function", "no attribute 'no_such_function'"),
        ("json:<locals>.f", "lambda or local function"),
        ("json", "malformed callable reference"),
        ("json:__doc__", "non-callable"),
    ]:
        with pytest.raises(ValueError, match=match):
            decode_attr({"func": ref})


# -- py_func by reference ---------------------------------------------------------------


def test_py_func_round_trips_by_reference() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(3,), name="x")
        af.py_func(double, [x], af.float32, name="doubled")
    graph_def = _json_round_trip(g.as_graph_def())
    node = next(n for n in graph_def["node"] if n["name"] == "doubled")
    refs = [v["func"] for v in node["attr"].values() if isinstance(v, dict) and "func" in v]
    assert refs == [f"{__name__}:double"]
    g2 = _import_fresh(graph_def)
    data = np.array([1.0, 2.0, 3.5], np.float32)
    with af.Session(graph=g2) as sess:
        np.testing.assert_array_equal(sess.run_sync("doubled:0", feed_dict={"x:0": data}), data * 2)


def test_py_func_with_unresolvable_reference_fails_clearly() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(3,), name="x")
        af.py_func(double, [x], af.float32, name="doubled")
    graph_def = _json_round_trip(g.as_graph_def())
    node = next(n for n in graph_def["node"] if n["name"] == "doubled")
    for key, v in node["attr"].items():
        if isinstance(v, dict) and "func" in v:
            node["attr"][key] = {"func": "gone_module_xyz:double"}
    with pytest.raises(ValueError, match=r"'doubled'.*gone_module_xyz:double"):
        _import_fresh(graph_def)


def test_py_func_with_lambda_cannot_be_exported() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(3,), name="x")
        af.py_func(lambda v: v, [x], af.float32, name="anon")
    with pytest.raises(ValueError, match=r"'anon'.*lambda"):
        g.as_graph_def()


# -- malformed graph defs ---------------------------------------------------------------


def _valid_def() -> dict[str, Any]:
    g, _ = _sample_graph()
    return _json_round_trip(g.as_graph_def())


def _node(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in d["node"] if n["name"] == name)


def _mutate(fn: Any) -> dict[str, Any]:
    d = _valid_def()
    fn(d)
    return d


_MALFORMED: list[tuple[str, Any, str]] = [
    ("not-a-dict", lambda: [1, 2], "must be a dict"),
    ("no-node", lambda: {"versions": {}}, "no 'node' field"),
    ("node-not-list", lambda: {"node": {"a": 1}}, "'node' must be a list"),
    ("node-entry-not-dict", lambda: {"node": ["x"]}, "node #0 must be a dict"),
    (
        "bad-format",
        lambda: {"versions": {"format": "other/9"}, "node": []},
        "unsupported graph def format",
    ),
    ("missing-name", lambda: _mutate(lambda d: d["node"][0].pop("name")), "node #0"),
    ("missing-op", lambda: _mutate(lambda d: _node(d, "z").pop("op")), "'z'.*'op'"),
    (
        "unknown-op",
        lambda: _mutate(lambda d: _node(d, "z").update(op="NoSuchOp")),
        "'z'.*NoSuchOp.*not registered",
    ),
    (
        "missing-input",
        lambda: _mutate(lambda d: _node(d, "z")["input"].__setitem__(0, "ghost")),
        "'z'.*'ghost'",
    ),
    (
        "bad-index",
        lambda: _mutate(lambda d: _node(d, "z")["input"].__setitem__(0, "layer/y:7")),
        "'z'.*layer/y:7",
    ),
    (
        "malformed-input",
        lambda: _mutate(lambda d: _node(d, "z")["input"].__setitem__(0, "y:a")),
        "'z'.*malformed input",
    ),
    ("input-not-str", lambda: _mutate(lambda d: _node(d, "z")["input"].__setitem__(0, 3)), "'z'"),
    (
        "duplicate",
        lambda: _mutate(lambda d: d["node"].append(copy.deepcopy(_node(d, "z")))),
        "duplicate node name 'z'",
    ),
    (
        "attr-bad-tag",
        lambda: _mutate(lambda d: _node(d, "w")["attr"].update(value={"zz": 1})),
        "'w'.*attr 'value'.*unknown attribute tag",
    ),
    (
        "attr-bad-base64",
        lambda: _mutate(lambda d: _node(d, "w")["attr"]["value"]["array"].update(data="!!!")),
        "'w'.*base64",
    ),
    (
        "attr-byte-count",
        lambda: _mutate(
            lambda d: _node(d, "w")["attr"]["value"]["array"].update(shape=[1000, 1000])
        ),
        "'w'.*bytes of data do not match",
    ),
    ("attr-missing", lambda: _mutate(lambda d: _node(d, "w")["attr"].pop("value")), "'w'"),
    (
        "attr-wrong-type",
        lambda: _mutate(lambda d: _node(d, "w")["attr"].update(value={"i": 1})),
        "'w'",
    ),
    ("device-not-str", lambda: _mutate(lambda d: _node(d, "z").update(device=1)), "'z'.*device"),
    ("unknown-field", lambda: _mutate(lambda d: _node(d, "z").update(extra=1)), "'z'.*unknown"),
]


@pytest.mark.parametrize(("label", "make", "match"), _MALFORMED, ids=[m[0] for m in _MALFORMED])
def test_malformed_graph_def_is_a_value_error(label: str, make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _import_fresh(make())


def test_cycle_is_a_value_error_naming_it() -> None:
    d: dict[str, Any] = {
        "node": [
            {
                "name": "c",
                "op": "Const",
                "input": [],
                "attr": {
                    "value": encode_attr(np.float32(1.0) * np.ones(2, np.float32)),
                    "dtype": {"dtype": "float32"},
                },
            },
            {"name": "a", "op": "Identity", "input": ["b"]},
            {"name": "b", "op": "Identity", "input": ["a", "^c"]},
            {"name": "d", "op": "Identity", "input": ["c"]},
        ]
    }
    with pytest.raises(ValueError, match=r"cycle.*'a' -> 'b' -> 'a'"):
        _import_fresh(d)
    d["node"][1]["input"] = ["a"]
    with pytest.raises(ValueError, match="cycle through node 'a'"):
        _import_fresh(d)


def test_failed_validation_leaves_graph_untouched() -> None:
    d = _valid_def()
    _node(d, "z")["input"][0] = "ghost"
    g = af.Graph()
    with g.as_default(), pytest.raises(ValueError, match="'ghost'"):
        import_graph_def(d)
    assert g.get_operations() == []


def test_import_into_finalized_graph_is_a_runtime_error() -> None:
    g = af.Graph()
    g.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        import_graph_def(_valid_def(), graph=g)


def _chain(n: int) -> list[dict[str, Any]]:
    nodes = [
        {
            "name": "n0",
            "op": "Placeholder",
            "input": [],
            "attr": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2]}},
        }
    ]
    nodes.extend({"name": f"n{i}", "op": "Identity", "input": [f"n{i - 1}"]} for i in range(1, n))
    return nodes


def test_large_graph_imports_iteratively() -> None:
    n = 100_000
    nodes = _chain(n)
    nodes.reverse()  # worst case for a naive recursive importer
    start = time.perf_counter()
    g = _import_fresh({"node": nodes})
    assert len(g.get_operations()) == n
    assert g.get_operation_by_name(f"n{n - 1}").inputs[0].op.name == f"n{n - 2}"
    assert time.perf_counter() - start < 30


def test_large_cycle_is_detected_without_recursion() -> None:
    nodes = _chain(100_000)
    nodes[0] = {"name": "n0", "op": "Identity", "input": [nodes[-1]["name"]]}
    with pytest.raises(ValueError, match="cycle"):
        _import_fresh({"node": nodes})


# -- fuzzing: random mutations must give ValueError/TypeError, or import fine ------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*path, i)))
    return out


_BASE_DEF = _valid_def()
_BASE_PATHS = _paths(_BASE_DEF)


@st.composite
def _mutated_defs(draw: st.DrawFn) -> Any:
    d: Any = copy.deepcopy(_BASE_DEF)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(d)
        # Mostly mutate inside the def; replacing the whole def is one rare case.
        path = draw(st.sampled_from(paths[1:] or paths))
        action = draw(st.sampled_from(["replace", "delete", "copy", "swap-input"]))
        if not path:
            d = draw(_JSON)
            continue
        parent: Any = d
        try:
            for key in path[:-1]:
                parent = parent[key]
            last = path[-1]
            if action == "replace":
                parent[last] = draw(_JSON)
            elif action == "delete":
                del parent[last]
            elif action == "copy":
                other = draw(st.sampled_from(paths))
                src: Any = d
                for key in other:
                    src = src[key]
                parent[last] = copy.deepcopy(src)
            else:
                names = [n.get("name") for n in d["node"] if isinstance(n, dict)]
                parent[last] = draw(
                    st.sampled_from(
                        [
                            *[f"{m}" for m in names if isinstance(m, str)],
                            *[f"^{m}" for m in names if isinstance(m, str)],
                            "x:1",
                            "w:0",
                        ]
                    )
                )
        except (KeyError, IndexError, TypeError):
            continue
    return d


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_defs())
def test_fuzzed_graph_defs_fail_cleanly(graph_def: Any) -> None:
    g = af.Graph()
    try:
        with g.as_default():
            import_graph_def(graph_def)
    except (ValueError, TypeError, af.errors.InvalidArgumentError):
        # InvalidArgumentError: a dtype attr holding no valid dtype (as TF).
        pass
