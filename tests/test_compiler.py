"""The compile passes are pure functions: tested here without any event loop."""

from __future__ import annotations

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.placement import place
from asyncflow.compiler.plan import build_plan
from asyncflow.compiler.prune import prune
from asyncflow.framework import registry

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def names(ops: list[af.Operation]) -> list[str]:
    return [op.name for op in ops]


def test_prune_keeps_only_ancestors(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    af.add(a, 2.0, name="unrelated")
    c = af.multiply(b, 3.0, name="c")
    ops = prune([c], [], set())
    assert "unrelated" not in names(ops)
    assert names(ops)[-1] == "c"
    assert {"a", "b", "c"} <= set(names(ops))


def test_prune_feed_cuts_ancestors(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    c = af.multiply(b, 3.0, name="c")
    ops = prune([c], [], {b})
    assert "a" not in names(ops)
    assert "b" not in names(ops)
    # A fed-and-fetched tensor needs nothing at all.
    assert prune([b], [], {b}) == []


def test_prune_feed_not_needed_is_dropped(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    other = af.placeholder(af.float32, name="other")
    c = af.add(a, 1.0, name="c")
    assert "other" not in names(prune([c], [], {other}))


def test_prune_follows_control_edges_and_targets(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    side = af.identity(a, name="side")
    with af.control_dependencies([side]):
        c = af.identity(a, name="c")
    target = af.no_op(name="target")
    ops = prune([c], [target], set())
    assert {"a", "side", "c", "target"} == set(names(ops))


def test_prune_is_topological_and_iterative(graph: af.Graph) -> None:
    x = af.constant(0.0)
    for _ in range(5000):  # deeper than the recursion limit
        x = af.add(x, 1.0)
    ops = prune([x], [], set())
    position = {op: i for i, op in enumerate(ops)}
    for op in ops:
        for t in op.inputs:
            assert position[t.op] < position[op]


def test_placement_normalizes_device_names(graph: af.Graph) -> None:
    ops = []
    for spec in ["", "/cpu:1", "/device:CPU:1", CPU1, "/job:localhost", "/cpu:0"]:
        with af.device(spec):
            ops.append(af.no_op())
    assert place(ops, [CPU0, CPU1]) == [0, 1, 1, 1, 0, 0]


def test_placement_unknown_device_names_it_and_lists_devices(graph: af.Graph) -> None:
    with af.device("/cpu:7"):
        op = af.no_op(name="far")
    with pytest.raises(af.errors.InvalidArgumentError) as info:
        place([op], [CPU0])
    assert "/cpu:7" in str(info.value)
    assert CPU0 in str(info.value)
    assert info.value.node_name == "far"
    assert place([op], [CPU0], allow_soft_placement=True) == [0]


def test_placement_malformed_device(graph: af.Graph) -> None:
    with af.device("/banana"):
        op = af.no_op(name="odd")
    with pytest.raises(af.errors.InvalidArgumentError, match="odd"):
        place([op], [CPU0])


def test_plan_tables(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    one = af.constant(np.float32(1.0), name="one")
    a = af.add(x, one, name="a")
    b = af.multiply(a, a, name="b")
    c = af.add(a, b, name="c")
    feeds = [x]
    ops = prune([c], [], set(feeds))
    plan = build_plan(ops, [0] * len(ops), [CPU0], feeds, [c], [])
    op_names = [op.name for op in plan.ops]
    # The constant is preloaded, not scheduled; the placeholder is fed, not run.
    assert op_names == ["a", "b", "c"]
    ia, ib, ic = 0, 1, 2
    assert plan.initial_ready == (ia,)
    assert plan.initial_pending == (0, 1, 2)
    assert set(plan.nodes[ia].consumers) == {ib, ic}
    assert plan.nodes[ib].consumers == (ic,)
    # a's value is read by b and c: reference counted; b's by c only: freed by c.
    slot_a = plan.nodes[ia].out
    slot_b = plan.nodes[ib].out
    assert slot_a in plan.nodes[ib].counted
    assert slot_a in plan.nodes[ic].counted
    assert plan.initial_refs is not None
    assert plan.initial_refs[slot_a] == 2
    assert slot_b in plan.nodes[ic].frees
    # c is fetched: never freed.
    assert all(plan.nodes[ic].out not in n.frees for n in plan.nodes)
    assert plan.retval_slots == (plan.nodes[ic].out,)
    assert plan.all_inline
    assert plan.initial_values[plan.nodes[ia].inputs[1]] == np.float32(1.0)
    assert plan.arg_slots == (plan.nodes[ia].inputs[0],)


def test_plan_records_kernel_kinds(graph: af.Graph) -> None:
    async def slow(v: np.ndarray) -> np.ndarray:
        return v

    x = af.constant(1.0)
    y = af.py_func(slow, [x], af.float32)
    z = af.py_func(lambda v: v, [y], af.float32, expensive=True)
    ops = prune([z], [], set())
    plan = build_plan(ops, [0] * len(ops), [CPU0], [], [z], [])
    kinds = [n.kind for n in plan.nodes]
    assert kinds == [registry.ASYNC, registry.EXPENSIVE]
    assert not plan.all_inline


def test_plan_missing_kernel_is_not_found(graph: af.Graph) -> None:
    registry.define_op("_NoKernelHere", lambda inputs, attrs: [])
    op = graph.create_op("_NoKernelHere", [], name="lonely")
    with pytest.raises(af.errors.NotFoundError, match="lonely"):
        build_plan([op], [0], [CPU0], [], [], [op])
