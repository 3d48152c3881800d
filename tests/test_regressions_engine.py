"""Compiler-side behaviours that follow TF 1.x: partial runs with feeds the fetches do
not need, feeds placed on the client device, functions gated on their call, CSE of
fetched duplicates and the one-argument ``where`` of a scalar."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.ir import graph_ir, ref_of
from asyncflow.compiler.pipeline import compile_signature

TWO_CPUS = af.SessionConfig(device_count={"CPU": 2})
GRAPHS = af.RunOptions(output_partition_graphs=True)


def ops_of(md: af.RunMetadata) -> list[list[str]]:
    return [[n["op"] for n in pg["node"]] for pg in md.partition_graphs]


def adder() -> tuple[af.Graph, Any, Any, Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        a, b, c = (af.placeholder(af.float32, (), name=n) for n in "abc")
        r1 = a + b
        r2 = r1 * c
    return g, a, b, c, r1, r2


# -- partial runs and feeds nothing needs ----------------------------------------------


async def test_partial_run_setup_with_a_feed_the_fetches_do_not_need() -> None:
    # TF's concurrent-handles case: h1 declares c but fetches only r1.
    g, a, b, c, r1, r2 = adder()
    async with af.Session(graph=g) as sess:
        h1 = await sess.partial_run_setup([r1], feeds=[a, b, c])
        h2 = await sess.partial_run_setup([r1, r2], feeds=[a, b, c])
        assert await sess.partial_run(h1, r1, {a: 1.0, b: 2.0}) == 3.0
        assert await sess.partial_run(h2, r1, {a: 57.0, b: 9.0}) == 66.0
        assert await sess.partial_run(h2, r2, {c: 7.0}) == 462.0
        # A fetch h1 did not declare is refused, even when c is fed now.
        with pytest.raises(af.errors.InvalidArgumentError, match="not specified"):
            await sess.partial_run(h1, r2, {c: 7.0})


async def test_run_feeding_an_unneeded_tensor_shows_partition_graphs() -> None:
    g, a, b, c, r1, _ = adder()
    async with af.Session(graph=g) as sess:
        md = af.RunMetadata()
        out = await sess.run(r1, {a: 1.0, b: 2.0, c: 3.0}, options=GRAPHS, run_metadata=md)
        assert out == 3.0
        (graph,) = md.partition_graphs
        args = [n["name"] for n in graph["node"] if n["op"] == "_Arg"]
        assert args == ["_arg_a_0", "_arg_b_0"]  # the unread feed has no _Arg


async def test_partial_run_fetch_needing_an_unfed_feed_is_an_error() -> None:
    g, a, b, c, r1, r2 = adder()
    async with af.Session(graph=g) as sess:
        h = await sess.partial_run_setup([r1, r2], feeds=[a, b, c])
        with pytest.raises(
            af.errors.InvalidArgumentError, match=r"Fetch mul:0 can't be computed .* needs c:0"
        ):
            await asyncio.wait_for(sess.partial_run(h, r2, {a: 1.0, b: 2.0}), 10)
        # The handle is still usable: nothing was sent.
        assert await sess.partial_run(h, r1, {a: 1.0, b: 2.0}) == 3.0
        assert await sess.partial_run(h, r2, {c: 2.0}) == 6.0


async def test_partial_run_target_needing_an_unfed_feed_is_an_error() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, (), name="a")
        v = af.Variable(0.0, name="v")
        assign = v.assign(a)
        init = af.global_variables_initializer()
    async with af.Session(graph=g) as sess:
        await sess.run(init)
        h = await sess.partial_run_setup([assign.op], feeds=[a])
        with pytest.raises(af.errors.InvalidArgumentError, match="needs a:0"):
            await asyncio.wait_for(sess.partial_run(h, assign.op), 10)


# -- where ----------------------------------------------------------------------------


async def test_where_of_a_scalar_builds_and_its_kernel_rejects_it() -> None:
    g = af.Graph()
    with g.as_default():
        c = af.placeholder(af.bool, ())
        w = af.where(c)
        assert (w.dtype, w.shape.as_list()) == (af.int64, [None, 0])
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="Unhandled input dimensions: 0"):
            await sess.run(w, {c: True})


# -- feeds and fetches on the client device ---------------------------------------------


def x_on_0_y_on_1() -> tuple[af.Graph, Any, Any]:
    g = af.Graph()
    with g.as_default():
        with af.device("/cpu:0"):
            x = af.placeholder(af.float32, (), name="x")
        with af.device("/cpu:1"):
            y = af.multiply(x, 2.0, name="y")
    return g, x, y


def check_client_partitions(md: af.RunMetadata) -> None:
    """Two partitions: the client's /cpu:0 with the _Arg and _Retval, /cpu:1 computing,
    joined by a _Send / _Recv pair each way."""
    client, other = md.partition_graphs
    assert client["device"].endswith("CPU:0")
    assert other["device"].endswith("CPU:1")
    assert sorted(n["op"] for n in client["node"]) == ["_Arg", "_Recv", "_Retval", "_Send"]
    assert sorted(n["op"] for n in other["node"]) == ["Const", "Mul", "_Recv", "_Send"]


async def test_callable_feed_and_fetch_are_on_the_client_device() -> None:
    g, x, y = x_on_0_y_on_1()
    async with af.Session(graph=g, config=TWO_CPUS) as sess:
        fn = sess.make_callable(y, feed_list=[x], accept_options=True)
        md = af.RunMetadata()
        assert await fn(3.0, options=GRAPHS, run_metadata=md) == 6.0
        check_client_partitions(md)
        md = af.RunMetadata()
        assert await sess.run(y, {x: 4.0}, options=GRAPHS, run_metadata=md) == 8.0
        check_client_partitions(md)


async def test_partial_run_feed_is_received_on_the_client_device() -> None:
    g, x, y = x_on_0_y_on_1()
    async with af.Session(graph=g, config=TWO_CPUS) as sess:
        h = await sess.partial_run_setup([y], feeds=[x])
        assert await sess.partial_run(h, y, {x: 5.0}) == 10.0
    # The same signature compiled as partial_run_setup does.
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2)]
    compiled = compile_signature(
        graph_ir(g),
        feeds=[ref_of(x)],
        fetches=[ref_of(y)],
        targets=[],
        devices=devices,
        incarnation=1,
        client=devices[0],
    )
    feed_recv = next(n for p in compiled.partitions for n in p.nodes if n.name == "_recv_feed_x_0")
    assert feed_recv.device == devices[0]
    assert [p.device for p in compiled.partitions] == devices


# -- CSE of fetched duplicates ----------------------------------------------------------


async def run_with_graphs(g: af.Graph, fetches: Any, feeds: Any = None) -> tuple[Any, list[str]]:
    async with af.Session(graph=g) as sess:
        md = af.RunMetadata()
        out = await sess.run(fetches, feeds, options=GRAPHS, run_metadata=md)
    (ops,) = ops_of(md)
    return out, ops


async def test_cse_merges_fetched_duplicates_and_serves_both_fetches() -> None:
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, (), name="a")
        b = af.placeholder(af.float32, (), name="b")
        d1, d2 = a - b, af.subtract(a, b)
    out, ops = await run_with_graphs(g, [d1, d2, {"again": d2}], {a: 5.0, b: 2.0})
    assert out == [3.0, 3.0, {"again": 3.0}]
    assert ops.count("Sub") == 1
    assert ops.count("_Retval") == 2  # each fetch still has its place


async def test_cse_merges_two_identical_fetched_casts() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.int32, (2,), name="x")
        c1, c2 = af.cast(x, af.float32), af.cast(x, af.float32)
    out, ops = await run_with_graphs(g, (c1, c2), {x: [1, 2]})
    assert ops.count("Cast") == 1
    for v in out:
        np.testing.assert_array_equal(v, np.array([1.0, 2.0], np.float32))


async def test_cse_merges_fetched_constants_and_returns_each_in_its_place() -> None:
    g = af.Graph()
    with g.as_default():
        values = [1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0]
        consts = [af.constant(v) for v in values]
    out, ops = await run_with_graphs(g, consts)
    assert out == values
    assert ops.count("Const") == 4
    g2 = af.Graph()  # at L0 nothing is merged
    with g2.as_default():
        consts = [af.constant(v) for v in values]
    l0 = af.SessionConfig(
        graph_options=af.GraphOptions(
            optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
        )
    )
    async with af.Session(graph=g2, config=l0) as sess:
        md = af.RunMetadata()
        assert await sess.run(consts, options=GRAPHS, run_metadata=md) == values
    assert ops_of(md)[0].count("Const") == 8


# -- functions run only when called ---------------------------------------------------

LEVELS = {
    "L0": af.OptimizerOptions(opt_level=af.OptimizerOptions.L0),
    "call_kernel": af.OptimizerOptions(do_function_inlining=False),
    "L1": af.OptimizerOptions(),
}


def failing_function_graph() -> tuple[af.Graph, dict[str, Any], Any, Any]:
    """A function whose body asserts on a constant (no data input from the call),
    called in both branches of conds and in loops that never iterate."""
    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32)
        def checked(x: af.Tensor) -> af.Tensor:
            with af.control_dependencies([af.Assert(af.constant(False), ["body ran"])]):
                return af.identity(x)

        @af.Defun()
        def no_args() -> af.Tensor:
            with af.control_dependencies([af.Assert(af.constant(False), ["body ran"])]):
                return af.constant(1.0)

        p = af.placeholder(af.bool, (), name="p")
        v = af.placeholder(af.float32, (), name="v")
        outs = {
            "cond": af.cond(p, lambda: af.reshape(checked(v), []), lambda: v + 1.0),
            "cond_no_args": af.cond(p, no_args, lambda: v + 1.0),
            "loop": af.while_loop(lambda i: i < 0.0, lambda i: af.reshape(checked(i), []), v),
            "loop_invariant": af.while_loop(
                lambda i: i < 0.0, lambda i: i + af.reshape(checked(v), []), v
            ),
            "cond_in_loop": af.while_loop(
                lambda i: i < 3.0,
                lambda i: af.cond(i > 10.0, lambda: af.reshape(checked(i), []), lambda: i + 1.0),
                v,
            ),
        }
    return g, outs, p, v


@pytest.mark.parametrize("level", list(LEVELS))
async def test_function_body_runs_only_when_called(level: str) -> None:
    g, outs, p, v = failing_function_graph()
    config = af.SessionConfig(graph_options=af.GraphOptions(optimizer_options=LEVELS[level]))
    async with af.Session(graph=g, config=config) as sess:
        got = await sess.run(outs, {p: False, v: 1.0})
        assert got == {
            "cond": 2.0,
            "cond_no_args": 2.0,
            "loop": 1.0,
            "loop_invariant": 1.0,
            "cond_in_loop": 3.0,
        }
        for name in ("cond", "cond_no_args"):  # called: the assertion fails
            with pytest.raises(af.errors.InvalidArgumentError, match="body ran"):
                await sess.run(outs[name], {p: True, v: 1.0})
        with pytest.raises(af.errors.InvalidArgumentError, match="body ran"):
            await sess.run(outs["loop"], {v: -1.0})


def test_inlined_input_less_nodes_wait_for_every_input() -> None:
    # On the IR: a body constant waits for both inputs' producers (one NoOp after
    # them), and for an input taken from a Switch through an Identity of it.
    from asyncflow.compiler.inline import inline_functions
    from asyncflow.compiler.prune import prune

    g = af.Graph()
    with g.as_default():

        @af.Defun(af.float32, af.float32, func_name="scaled")
        def scaled(x: af.Tensor, y: af.Tensor) -> af.Tensor:
            return x * 2.0 + y

        a = af.add(af.constant(1.0), 0.5, name="a")
        b = af.multiply(af.constant(3.0), 0.5, name="b")
        p = af.placeholder(af.bool, (), name="p")
        both = scaled(a, b, name="both")
        branch = af.cond(p, lambda: af.reshape(scaled(a, b, name="inner"), []), lambda: a)
    ir = graph_ir(g)
    nodes = prune(ir, [ref_of(both), ref_of(branch)], [], [ref_of(p)])
    out, _, calls = inline_functions(nodes, [0] * len(nodes), ["/cpu:0"], feeds=[ref_of(p)])
    assert calls == 2
    by_name = {n.name: n for n in out}
    const = next(n for n in out if n.name.startswith("both/") and n.op == "Const")
    assert const.control_inputs == ("both/input_control_node",)
    assert by_name["both/input_control_node"].control_inputs == ("a", "b")
    inner = next(n for n in out if n.name.startswith("cond/inner/") and n.op == "Const")
    (control,) = inner.control_inputs
    waits = by_name[control].control_inputs
    assert all(by_name[w].op == "Identity" for w in waits)
    assert {by_name[by_name[w].inputs[0][0]].op for w in waits} == {"Switch"}


# -- a dead fetch names the user's tensor -------------------------------------------------


@pytest.mark.parametrize("device", ["/cpu:0", "/cpu:1"])
def test_dead_fetch_names_the_users_tensor_across_devices(device: str) -> None:
    # Produced on /cpu:1, the fetch reaches the client device through a _Recv: the
    # error must still name the tensor the user fetched, not the Recv.
    from asyncflow.ops.control_flow_ops import switch

    g = af.Graph()
    with g.as_default():
        p = af.placeholder(af.bool, (), name="p")
        with af.device(device):
            _, taken = switch(af.constant(1.0) + 1.0, p, name="branchy")
            y = af.identity(taken, name="taken")
    with af.Session(graph=g, config=af.SessionConfig(device_count={"CPU": 2})) as sess:
        with pytest.raises(
            af.errors.InvalidArgumentError, match=r"the fetched tensor 'taken:0' is dead"
        ) as info:
            sess.run_sync(y, {p: False})
        assert "_recv" not in str(info.value)
        assert sess.run_sync(y, {p: True}) == 2.0  # the session stays usable
