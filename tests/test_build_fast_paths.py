"""The graph-building fast paths give what the general paths give.

``x + y`` on two tensors of the default graph goes straight to ``Graph._create_op``
(graph._binary_operator), and an op built while no scope block is open on its graph
skips the per-thread context stacks.  Each test builds the same ops both ways and
compares names, types, dtypes, shapes, inputs, control inputs, devices, creation
lines and errors.  A large compile promotes what it made to the oldest GC
generation, never thawing objects the application froze.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import asyncflow as af
from asyncflow.framework import graph as graph_module
from asyncflow.runtime import gc_pause


@pytest.fixture
def g() -> Iterator[af.Graph]:
    graph = af.Graph()
    with graph.as_default():
        yield graph


def _line() -> int:
    """The line of the caller."""
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def _same_op(fast: af.Operation, general: af.Operation) -> None:
    assert fast.type == general.type
    assert fast.inputs == general.inputs
    assert fast.control_inputs == general.control_inputs
    assert fast.device == general.device
    assert fast.attrs == general.attrs
    assert [(t.dtype, t.shape) for t in fast.outputs] == [
        (t.dtype, t.shape) for t in general.outputs
    ]


OPERATORS: list[
    tuple[Callable[[af.Tensor, af.Tensor], af.Tensor], Callable[..., af.Tensor], str]
] = [
    (lambda a, b: a + b, af.add, "add"),
    (lambda a, b: a - b, af.subtract, "sub"),
    (lambda a, b: a * b, af.multiply, "mul"),
    (lambda a, b: a // b, af.floordiv, "floordiv"),
    (lambda a, b: a % b, af.mod, "mod"),
    (lambda a, b: a**b, af.pow, "pow"),
    (lambda a, b: a < b, af.less, "Less"),
    (lambda a, b: a >= b, af.greater_equal, "GreaterEqual"),
]


@pytest.mark.parametrize(
    ("operator", "constructor", "name"), OPERATORS, ids=[name for _, _, name in OPERATORS]
)
def test_operator_on_two_tensors_builds_what_the_constructor_builds(
    g: af.Graph,
    operator: Callable[[af.Tensor, af.Tensor], af.Tensor],
    constructor: Callable[..., af.Tensor],
    name: str,
) -> None:
    x = af.placeholder(af.float32, shape=(None, 3), name="x")
    y = af.constant(np.ones((2, 1), np.float32), name="y")
    fast = operator(x, y)
    general = constructor(x, y, name=name)
    again = operator(x, y)
    assert (fast.op.name, general.op.name, again.op.name) == (name, f"{name}_1", f"{name}_2")
    _same_op(fast.op, general.op)
    assert fast.shape.as_list() == [2, 3]


async def test_a_chain_of_operators_runs_and_names_every_op(g: af.Graph) -> None:
    x0 = af.placeholder(af.float32, shape=(), name="x")
    one = af.constant(np.float32(1.0), name="one")
    x = x0
    for _ in range(50):
        x = x + one
    assert x.op.name == "add_49"
    assert [op.name for op in g.get_operations()][2:5] == ["add", "add_1", "add_2"]
    async with af.Session(graph=g) as sess:
        assert float(await sess.run(x, {x0: 0.0})) == 50.0


def test_operator_names_skip_names_taken_explicitly(g: af.Graph) -> None:
    x = af.constant(1.0, name="x")
    af.identity(x, name="add_1")
    af.identity(x, name="ADD_2")  # names collide regardless of case, as in TF
    names = [(x + x).op.name for _ in range(4)]
    assert names == ["add", "add_3", "add_4", "add_5"]


def test_operator_inside_scopes_takes_the_general_path(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.constant(2.0, name="y")
    gate = af.no_op(name="gate")
    with g.name_scope("s"), g.control_dependencies([gate]), g.device("/cpu:0"):
        inside = x * y
    after = x * y
    assert inside.op.name == "s/mul"
    assert inside.op.control_inputs == (gate,)
    assert inside.op.device == "/cpu:0"
    assert after.op.name == "mul"  # the scope is closed: nothing carried over
    assert after.op.control_inputs == ()
    assert after.op.device == ""
    with g.colocate_with(x):
        colocated = x * y
    assert colocated.op.get_attr("_class") == ["loc:@x"]
    assert "_class" not in (x * y).op.attrs


def test_a_scope_open_in_another_thread_does_not_leak(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    gate = af.no_op(name="gate")
    opened, built = threading.Event(), threading.Event()

    def other() -> None:
        with g.as_default(), g.name_scope("other"), g.control_dependencies([gate]):
            opened.set()
            built.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert opened.wait(10)
        t = x + x  # this thread has no scope open, although the graph has one
        assert t.op.name == "add"
        assert t.op.control_inputs == ()
    finally:
        built.set()
        thread.join(10)
    assert g._scopes == 0


def test_operator_on_tensors_of_another_graph_builds_there() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.constant(1.0, name="x")
    with af.Graph().as_default():
        t = x + x  # as make_op: the inputs' graph
    assert t.graph is g
    assert t.op.name == "add"


def test_operator_errors_match_the_constructor(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(2,), name="x")
    i = af.placeholder(af.int32, shape=(2,), name="i")
    s = af.placeholder(af.float32, shape=(3,), name="s")
    b = af.placeholder(af.bool, shape=(2,), name="b")
    with pytest.raises(TypeError) as fast:
        x + i
    with pytest.raises(TypeError) as general:
        af.add(x, i, name="add")
    assert str(fast.value) == str(general.value)
    assert "while building op 'add'" in str(fast.value)
    with pytest.raises(ValueError, match="Dimensions must be equal") as shape_error:
        x - s
    assert "while building op 'sub'" in str(shape_error.value)
    with pytest.raises(TypeError, match="expected a numeric dtype"):
        b * b
    # A failed op leaves no name behind.
    assert (x + x).op.name == "add"


def test_creation_site_of_an_operator_is_the_user_line(g: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    line = _line() + 1
    t = x + x
    assert t.op.traceback == f"{__file__}:{line}"

    def helper(a: af.Tensor) -> af.Tensor:
        return a * a  # the user's helper is user code too

    helper_line = inspect.getsourcelines(helper)[1] + 1
    assert helper(x).op.traceback == f"{__file__}:{helper_line}"


async def test_runtime_error_names_the_operator_line(g: af.Graph) -> None:
    x = af.placeholder(af.int32, shape=(), name="x")
    zero = af.constant(0, name="zero")
    line = _line() + 1
    bad = x // zero
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as err:
            await sess.run(bad, {x: 1})
    assert err.value.node_name == "floordiv"
    assert f"{__file__.rsplit('/', 1)[-1]}:{line}" in str(err.value)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_inputs_and_outputs_read_back_as_tuples(g: af.Graph, n: int) -> None:
    xs = [af.constant(float(k), name=f"c{k}") for k in range(n)]
    if n == 0:
        op = af.no_op(name="op")
    elif n == 1:
        op = af.identity(xs[0], name="op").op
    else:
        op = af.add_n(xs, name="op").op
    assert op.inputs == tuple(xs)
    assert isinstance(op.inputs, tuple)
    assert op.outputs == tuple(op.values())
    assert len(op.outputs) == (0 if n == 0 else 1)
    for t in xs:
        assert op in t.consumers() or n == 0


def test_a_large_compile_promotes_its_objects_but_never_thaws_the_application_s(
    g: af.Graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc_pause, "_PROMOTE_AFTER", 1_000)
    x0 = af.placeholder(af.float32, shape=(), name="x")
    one = af.constant(np.float32(1.0), name="one")
    x = x0
    for _ in range(2_000):
        x = x + one

    async def run() -> float:
        async with af.Session(graph=g) as sess:
            return float(await sess.run(x, {x0: 0.0}))

    assert gc.isenabled()
    assert asyncio.run(run()) == 2_000.0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # promoted: frozen and thawed at once
    frozen = [object() for _ in range(10)]
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        assert asyncio.run(run()) == 2_000.0
        assert gc.get_freeze_count() == count  # the application's stay frozen
        assert gc.isenabled()
    finally:
        gc.unfreeze()
    del frozen


def test_operator_fast_op_has_every_field_the_general_path_sets(g: af.Graph) -> None:
    # _create_binary_op fills Operation's slots one by one: none may be left unset or
    # differ from what _create_op sets (but the name and the creation line).
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.constant(np.float32(2.0), name="y")
    fast = (x + y).op
    general = g._create_op("Add", (x, y), None, "add", (), 1, True)
    assert general.name == "add_1"
    for slot in af.Operation.__slots__:
        if slot in ("__weakref__", "_name", "_line", "_out"):
            continue
        assert getattr(fast, slot) == getattr(general, slot), slot
    assert isinstance(fast._out, af.Tensor)
    assert isinstance(general._out, af.Tensor)
    assert fast._out.op is fast
    assert fast._out.value_index == 0
    assert (fast._out.dtype, fast._out.shape) == (general._out.dtype, general._out.shape)
    assert fast.attrs is not general.attrs  # each op its own attribute dict


def test_a_large_graph_promotes_its_objects_but_never_thaws_the_application_s(
    g: af.Graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graph_module, "_PROMOTE_MASK", 63)
    x = af.constant(np.float32(1.0), name="x")
    gc.collect()
    young: list[object] = [[]]  # tracked, and young until the graph's 64th op
    assert any(o is young for o in gc.get_objects(generation=0))
    for _ in range(62):
        x = x + x
    assert not any(o is young for o in gc.get_objects(generation=2))
    x = x + x
    assert len(g.get_operations()) == 64
    assert any(o is young for o in gc.get_objects(generation=2))  # promoted
    assert any(o is x.op for o in gc.get_objects(generation=2))
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    gc.freeze()  # the application's own: a graph growing must not thaw them
    try:
        count = gc.get_freeze_count()
        for _ in range(128):
            x = x + x
        assert gc.get_freeze_count() == count
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        for _ in range(128):
            x = x * x
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert len(g.get_operations()) == 64 + 256


# -- the IR conversion's fast path ----------------------------------------------------


def _same_info(fast: object, general: object) -> None:
    assert (fast.dtype, fast.shape) == (general.dtype, general.shape)  # type: ignore[attr-defined]
    assert fast.value is general.value  # type: ignore[attr-defined]


def test_graph_ir_fast_path_gives_node_def_of_nodes(g: af.Graph) -> None:
    """``graph_ir`` converts two-input ops itself; every node equals what
    ``node_def_of`` makes of the same op alone, field by field."""
    from asyncflow.compiler.ir import graph_ir, node_def_of

    x = af.placeholder(af.float32, shape=(3,), name="x")
    i = af.placeholder(af.int32, shape=(), name="i")
    one = af.constant(np.float32(1.0), name="one")
    v = af.constant(np.arange(3, dtype=np.float32), name="v")
    y = x + one  # fast: first input's info shared
    y = one + y  # fast: output shape differs from the first input's
    y = y * v
    z = af.cast(i, af.float32) + one  # one-input op feeding a fast one
    with af.control_dependencies([z.op]):
        w = y - one  # a control input: the general path
    with af.device("/cpu:0"):
        d = w + y  # a requested device
    s = af.add_n([d, w, y])  # three inputs: the general path
    p, q = af.unstack(af.stack([x, x]), num=2)  # several outputs
    c = p < q  # a bool output of float inputs
    for _ in range(3):  # one creation line for several ops
        s = s + one
    ops = g.get_operations()
    nodes = graph_ir(g).nodes
    assert [n.name for n in nodes] == [op.name for op in ops]
    assert c.op.name in {n.name for n in nodes}
    for op, fast in zip(ops, nodes):
        op._ir = None
        general = node_def_of(op)
        for field in ("name", "op", "inputs", "control_inputs", "device", "stateful", "traceback"):
            assert getattr(fast, field) == getattr(general, field), (op.name, field)
        assert dict(fast.attrs).keys() == dict(general.attrs).keys()
        assert len(fast.outputs) == len(general.outputs)
        for a, b in zip(fast.outputs, general.outputs):
            _same_info(a, b)
        assert len(fast.input_types) == len(general.input_types)
        for a, b in zip(fast.input_types, general.input_types):
            _same_info(a, b)


def test_graph_ir_says_when_nothing_asks_for_a_device_or_a_call() -> None:
    """``GraphIR.requests`` / ``.calls`` let compiles skip placement and the search
    for calls; each turns True as soon as one op (on either conversion path) needs it."""
    from asyncflow.compiler.ir import graph_ir

    def ir_of(build: Callable[[af.Tensor], object]) -> tuple[bool, bool]:
        graph = af.Graph()
        with graph.as_default():
            x = af.placeholder(af.float32, shape=(), name="x")
            build(x + 1.0)
        ir = graph_ir(graph)
        return ir.requests, ir.calls

    assert ir_of(lambda y: y * y) == (False, False)
    assert ir_of(lambda y: af.identity(y)) == (False, False)

    def on_device(y: af.Tensor) -> object:
        with af.device("/cpu:0"):
            return y * y  # the two-input path

    def one_input_on_device(y: af.Tensor) -> object:
        with af.device("/cpu:0"):
            return af.identity(y)

    def colocated(y: af.Tensor) -> object:
        with af.colocate_with(y.op):
            return y * y

    def call(y: af.Tensor) -> object:
        @af.Defun(af.float32, func_name="ir_flag_twice")
        def twice(v: af.Tensor) -> af.Tensor:
            return v * 2.0

        return twice(y)

    assert ir_of(on_device) == (True, False)
    assert ir_of(one_input_on_device) == (True, False)
    assert ir_of(colocated)[0] is True
    assert ir_of(call)[1] is True
    # An unknown device is still an error when it is the only request.
    g2 = af.Graph()
    with g2.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        with af.device("/gpu:7"):
            y = x * x
    with af.Session(graph=g2) as sess, pytest.raises(af.errors.InvalidArgumentError, match="gpu:7"):
        sess.run_sync(y, {x: 1.0})
