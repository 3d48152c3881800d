"""The graph optimizer: constant folding, CSE and inlining as pure passes on the IR
(no event loop), and end to end through sessions at L0 and L1."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.constant_folding import fold_constants, never_folded
from asyncflow.compiler.cse import _merge, eliminate_common_subexpressions
from asyncflow.compiler.inline import inline_functions
from asyncflow.compiler.ir import FUNCTION_ATTR, NodeDef, Ref, graph_ir, ref_of
from asyncflow.compiler.optimize import optimize
from asyncflow.compiler.placement import place
from asyncflow.compiler.prune import prune

if TYPE_CHECKING:
    from tests.conftest import Hangs

DEVICES = (
    "/job:localhost/replica:0/task:0/device:CPU:0",
    "/job:localhost/replica:0/task:0/device:CPU:1",
)
L0 = af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
NO_INLINE = af.OptimizerOptions(do_function_inlining=False)


L1 = af.OptimizerOptions()


def config(options: af.OptimizerOptions = L1, cpus: int = 1) -> af.SessionConfig:
    return af.SessionConfig(
        device_count={"CPU": cpus}, graph_options=af.GraphOptions(optimizer_options=options)
    )


def placed(
    graph: af.Graph,
    fetches: Sequence[af.Tensor],
    targets: Sequence[str] = (),
    feeds: Sequence[af.Tensor] = (),
) -> tuple[tuple[NodeDef, ...], tuple[int, ...]]:
    ir = graph_ir(graph)
    nodes = prune(ir, [ref_of(t) for t in fetches], targets, [ref_of(t) for t in feeds])
    return nodes, place(nodes, DEVICES, lookup=ir.by_name)


def fold(
    graph: af.Graph,
    fetches: Sequence[af.Tensor],
    feeds: Sequence[af.Tensor] = (),
    targets: Sequence[str] = (),
    max_bytes: int = 10 * 2**20,
) -> tuple[dict[str, NodeDef], bool]:
    nodes, where = placed(graph, fetches, targets, feeds)
    out, _, changed = fold_constants(
        nodes,
        where,
        DEVICES,
        feeds=frozenset(ref_of(t) for t in feeds),
        fetches=[ref_of(t) for t in fetches],
        targets=targets,
        max_bytes=max_bytes,
    )
    return {n.name: n for n in out}, changed


# -- options -----------------------------------------------------------------------------


def test_options_have_tf_names_and_defaults() -> None:
    o = af.OptimizerOptions()
    assert o.opt_level == af.OptimizerOptions.L1 == 0
    assert af.OptimizerOptions.L0 == -1
    assert (
        o.do_constant_folding,
        o.do_common_subexpression_elimination,
        o.do_function_inlining,
    ) == (True, True, True)
    assert o.max_folded_constant_in_bytes == 10 * 2**20
    assert (o.folding, o.cse, o.inlining) == (True, True, True)
    assert (L0.folding, L0.cse, L0.inlining) == (False, False, False)
    assert af.SessionConfig().graph_options.optimizer_options == o
    with pytest.raises(ValueError, match="opt_level"):
        af.OptimizerOptions(opt_level=3)
    with pytest.raises(TypeError, match="graph_options"):
        af.SessionConfig(graph_options=o)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer_options"):
        af.GraphOptions(optimizer_options=1)  # type: ignore[arg-type]


# -- constant folding ----------------------------------------------------------------------


def test_constant_subgraph_becomes_one_const_with_the_name_and_device() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.constant(2.0, name="a")
        b = af.constant(3.0, name="b")
        with af.device("/cpu:1"):
            c = af.multiply(a + b, a, name="c")
        x = af.placeholder(af.float32, name="x")
        y = af.add(c, x, name="y")
    nodes, changed = fold(g, [y], [x])
    assert changed
    assert nodes["c"].op == "Const"
    assert nodes["c"].attrs["value"] == 10.0
    assert nodes["c"].device == "/cpu:1"
    assert nodes["y"].op == "Add"  # downstream of a placeholder: never folded
    assert "a" not in nodes
    assert "b" not in nodes
    assert set(nodes) == {"c", "y"}


def test_never_folded() -> None:
    g = af.Graph()
    with g.as_default():
        c = af.constant(np.ones(3, np.float32), name="c")
        v = af.Variable(np.ones(3, np.float32), name="v")
        from_var = af.add(v, c, name="from_var")
        stateful = af.py_func(lambda t: t, [c], af.float32, name="stateful")
        pure = af.py_func(np.negative, [c], af.float32, stateful=False, name="pure")

        async def coro(t: np.ndarray) -> np.ndarray:
            return t

        async_pf = af.py_func(coro, [c], af.float32, stateful=False, name="async_pf")
        thread_pf = af.py_func(
            np.negative, [c], af.float32, stateful=False, expensive=True, name="thread_pf"
        )
        fed = af.negative(c, name="fed")
        after_fed = af.negative(fed, name="after_fed")
        big = af.fill([1000], 1.0, name="big")
    fetches = [from_var, stateful, pure, async_pf, thread_pf, after_fed, big]
    nodes, _ = fold(g, fetches, feeds=[fed], max_bytes=1000)
    assert nodes["pure"].op == "Const"  # a stateless inline py_func folds
    for name in ("from_var", "stateful", "async_pf", "thread_pf", "after_fed", "big"):
        assert nodes[name].op != "Const", name
    assert never_folded(nodes["v"]) == "stateful"
    assert never_folded(graph_ir(g).by_name["stateful"]) == "stateful"


def test_folding_error_is_left_for_run_time() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.constant(np.ones((2, 3), np.float32))
        b = af.constant(np.ones((2, 3), np.float32))
        bad = af.py_func(lambda x, y: x @ y, [a, b], af.float32, stateful=False, name="bad")
    nodes, changed = fold(g, [bad])
    assert not changed
    assert nodes["bad"].op == "PyFuncStateless"
    with af.Session(g) as sess, pytest.raises(af.errors.InvalidArgumentError) as info:
        sess.run_sync(bad)
    assert info.value.node_name == "bad"
    assert "bad" in str(info.value)


def test_constants_in_a_loop_keep_their_pivot() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")

        def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
            step = af.add(af.constant(1.0), af.constant(1.0), name="two")  # loop invariant
            return i + 1, s + step * x

        _, s = af.while_loop(lambda i, s: i < 3, body, [af.constant(0), af.constant(0.0)])
    nodes, changed = fold(g, [s], [x])
    assert changed
    two = next(n for name, n in nodes.items() if name.endswith("two"))
    assert two.op == "Const"
    assert two.control_inputs
    for options in (af.OptimizerOptions(), L0):
        with af.Session(g, config=config(options)) as sess:
            assert sess.run_sync(s, {x: 2.0}) == 12.0


def test_control_inputs_are_carried_to_the_replacement() -> None:
    g = af.Graph()
    calls: list[int] = []

    def side_effect() -> np.float32:
        calls.append(1)
        return np.float32(0)

    with g.as_default():
        side = af.py_func(side_effect, [], af.float32, name="side")
        with af.control_dependencies([side.op]):
            a = af.constant(1.0, name="a")
        b = af.add(a, 2.0, name="b")
    nodes, _ = fold(g, [b])
    assert nodes["b"].op == "Const"
    assert nodes["b"].control_inputs == ("side",)
    with af.Session(g) as sess:
        assert sess.run_sync(b) == 3.0
    assert calls == [1]


# -- CSE ---------------------------------------------------------------------------------


def _cse(
    nodes: Sequence[NodeDef],
    where: Sequence[int],
    protected: Sequence[str] = (),
    feeds: Sequence[Ref] = (),
) -> tuple[dict[str, NodeDef], bool]:
    """CSE, checked against its pass without the skipping of lone nodes."""
    out, placement, changed = eliminate_common_subexpressions(
        nodes, where, feeds=frozenset(feeds), protected=frozenset(protected)
    )
    assert (out, placement, changed) == _merge(nodes, where, frozenset(feeds), frozenset(protected))
    return {n.name: n for n in out}, changed


def test_cse_merges_in_one_pass_what_a_merge_exposes() -> None:
    """``b`` reads the duplicate ``g2`` of ``g1``, which ``a`` (made before ``g2``)
    reads: once ``g2`` merges into ``g1``, ``b`` is ``a``'s duplicate, in the same pass
    (``a`` was alone in its group as the graph was written)."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        g1 = af.multiply(x, 2.0, name="g1")
        a = af.negative(g1, name="a")
        g2 = af.multiply(x, 2.0, name="g2")
        b = af.negative(g2, name="b")
        out = af.add(a, b, name="out")
    nodes, where = placed(g, [out], feeds=[x])
    merged, changed = _cse(nodes, where, protected=["out"], feeds=[ref_of(x)])
    assert changed
    assert "g2" not in merged
    assert "b" not in merged
    assert merged["out"].inputs == (("a", 0), ("a", 0))
    # Nothing to merge: every node starts a group of its own.
    chain = [x]
    with g.as_default():
        one = af.constant(1.0, name="one")
        for _ in range(5):
            chain.append(chain[-1] + one)
    nodes, where = placed(g, [chain[-1]], feeds=[x])
    assert _cse(nodes, where, feeds=[ref_of(x)]) == ({n.name: n for n in nodes}, False)


def test_cse_merges_equal_nodes_and_rewires_consumers() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        a1 = af.multiply(x, 2.0, name="a1")
        a2 = af.multiply(x, 2.0, name="a2")  # its Const merges first, then the Mul
        out = af.add(a1, a2, name="out")
    nodes, where = placed(g, [out], feeds=[x])
    merged, changed = _cse(nodes, where, protected=["out"], feeds=[ref_of(x)])
    assert changed
    assert "a2" not in merged
    assert merged["out"].inputs == (("a1", 0), ("a1", 0))


def test_cse_never_merges_into_a_fed_node() -> None:
    # Found by tests/test_property.py: a duplicate of a fed node computes its own
    # value; merging it into the fed node would hand its consumers the fed value.
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float64, shape=(3,), name="x")
        fed = af.negative(x, name="fed")
        twin = af.negative(x, name="twin")
        with af.control_dependencies([fed.op]):  # keeps the fed node in the plan
            out = af.identity(twin, name="out")
    feeds = {x: np.zeros(3), fed: np.array([0.0, 0.0, 1.0])}
    with af.Session(graph=g) as sess:
        np.testing.assert_array_equal(sess.run_sync(out, feeds), [-0.0, -0.0, -0.0])
    nodes, where = placed(g, [out], feeds=[x, fed])
    merged, _ = _cse(nodes, where, protected=["out", "x", "fed"], feeds=[ref_of(x), ref_of(fed)])
    assert merged["out"].inputs == (("twin", 0),)


def test_cse_refusals() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        r1 = af.py_func(np.negative, [x], af.float32, name="r1")  # stateful
        r2 = af.py_func(np.negative, [x], af.float32, name="r2")
        d1 = af.multiply(x, 2.0, name="d1")
        with af.device("/cpu:1"):
            d2 = af.multiply(x, 2.0, name="d2")  # another device
        s1 = af.reduce_sum(x, name="s1")
        s2 = af.reduce_sum(x, keepdims=True, name="s2")  # other attrs
        f1 = af.negative(x, name="f1")
        f2 = af.negative(x, name="f2")  # fetched: kept
        n1 = af.abs(x, name="n1")
        with af.control_dependencies([r1.op]):
            n2 = af.abs(x, name="n2")  # other control inputs
    fetches = [r1, r2, d1, d2, s1, s2, f1, f2, n1, n2]
    nodes, where = placed(g, fetches, feeds=[x])
    merged, _ = _cse(nodes, where, protected=["f2"], feeds=[ref_of(x)])
    for name in ("r1", "r2", "d1", "d2", "s1", "s2", "f1", "f2", "n1", "n2"):
        assert name in merged, name


def test_stateful_ops_run_as_often_as_written() -> None:
    g = af.Graph()
    count = [0]

    def bump(v: np.float32) -> np.float32:
        count[0] += 1
        return v

    with g.as_default():
        c = af.constant(1.0)
        a = af.py_func(bump, [c], af.float32)
        b = af.py_func(bump, [c], af.float32)
        v = af.Variable(0.0)
        inc1 = v.assign_add(1.0)
        inc2 = v.assign_add(1.0)
        total = af.add_n([a, b])
    with af.Session(g) as sess:
        sess.run_sync(v.initializer)
        assert sess.run_sync(total) == 2.0
        sess.run_sync([inc1.op, inc2.op])
        assert sess.run_sync(v.read_value()) == 2.0
    assert count[0] == 2


# -- functions -----------------------------------------------------------------------------


def test_defun_builds_a_call_op_with_known_outputs() -> None:
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32, af.float32)
        def scaled_add(x: af.Tensor, y: af.Tensor) -> af.Tensor:
            return x * 2.0 + y

        a = af.constant(np.ones(3, np.float32))
        z = scaled_add(a, a)
    assert z.op.type == scaled_add.name
    assert scaled_add.name.startswith("scaled_add_")
    assert z.dtype == af.float32
    assert scaled_add.name in g.as_graph_def()["library"]["function"][0]["signature"]["name"]
    with g.as_default():
        with pytest.raises(TypeError, match=scaled_add.name):
            scaled_add(a)
        with pytest.raises(TypeError, match=scaled_add.name):
            scaled_add(a, af.constant([1, 2, 3]))


def test_inlining_on_the_ir_with_nested_calls_and_captures() -> None:
    g = af.Graph()
    with g.as_default():
        w = af.constant(10.0, name="w")

        @af.Defun(af.float32, func_name="inner")
        def inner(x: af.Tensor) -> af.Tensor:
            return x + w  # a capture

        @af.Defun(af.float32, func_name="outer")
        def outer(x: af.Tensor) -> af.Tensor:
            result: af.Tensor = inner(x) * 2.0
            return result

        p = af.placeholder(af.float32, name="p")
        z = outer(p, name="call")
    nodes, where = placed(g, [z], feeds=[p])
    assert nodes[-1].op == "outer"
    assert FUNCTION_ATTR in nodes[-1].attrs
    once, _, n = inline_functions(nodes, where, DEVICES)
    assert n == 1
    names = {node.name: node for node in once}
    assert names["call"].op == "Identity"
    assert names["call/inner"].op == "inner"  # the nested call, next round
    twice, _, n = inline_functions(once, [0] * len(once), DEVICES)
    names = {node.name: node for node in twice}
    assert n == 1
    assert not any(FUNCTION_ATTR in node.attrs for node in twice)
    # The capture is wired to the outer graph's tensor, the argument to the call's input.
    assert names["call/inner/add"].inputs == (("p", 0), ("w", 0))
    optimized, _, stats = optimize(
        nodes, where, devices=DEVICES, feeds=[ref_of(p)], fetches=[ref_of(z)]
    )
    assert stats.inlined == 2
    assert not any(FUNCTION_ATTR in node.attrs for node in optimized)


@pytest.mark.parametrize(
    "options", [af.OptimizerOptions(), NO_INLINE, L0], ids=["inlined", "call_kernel", "L0"]
)
async def test_function_bodies_with_async_kernels_control_flow_and_variables(
    options: af.OptimizerOptions,
) -> None:
    g = af.Graph()
    with g.as_default():
        v = af.Variable(np.float32(3.0), name="v")

        async def slow_double(t: np.float32) -> np.float32:
            await asyncio.sleep(0)
            return np.float32(t * 2)

        @af.Defun(af.float32)
        def square(x: af.Tensor) -> af.Tensor:
            return x * x

        @af.Defun(af.float32, af.float32, out_names=["total", "branch"])
        def body(x: af.Tensor, y: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
            doubled = af.reshape(af.py_func(slow_double, [x], af.float32, stateful=False), [])
            _, total = af.while_loop(
                lambda i, s: i < 3,
                lambda i, s: (i + 1, s + doubled),
                [af.constant(0), af.constant(0.0)],
            )
            branch = af.cond(y > 0.0, lambda: square(y) + v, lambda: -y)
            return total, branch

        x = af.placeholder(af.float32, name="x")
        y = af.placeholder(af.float32, name="y")
        t1, b1 = body(x, y, name="first")
        t2, b2 = body(x, -y, name="second")
    expected = [6.0, 7.0, 6.0, 2.0]
    async with af.Session(g, config=config(options)) as sess:
        await sess.run(v.initializer)
        assert await sess.run([t1, b1, t2, b2], {x: 1.0, y: 2.0}) == expected
        stats = sess.statistics().optimizer[-1]  # the second plan (the first: initializer)
    assert stats.inlined == (4 if options.inlining else 0)


async def test_call_kernel_traces_the_body_under_the_call_name() -> None:
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32, func_name="twice")
        def twice(x: af.Tensor) -> af.Tensor:
            return af.multiply(x, 2.0, name="mul")

        x = af.placeholder(af.float32, name="x")
        z = twice(x, name="call")
    md = af.RunMetadata()
    async with af.Session(g, config=config(NO_INLINE)) as sess:
        assert (
            await sess.run(z, {x: 2.0}, options=af.RunOptions(trace_level=3), run_metadata=md)
            == 4.0
        )
    names = [n.node_name for d in md.step_stats.dev_stats for n in d.node_stats]
    assert "call/mul" in names
    assert "call" in names
    async with af.Session(g) as sess:
        await sess.run(z, {x: 2.0}, options=af.RunOptions(trace_level=3), run_metadata=md)
    names = [n.node_name for d in md.step_stats.dev_stats for n in d.node_stats]
    assert "call/mul" in names  # inlined: the body's ops are the graph's own


@pytest.mark.parametrize("options", [af.OptimizerOptions(), NO_INLINE], ids=["inlined", "called"])
async def test_deadline_and_cancellation_reach_a_function_body(
    options: af.OptimizerOptions,
    hanging_kernel: Hangs,
) -> None:
    forever = hanging_kernel.async_kernel()
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def hang(x: af.Tensor) -> af.Tensor:
            return af.py_func(forever, [x], af.float32)

        z = hang(af.constant(1.0))
    async with af.Session(g, config=config(options)) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(z, options=af.RunOptions(timeout_in_ms=50))
        forever.started.clear()
        task = asyncio.ensure_future(sess.run(z))
        await forever.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("options", [af.OptimizerOptions(), NO_INLINE], ids=["inlined", "called"])
async def test_error_in_a_body_names_the_body_node(options: af.OptimizerOptions) -> None:
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def fails(x: af.Tensor) -> af.Tensor:
            return af.py_func(lambda t: 1 / 0, [x], af.float32, name="boom")

        p = af.placeholder(af.float32)
        z = fails(p, name="call")
    async with af.Session(g, config=config(options)) as sess:
        with pytest.raises(af.errors.UnknownError, match="boom"):
            await sess.run(z, {p: 1.0})
        assert await sess.run(p, {p: 1.0}) == 1.0  # still usable


async def test_one_hundred_concurrent_runs_of_a_function_calling_graph() -> None:
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32, af.float32)
        def mix(a: af.Tensor, b: af.Tensor) -> af.Tensor:
            async def later(t: np.float32) -> np.float32:
                await asyncio.sleep(0)
                return t

            return af.py_func(later, [a * b + 1.0], af.float32, stateful=False)

        x = af.placeholder(af.float32, name="x")
        z = mix(mix(x, x), x)
    for options in (af.OptimizerOptions(), NO_INLINE):
        async with af.Session(g, config=config(options)) as sess:
            results = await asyncio.gather(*(sess.run(z, {x: float(k)}) for k in range(100)))
        assert results == [np.float32((k * k + 1) * k + 1) for k in range(100)]


def test_graph_def_library_round_trip() -> None:
    import json

    g = af.Graph()
    with g.as_default():
        c = af.constant(4.0, name="c")

        @af.Defun(af.float32)
        def inner(x: af.Tensor) -> af.Tensor:
            return x + c

        @af.Defun(af.float32, af.float32)
        def f(x: af.Tensor, y: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
            return inner(x * 2.0 + y), x - y

        b = af.placeholder(af.float32, name="b")
        f(b, 1.0, name="call")
    graph_def = g.as_graph_def()
    names = [f["signature"]["name"] for f in graph_def["library"]["function"]]
    assert names == [inner.name, f.name]
    g2 = af.Graph()
    with g2.as_default():
        af.import_graph_def(json.loads(json.dumps(graph_def)))
    assert g2.as_graph_def() == graph_def  # lossless
    for options in (af.OptimizerOptions(), NO_INLINE):
        with af.Session(g2, config=config(options)) as sess:
            assert sess.run_sync(["call:0", "call:1"], {"b:0": 3.0}) == [11.0, 2.0]
    with pytest.raises(ValueError, match="library"):
        af.import_graph_def(
            {**graph_def, "library": {"function": [{"signature": {}}]}}, graph=af.Graph()
        )


# -- end to end -------------------------------------------------------------------------


def test_optimized_partition_graphs_and_statistics() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, name="x")
        k = af.constant(0.0)
        for _ in range(20):
            k = k + 1.0  # a constant chain: folded into one Const
        a = af.multiply(x, 2.0)
        b = af.multiply(x, 2.0)  # a duplicate: merged
        y = af.add_n([a, b, k], name="y")
    md = af.RunMetadata()
    opts = af.RunOptions(output_partition_graphs=True)
    sizes = {}
    for level, options in (("L1", af.OptimizerOptions()), ("L0", L0)):
        with af.Session(g, config=config(options)) as sess:
            assert sess.run_sync(y, {x: 1.0}, options=opts, run_metadata=md) == 24.0
            (stats,) = sess.statistics().optimizer
        sizes[level] = len(md.partition_graphs[0]["node"])
        if level == "L1":
            assert stats.folded == 40
            assert stats.cse == 2
            assert stats.nodes_after == stats.nodes_before - 42
        else:
            assert stats.folded == stats.cse == stats.inlined == 0
    assert sizes["L1"] == sizes["L0"] - 42


def test_fetching_a_folded_node_by_name() -> None:
    g = af.Graph()
    with g.as_default():
        c = af.add(af.constant(1.0), af.constant(2.0), name="c")
        af.multiply(c, 2.0, name="d")
    with af.Session(g) as sess:
        assert sess.run_sync(["c:0", "d:0"]) == [3.0, 6.0]
        (stats,) = sess.statistics().optimizer
        assert stats.nodes_after == 2


def test_concurrent_compiles_from_threads_agree() -> None:
    g = af.Graph()
    with g.as_default():
        y = af.reduce_sum(af.fill([4], 2.0) * 3.0)
    out: list[Any] = []
    with af.Session(g) as sess:
        threads = [threading.Thread(target=lambda: out.append(sess.run_sync(y))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert out == [24.0] * 4


@pytest.mark.parametrize(
    "options",
    [
        L1,
        NO_INLINE,
        L0,
        af.OptimizerOptions(do_constant_folding=False, do_common_subexpression_elimination=False),
    ],
    ids=["L1", "call_kernel", "L0", "inline_only"],
)
def test_calls_inside_a_loop_and_a_cond(options: af.OptimizerOptions) -> None:
    # An inlined body's constants must join the call's frame (a loop body, a branch).
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def inc(t: af.Tensor) -> af.Tensor:
            return t + af.constant(1.0) * 2.0

        x = af.placeholder(af.float32, shape=(), name="x")
        _, s = af.while_loop(
            lambda i, s: i < 3, lambda i, s: (i + 1, af.reshape(inc(s), [])), [af.constant(0), x]
        )
        c = af.cond(x > 0.0, lambda: af.reshape(inc(x), []), lambda: x)
    with af.Session(g, config=config(options)) as sess:
        assert sess.run_sync([s, c], {x: 1.0}) == [7.0, 3.0]
        assert sess.run_sync([s, c], {x: -1.0}) == [5.0, -1.0]
