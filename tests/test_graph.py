"""Graph building: names, scopes, control deps, devices, finalize, errors, Tensor API."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

import asyncflow as af


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


# -- names -------------------------------------------------------------------------------


def test_default_names_are_made_unique(g: af.Graph) -> None:
    a = af.constant(1.0)
    b = af.constant(2.0)
    assert (a.op.name, b.op.name) == ("Const", "Const_1")
    s1, s2, s3 = a + b, a + b, af.add(a, b)
    # As TensorFlow, uniqueness ignores case: "Add" collides with "add".
    assert (s1.op.name, s2.op.name, s3.op.name) == ("add", "add_1", "Add_2")
    assert s1.name == "add:0"


def test_explicit_names_and_collisions(g: af.Graph) -> None:
    x = af.constant(1.0, name="x")
    x1 = af.constant(1.0, name="x")
    assert (x.op.name, x1.op.name) == ("x", "x_1")
    # A name that looks like a generated one does not steal the next suffix.
    taken = af.constant(1.0, name="y_1")
    y, y_again = af.constant(1.0, name="y"), af.constant(1.0, name="y")
    assert taken.op.name == "y_1"
    assert y.op.name == "y"
    assert y_again.op.name == "y_2"


@pytest.mark.parametrize("bad", ["a:b", "^x", "/x"])
def test_invalid_names(g: af.Graph, bad: str) -> None:
    with pytest.raises(ValueError, match="valid op name"):
        af.constant(1.0, name=bad)


def test_unique_name(g: af.Graph) -> None:
    af.constant(1.0, name="u")
    assert g.unique_name("u", mark_as_used=False) == "u_1"
    assert g.unique_name("u", mark_as_used=False) == "u_1"
    assert g.unique_name("u") == "u_1"
    assert g.unique_name("u") == "u_2"


# -- name scopes -----------------------------------------------------------------------------


def test_name_scopes(g: af.Graph) -> None:
    with af.name_scope("outer") as outer:
        assert outer == "outer/"
        a = af.constant(1.0, name="a")
        with af.name_scope("inner"):
            b = a * 2.0
        with af.name_scope("inner"):
            c = a * 3.0
    with af.name_scope("outer"):
        d = af.constant(1.0)
    assert a.op.name == "outer/a"
    assert b.op.name == "outer/inner/mul"
    assert c.op.name == "outer/inner_1/mul"
    assert d.op.name == "outer_1/Const"


def test_name_scope_reentry_and_reset(g: af.Graph) -> None:
    with af.name_scope("s") as scope:
        pass
    with af.name_scope(scope):
        a = af.constant(1.0, name="a")
    with af.name_scope("s"), af.name_scope(None):
        b = af.constant(1.0, name="b")
    with af.name_scope(None, default_name="dflt"):
        c = af.constant(1.0, name="c")
    assert (a.op.name, b.op.name, c.op.name) == ("s/a", "b", "dflt/c")


def test_name_scopes_are_per_thread(g: af.Graph) -> None:
    names: list[str] = []

    def build() -> None:
        with g.as_default():
            names.append(af.constant(1.0, name="t").op.name)

    with af.name_scope("main"):
        thread = threading.Thread(target=build)
        thread.start()
        thread.join()
    assert names == ["t"]


# -- control dependencies ----------------------------------------------------------------


def test_control_dependencies(g: af.Graph) -> None:
    a = af.no_op(name="a")
    b = af.constant(1.0, name="b")
    with af.control_dependencies([a]):
        c = af.constant(2.0, name="c")
        with af.control_dependencies([b]):  # a Tensor stands for its op
            d = af.constant(3.0, name="d")
            with af.control_dependencies(None):
                e = af.constant(4.0, name="e")
    assert c.op.control_inputs == (a,)
    assert d.op.control_inputs == (a, b.op)
    assert e.op.control_inputs == ()
    f = af.constant(5.0)
    assert f.op.control_inputs == ()


def test_control_inputs_already_data_inputs_are_dropped(g: af.Graph) -> None:
    b = af.constant(1.0, name="b")
    with af.control_dependencies([b, b]):
        c = af.identity(b)
        d = af.constant(1.0)
    assert c.op.control_inputs == ()
    assert d.op.control_inputs == (b.op,)


def test_control_dependency_errors(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="control input"), af.control_dependencies([42]):
        pass
    other = af.Graph()
    with other.as_default():
        foreign = af.no_op()
    with af.control_dependencies([foreign]), pytest.raises(ValueError, match="different graph"):
        af.constant(1.0)


# -- devices ----------------------------------------------------------------------------------


def test_device_recording(g: af.Graph) -> None:
    a = af.constant(1.0)
    with af.device("/cpu:1"):
        b = af.constant(1.0)
        with af.device("/device:CPU:2"):
            c = b + 1.0
        with af.device(None):
            d = b + 2.0
        e = b * 2.0
    assert (a.device, b.device, c.device, d.device, e.device) == (
        "",
        "/cpu:1",
        "/device:CPU:2",
        "",
        "/cpu:1",
    )
    assert c.op.device == "/device:CPU:2"
    with pytest.raises(TypeError, match="device"), af.device(3):  # type: ignore[arg-type]
        pass


# -- finalize, graph membership, lookups -------------------------------------------------


def test_finalize(g: af.Graph) -> None:
    af.constant(1.0, name="before")
    g.finalize()
    assert g.finalized
    with pytest.raises(RuntimeError, match="finalized"):
        af.constant(2.0)
    assert [op.name for op in g.get_operations()] == ["before"]


def test_inputs_from_another_graph(g: af.Graph) -> None:
    other = af.Graph()
    with other.as_default():
        foreign = af.constant(1.0)
    with pytest.raises(ValueError, match="different graph"):
        g.create_op("Identity", [foreign])


def test_lookups(g: af.Graph) -> None:
    x = af.constant(1.0, name="x")
    assert g.get_operation_by_name("x") is x.op
    assert g.get_tensor_by_name("x:0") is x
    assert g.as_graph_element("x:0") is x
    assert g.as_graph_element("x") is x.op
    with pytest.raises(KeyError, match="'nope'"):
        g.get_operation_by_name("nope")
    with pytest.raises(ValueError, match="tensor name"):
        g.get_operation_by_name("x:0")
    with pytest.raises(ValueError, match="invalid"):
        g.get_tensor_by_name("x")
    with pytest.raises(KeyError, match="1 outputs"):
        g.get_tensor_by_name("x:1")
    with pytest.raises(ValueError, match="nope"):
        g.as_graph_element("nope:0")
    with pytest.raises(TypeError):
        g.as_graph_element(3.0)


def test_version_and_operations_snapshot(g: af.Graph) -> None:
    ops = g.get_operations()
    af.constant(1.0)
    assert ops == []
    assert g.version == 1


def test_failed_op_leaves_no_trace(g: af.Graph) -> None:
    with pytest.raises(TypeError, match="'oops'"):
        af.add(af.constant(1.0), af.constant(1), name="oops")
    assert all(op.name != "oops" for op in g.get_operations())
    assert af.constant(1.0, name="oops").op.name == "oops"


# -- default graph ------------------------------------------------------------------------


def test_default_graph_stack() -> None:
    g1, g2 = af.Graph(), af.Graph()
    with g1.as_default():
        assert af.get_default_graph() is g1
        with g2.as_default():
            assert af.constant(1.0).graph is g2
        assert af.get_default_graph() is g1
        with pytest.raises(AssertionError):
            af.reset_default_graph()


def test_reset_default_graph() -> None:
    before = af.get_default_graph()
    af.reset_default_graph()
    after = af.get_default_graph()
    assert after is not before
    assert after.get_operations() == []


def test_ops_follow_their_inputs_graph() -> None:
    g1 = af.Graph()
    with g1.as_default():
        x = af.placeholder(af.float32)
    y = af.identity(x)  # default graph is elsewhere; the input's graph wins
    assert y.graph is g1


# -- Tensor and Operation API ----------------------------------------------------------


def test_tensor_properties(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.nn.relu(x, name="y")
    assert (y.name, y.op.name, y.value_index, y.dtype) == ("y:0", "y", 0, af.float32)
    assert y.shape == af.TensorShape([None, 3])
    assert y.get_shape().as_list() == [None, 3]
    assert tuple(y.shape) == (None, 3)
    assert y.graph is g
    assert y.device == ""
    assert x.consumers() == [y.op]
    assert repr(y) == "<af.Tensor 'y:0' shape=(None, 3) dtype=float32>"
    assert y.op.inputs == (x,)
    assert y.op.outputs == (y,)
    assert y.op.values() == (y,)
    assert repr(y.op) == "<af.Operation 'y' type=Relu>"


def test_tensor_misuse(g: af.Graph) -> None:
    x = af.constant([1.0, 2.0], name="x")
    with pytest.raises(TypeError, match="Python bool"):
        bool(x)
    with pytest.raises(TypeError, match="not iterable"):
        iter(x)
    with pytest.raises(TypeError, match="numpy"):
        np.asarray(x)
    with pytest.raises(TypeError):
        [1, 2][x]


def test_operation_attrs(g: af.Graph) -> None:
    t = af.reduce_sum(af.constant(np.ones((2, 2))), axis=1, name="s")
    assert t.op.get_attr("axis") == [1]
    assert t.op.get_attr("keep_dims") is False
    with pytest.raises(ValueError, match=r"'s'.*'nope'"):
        t.op.get_attr("nope")
    assert t.op.node_attrs() == {"axis": [1], "keep_dims": False}


def test_creation_site_points_at_user_code(g: af.Graph) -> None:
    import inspect

    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    t = af.constant(1.0) + 2.0
    filename, _, lineno = t.op.traceback.rpartition(":")
    assert filename == __file__
    assert int(lineno) == line


def test_convert_to_tensor(g: af.Graph) -> None:
    x = af.constant(1.0)
    assert af.convert_to_tensor(x) is x
    assert af.convert_to_tensor(3).dtype == af.int32
    assert af.convert_to_tensor(3, dtype=af.float64).dtype == af.float64
    assert af.convert_to_tensor(3, preferred_dtype=af.int64).dtype == af.int64
    assert af.convert_to_tensor(3.5, preferred_dtype=af.int64).dtype == af.float32
    with pytest.raises(TypeError, match="requested dtype"):
        af.convert_to_tensor(x, dtype=af.int32)
    with pytest.raises(TypeError, match="operation"):
        af.convert_to_tensor(af.no_op())


def test_feed_and_fetch_policy(g: af.Graph) -> None:
    x = af.constant(1.0)
    assert g.is_feedable(x)
    g.prevent_feeding(x)
    assert not g.is_feedable(x)
    assert g.is_fetchable(x)
    g.prevent_fetching(x.op)
    assert not g.is_fetchable(x)
